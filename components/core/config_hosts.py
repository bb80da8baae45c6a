"""The machines of a stack: `gpu-serving:host` (one host, or the fleet's common hardware),
`gpu-serving:hosts` (the fleet's entries, each checked on its own and against the others), and a
node's place in a multi-node serving instance."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Self

from pydantic import Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .config_fields import (
    SAFE_TEXT,
    USER,
    Address,
    HostKeyLine,
    KeyFilePath,
    Name,
    Settings,
    setting_path,
    text_setting,
    validation_errors,
)
from .errors import SettingError
from .rules import NAMESPACE

# A list of host objects: the fleet one stack deploys to (one engine run for all of them).
HOSTS_KEY = "hosts"
MAX_HOSTS = 64

UserName = Annotated[str, text_setting(32, "user name (lower-case letters, digits, _ -)", USER)]
GpuModelName = Annotated[str, text_setting(128, "GPU model name (letters, digits, spaces, . _ ( ) / + -)", SAFE_TEXT)]


class HostSettings(Settings):
    # No address means the local rehearsal host named by `rehearsal` (python -m rehearsal up).
    address: Optional[Address] = None
    rehearsal: Name = "default"
    port: int = Field(22, ge=1, le=65535)
    user: UserName = "root"
    gpu_count: int = Field(8, ge=1, le=64)
    gpu_memory_gb: float = Field(96, gt=0, le=1024)
    gpu_model: GpuModelName = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    interconnect: Literal["pcie", "nvlink"] = "pcie"
    # The pinned SSH host key ("ssh-ed25519 AAAA..."), checked to be a real key of that type;
    # required for a real host.
    host_key: Optional[HostKeyLine] = None
    # Path on the operator's machine to the private key, when it is not given as the
    # secret `gpu-serving:sshPrivateKey`.
    private_key_path: Optional[KeyFilePath] = None
    connect_timeout_seconds: float = Field(15, gt=0, le=300)
    command_timeout_seconds: float = Field(600, gt=0, le=7200)

    @model_validator(mode="after")
    def _rehearsal_takes_no_connection_settings(self) -> Self:
        # The rehearsal host's port, user and keys come from `python -m rehearsal up` (its
        # host.json); a value set here would be silently ignored, so it is refused (issue 12.8).
        if self.address is None:
            ignored = [to_camel(f) for f in ("port", "user", "host_key", "private_key_path") if f in self.model_fields_set]
            if ignored:
                raise ValueError(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} only for a real host (with address); "
                                 f"the rehearsal host {self.rehearsal!r} is reached with the port, user and keys it was booted with: "
                                 f"remove {' and '.join(ignored)}, or set address")
        return self

    @property
    def is_rehearsal(self) -> bool:
        return self.address is None

    @property
    def machine(self) -> str:
        """The machine this reaches, one spelling per machine: host names in lower case without a
        trailing dot, IP addresses in their compressed form (an IPv4-mapped IPv6 address as the
        IPv4 one), so two spellings of one machine compare equal (issue 13.5)."""
        if self.address is None:
            return f"rehearsal:{self.rehearsal}"
        address, _, zone = self.address.partition("%")
        try:
            ip = ipaddress.ip_address(address)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            address = ip.compressed + (f"%{zone}" if zone else "")
        except ValueError:
            address = self.address.lower().rstrip(".")
        return f"{address}:{self.port}"

    @property
    def target(self) -> str:
        """Where the host is reached: two fleet entries must never reach the same one."""
        return f"{self.address}:{self.port}" if self.address else f"rehearsal:{self.rehearsal}"


class HostEntry(HostSettings):
    """One machine of `gpu-serving:hosts`: a name plus any `host` setting, the rest inherited
    from `gpu-serving:host` (which then describes the fleet's common hardware)."""

    # Names the host's resources and its entry in the outputs.
    name: Name


@dataclass(frozen=True)
class NodePlace:
    """One node's place in a multi-node serving instance: what its unit's --nnodes, --node-rank
    and --dist-init-addr say."""

    rank: int
    nnodes: int
    # The hosts entry names, rank 0 first.
    names: tuple[str, ...]
    # Rank 0's address as the other nodes reach it, and the rendezvous port.
    rank0_address: str
    port: int

    @property
    def dist_init_addr(self) -> str:
        # An IPv6 address is bracketed, so the port stays separable.
        host = f"[{self.rank0_address}]" if ":" in self.rank0_address else self.rank0_address
        return f"{host}:{self.port}"

    @property
    def name(self) -> str:
        return self.names[self.rank]


def parse_hosts(raw: Any, common: dict[str, Any], errors: list[SettingError]) -> tuple[HostEntry, ...]:
    """gpu-serving:hosts: each entry is `host` with the entry's own keys on top."""
    if raw is None:
        return ()
    where = f"{NAMESPACE}:{HOSTS_KEY}"
    if not isinstance(raw, list) or not raw:
        errors.append(SettingError(where, "must be a non-empty list of host objects",
                                   "e.g. [{name: gpu1, address: 10.0.0.11, hostKey: ...}, {name: gpu2, ...}]"))
        return ()
    if len(raw) > MAX_HOSTS:
        errors.append(SettingError(where, f"lists {len(raw)} hosts; at most {MAX_HOSTS} in one stack"))
        return ()
    entries: list[HostEntry] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            errors.append(SettingError(f"{where}[{i}]", f"must be an object of host settings, got {type(item).__name__}"))
            continue
        names_machine = "address" in item or "rehearsal" in item
        if not names_machine:
            # Inheriting gpu-serving:host's machine would put two entries' servers, or this
            # entry and the one-host stacks, on one machine without a word (issue 12.8).
            errors.append(SettingError(f"{where}[{i}]", "names no machine: set its address (a real host) or rehearsal "
                                       "(a rehearsal host's name); an entry does not inherit gpu-serving:host's",
                                       "e.g. {name: gpu1, address: 10.0.0.11, hostKey: ...}"))

        def name_setting(loc: tuple[int | str, ...], i: int = i, item: dict[str, Any] = item) -> str:
            # A bad value inherited from gpu-serving:host is named there, where it is written.
            if loc and loc[0] not in item and loc[0] in common:
                return setting_path("host", loc)
            return setting_path(f"{HOSTS_KEY}[{i}]", loc)
        try:
            entry = HostEntry.model_validate({**common, **item})
            if names_machine:
                entries.append(entry)
        except ValidationError as exc:
            errors += validation_errors(HOSTS_KEY, exc, HostEntry, name_setting)
    seen_names: dict[str, int] = {}
    seen_targets: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.name in seen_names:
            errors.append(SettingError(f"{where}[{i}].name", f"{e.name!r} is already the name of hosts[{seen_names[e.name]}]",
                                       "each host needs its own name: it names its resources and outputs"))
        seen_names.setdefault(e.name, i)
        if e.machine in seen_targets:
            first = entries[seen_targets[e.machine]]
            spelled = "" if first.target == e.target else f", written {first.target} there"
            errors.append(SettingError(f"{where}[{i}]", f"reaches the same host as hosts[{seen_targets[e.machine]}] ({e.target}{spelled})",
                                       "two entries for one machine would start two servers on its GPUs"))
        seen_targets.setdefault(e.machine, i)
    return tuple(entries)
