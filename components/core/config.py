"""The settings of a gpu-serving stack, validated with pydantic before anything touches a host.

Pulumi config keys (namespace ``gpu-serving``) map one-to-one to the models here:
``host``, ``model``, ``strategy``, ``serving``, ``cuda``, ``venv``, ``readiness``. Field names
are camelCase in YAML, as users write them. Per-field rules (types, ranges, safe characters)
live here; rules that tie several settings together (world size, expert split, memory) live in
`strategy` and `memory`.

Every text setting is a `_text` type: a maximum length checked first (a 10 MB value gets a
short refusal), then a pattern matched against the whole string (`re.fullmatch` with patterns
anchored ``\\A...\\Z``: ``$`` alone would accept a trailing newline) with ASCII-only classes
(``\\d`` would take ``١٣``). Messages quote values only through `errors.shown`.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from . import autoswitch, flags, model_source, pd_settings
from .autoswitch import AutoswitchSettings
from .errors import ConfigError, SettingError, secret_kind, shown
from .fitness_baseline import check_policy as check_fitness_policy
from .profiles import PROFILES
from .rules import ENV_KEY, NAMESPACE, ROUTER_KEY, breaks_secret_line, credential_name
from .specs import ReadinessDeadlines
from .rules import rx as _rx


# Characters allowed in anything that ends up on a command line or in a unit file. Paths,
# names and flag values never need shell or systemd metacharacters; refusing them here is what
# lets the renderers and the remote layer stay simple and safe.
SAFE_VALUE = _rx(r"[A-Za-z0-9_./:,+@=-]+")
SAFE_PATH = _rx(r"/[A-Za-z0-9_./+-]*")
SAFE_NAME = _rx(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SAFE_SERVED_NAME = _rx(r"[A-Za-z0-9][A-Za-z0-9_./:-]{0,127}")
FLAG = _rx(r"--[a-z0-9]+(?:-[a-z0-9]+)*(?:=[A-Za-z0-9_./:,+@=-]+)?")
# A negative number is a value (--chunked-prefill-size -1), not a flag.
NUMBER = _rx(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
HOSTNAME = _rx(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# What an IPv6 zone may be: an interface name (Linux allows up to 15 bytes) or an index.
IPV6_ZONE = _rx(r"[A-Za-z0-9_.-]{1,15}")
HOST_KEY = _rx(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|rsa-sha2-(?:256|512)) ([A-Za-z0-9+/]+={0,2})")
PIP_SPEC = _rx(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+")
CUDA_VERSION = _rx(r"[0-9]{1,2}\.[0-9]{1,2}")
PYTHON_VERSION = _rx(r"3\.[0-9]{1,2}")
USER = _rx(r"[a-z_][a-z0-9_-]{0,31}")
STRATEGY_NAME = _rx(r"[a-z0-9][a-z0-9_-]{0,31}")
UNIT_PREFIX = _rx(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
KEY_FILE = _rx(r"[~/][A-Za-z0-9_./+-]*")
APT_PACKAGE = _rx(r"[a-z0-9][a-z0-9.+-]+(=[A-Za-z0-9.+~:-]+)?")
SHA256 = _rx(r"[0-9a-f]{64}")
# Free text shown in messages only (gpuModel): printable, no shell or systemd metacharacters.
SAFE_TEXT = _rx(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,127}")

# Longest value of each kind (checked before any pattern); lists and maps are bounded too.
MAX_NAME = 64
MAX_SERVED_NAME = 128
MAX_PATH = 1024
MAX_ADDRESS = 253
MAX_HOST_KEY = 8192
MAX_ARG = 1024
MAX_ARGS = 256
MAX_ENV_KEY = 128
MAX_ENV_VALUE = 4096
MAX_ENV = 256
MAX_PACKAGE = 256
MAX_PACKAGES = 128
MAX_CONFLICTS = 64
MAX_APT_LINE = 1024

# moe_a2a_backend values for which SGLang overwrites ep_size with tp_size
# (server_args.py, _handle_a2a_moe); "none" keeps the declared ep_size.
A2A_BACKENDS = ("deepep", "deepep_v2", "mooncake", "nixl", "mori", "pplx", "flashinfer", "megamoe", "ascend_fuseep")


def _bounded(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        kind = secret_kind(value[:100_000], generic=False)
        if kind:
            # Pasted key material: say so without echoing a byte of it.
            raise ValueError(f"holds a {len(value):,}-character {kind} (not shown), not a {what}: {_howto(kind)}")
        raise ValueError(f"is {len(value):,} characters long; a {what} has at most {limit:,}")
    return value


def _text(limit: int, what: str, pattern: re.Pattern | None = None, *checks):
    """A str setting: at most `limit` characters, matching `pattern` whole, then `checks`.
    Every text setting is one of these, so none is unbounded."""

    def check(value: str) -> str:
        _bounded(value, limit, what)
        kind = secret_kind(value, generic=False)
        if kind:
            # A plain setting sits in clear text in the state, the preview and often the unit.
            raise ValueError(f"holds {shown(value)}: {_howto(kind)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise ValueError(f"{shown(value)} is not a valid {what}")
        for more in checks:
            value = more(value)
        return value
    return Annotated[str, AfterValidator(check)]



def canonical_path(value: str) -> str:
    """The path `value` means, written without '.', '..', empty segments or a trailing '/'."""
    parts: list[str] = []
    for seg in value.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
        else:
            parts.append(seg)
    return "/" + "/".join(parts)


def _canonical(value: str) -> str:
    # /usr/. or /usr//bin would slip past a list of system directories and mean another path.
    if value != "/" and (value.endswith("/") or any(seg in ("", ".", "..") for seg in value.split("/")[1:])):
        raise ValueError(f"{shown(value)} is not written in canonical form (no '.', '..' or empty segments, "
                         f"no trailing '/'): write {shown(canonical_path(value))}")
    return value


Name = _text(MAX_NAME, "name (letters, digits, . _ -)", SAFE_NAME)
AbsPath = _text(MAX_PATH, "absolute path without spaces, quotes or shell characters", SAFE_PATH, _canonical)


def _key_file(value: str) -> str:
    if secret_kind(value):
        # Pasted key material: say so without echoing a byte of it.
        raise ValueError(f"holds {shown(value)}, not a path: {SSH_KEY_HOWTO}")
    if not KEY_FILE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid key file path (absolute or ~/..., no spaces or shell characters)")
    return _canonical(value) if value.startswith("/") else value


def _ssh_strings(blob: bytes) -> list[bytes]:
    """An SSH wire-format key (RFC 4253 6.6): length-prefixed strings filling the blob exactly."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ValueError("cut short")
        n = int.from_bytes(blob[i:i + 4], "big")
        if n > len(blob) - i - 4:
            raise ValueError("cut short")
        out.append(blob[i + 4:i + 4 + n])
        i += 4 + n
    return out


# Key type -> (type name inside the blob, number of strings, curve name).
_KEY_SHAPES = {
    "ssh-ed25519": ("ssh-ed25519", 2, None),
    "ssh-rsa": ("ssh-rsa", 3, None),
    "rsa-sha2-256": ("ssh-rsa", 3, None),
    "rsa-sha2-512": ("ssh-rsa", 3, None),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256", 3, b"nistp256"),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384", 3, b"nistp384"),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521", 3, b"nistp521"),
}
HOST_KEY_HELP = "an SSH public host key line like \"ssh-ed25519 AAAAC3Nza...\" (ssh-keyscan -t ed25519 HOST)"


def _host_key(value: str) -> str:
    """The key line must be a real key: base64 of an SSH key blob whose own type name is the
    declared type. Checked here, so plan, preview and up refuse it before any SSH."""
    m = HOST_KEY.fullmatch(value)
    if not m:
        raise ValueError(f"{shown(value)} is not {HOST_KEY_HELP}")
    declared, data = m.groups()
    try:
        strings = _ssh_strings(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise ValueError(f"the {declared} key's base64 does not decode to an SSH key (corrupt or cut short); "
                         f"copy the whole line again from ssh-keyscan") from None
    inner, count, curve = _KEY_SHAPES[declared]
    if not strings or strings[0] != inner.encode():
        found = shown(strings[0].decode("ascii", "replace")) if strings else "nothing"
        raise ValueError(f"declares {declared} but the key inside is {found}; copy the whole line again from ssh-keyscan")
    if (len(strings) != count or (declared == "ssh-ed25519" and len(strings[1]) != 32)
            or (curve is not None and strings[1] != curve)):
        raise ValueError(f"the {declared} key is malformed (wrong parts or sizes); copy the whole line again from ssh-keyscan")
    return value


def _address(value: str) -> str:
    host, zone = value.partition("%")[0], value.partition("%")[2]
    if "%" in value:
        # A zone names the interface of a link-local IPv6 address; it reaches ssh's command
        # line, so only an interface name's characters.
        if not IPV6_ZONE.fullmatch(zone):
            raise ValueError(f"the zone of {shown(value)} is not an interface name: after '%' only letters, digits, "
                             "_ . - (at most 15), e.g. fe80::1%eth0")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{shown(value)}: only an IPv6 address takes a %zone") from None
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not HOSTNAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is neither an IP address nor a host name")
    return value


def _bind(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{shown(value)} is not an IP address to bind (use 0.0.0.0 or 127.0.0.1)") from None
    if "%" in value:
        raise ValueError(f"{shown(value)}: a scoped address (%zone) cannot be bound by the server; use 0.0.0.0 or ::")
    return value


# Directories of the operating system itself: a venv there would be created with --clear.
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
               "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin",
               "/usr/sbin", "/var", "/var/lib"}
# Environment keys that hold credentials (rules.credential_name) come only as Pulumi secrets
# (gpu-serving:hfToken), never as plain config that would sit in the state and the preview in clear text.
# Flags whose value is a credential (--api-key, --admin-api-key, --hf-token, ...).
SECRET_FLAG_PARTS = ("token", "secret", "password", "passwd", "credentials")
SECRET_FLAG_SUFFIXES = ("api-key", "access-key", "private-key", "secret-key")
# What a refused credential should become instead.
SECRET_HOWTO = ("a credential goes only as a Pulumi secret, into the 0600 environment file, never the "
                "world-readable unit or the plain settings: pulumi config set --secret gpu-serving:hfToken "
                "(the Hugging Face token, the one serving credential gpu-serving takes)")
SSH_KEY_HOWTO = ("an SSH private key goes only as a Pulumi secret: "
                 "pulumi config set --secret gpu-serving:sshPrivateKey < KEYFILE, or give the key file's path")


def _howto(kind: str) -> str:
    return SSH_KEY_HOWTO if "private key" in kind or "PEM" in kind else SECRET_HOWTO
# apt source options that weaken signature checking.
APT_SAFE_OPTIONS = {"signed-by", "arch"}
# Inside the EnvironmentFile's double quotes these would end the value, escape or expand.
ENV_VALUE_FORBIDDEN = "\"\\$`'"


def _secret_flag(flag: str) -> bool:
    parts = flag.lstrip("-").split("-")
    return any(p in SECRET_FLAG_PARTS for p in parts) or flag.endswith(SECRET_FLAG_SUFFIXES)


def _env_key(key: str) -> str:
    _bounded(key, MAX_ENV_KEY, "variable name")
    if not ENV_KEY.fullmatch(key):
        raise ValueError(f"{shown(key)} is not a valid variable name (letters, digits, _; not starting with a digit)")
    if credential_name(key):
        raise ValueError(f"{key} looks like a credential: plain settings end up in clear text in the state and the "
                         f"preview; {SECRET_HOWTO}")
    return key


def _env_value(value: str) -> str:
    _bounded(value, MAX_ENV_VALUE, "variable's value")
    kind = secret_kind(value, generic=False)
    if kind:
        raise ValueError(f"holds {shown(value)}: {_howto(kind)}")
    if not value.isprintable():
        raise ValueError(f"{shown(value)} contains a control character (a newline would add a line to the environment file)")
    if any(c in value for c in ENV_VALUE_FORBIDDEN):
        raise ValueError(f"{shown(value)} contains a quote, backslash, $ or backtick")
    if not value.isascii():
        raise ValueError(f"{shown(value)} contains non-ASCII characters (a lookalike digit or letter reaches the "
                         "server as something else); environment values are ASCII")
    return value


def _env_input(value):
    # YAML turns NCCL_IB_DISABLE: 1 into an int; the environment is text.
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    return value


EnvKey = Annotated[str, AfterValidator(_env_key)]
EnvValue = Annotated[str, BeforeValidator(_env_input), AfterValidator(_env_value)]


def _extra_arg(arg: str) -> str:
    _bounded(arg, MAX_ARG, "command-line argument")
    kind = secret_kind(arg, generic=False)
    if kind:
        raise ValueError(f"holds {shown(arg)}: {_howto(kind)}")
    if arg.startswith("-") and not NUMBER.fullmatch(arg):
        if not FLAG.fullmatch(arg):
            raise ValueError(f"{shown(arg)} is not a --long-flag (lower-case, digits, dashes; a negative number is a value)")
        if _secret_flag(arg.split("=", 1)[0]):
            raise ValueError(f"{arg.split('=', 1)[0]} takes a credential: {SECRET_HOWTO}")
    elif not SAFE_VALUE.fullmatch(arg):
        raise ValueError(f"{shown(arg)} contains characters that are not allowed (spaces, quotes, control, shell or "
                         "systemd metacharacters; letters, digits and _ . / : , + @ = - are)")
    return arg


ExtraArg = Annotated[str, AfterValidator(_extra_arg)]


def _pip_spec(spec: str) -> str:
    if not PIP_SPEC.fullmatch(spec):
        raise ValueError(f"{shown(spec)} must be pinned as name==version (an unpinned one would make `up` non-repeatable)")
    return spec


PipSpec = _text(MAX_PACKAGE, "requirement", None, _pip_spec)


def _is_numeric(annotation) -> bool:
    import typing
    if annotation in (int, float):
        return True
    return any(a in (int, float) for a in typing.get_args(annotation))


def check_secret_value(key: str, value: Any) -> list[SettingError]:
    """A secret's shape, checked without ever putting its value into the message."""
    where = f"{NAMESPACE}:{key}"
    if value is None:
        return []
    if not isinstance(value, str):
        return [SettingError(where, f"must be a string (got {type(value).__name__})")]
    if key == "hfToken":
        if breaks_secret_line(value):
            return [SettingError(where, "contains whitespace, a quote, a backslash, $ or a backtick (a token never does)",
                                 "paste the token alone: pulumi config set --secret gpu-serving:hfToken")]
    if key == "routerAdminKey" and not ROUTER_KEY.fullmatch(value):
        return [SettingError(where, f"a {len(value):,}-character key; the router's admin key must be 16 to 256 of "
                                    "A-Z a-z 0-9 . _ ~ + / = - (smg reads it inside 'id:name:role:key')",
                             "e.g. pulumi config set --secret gpu-serving:routerAdminKey \"$(openssl rand -hex 32)\"")]
    return []


class Settings(BaseModel):
    """Base: camelCase keys as users write them, unknown keys refused (a typo is an error)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
        strict=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info):
        # pydantic's lax mode reads true as 1: `tpSize: true` would deploy TP1 without a word.
        if isinstance(value, bool) and _is_numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


class HostSettings(Settings):
    # No address means the local rehearsal host named by `rehearsal` (python -m rehearsal up).
    address: Optional[_text(MAX_ADDRESS, "address", None, _address)] = None
    rehearsal: Name = "default"
    port: int = Field(22, ge=1, le=65535)
    user: _text(32, "user name (lower-case letters, digits, _ -)", USER) = "root"
    gpu_count: int = Field(8, ge=1, le=64)
    gpu_memory_gb: float = Field(96, gt=0, le=1024)
    gpu_model: _text(128, "GPU model name (letters, digits, spaces, . _ ( ) / + -)",
                     SAFE_TEXT) = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    interconnect: Literal["pcie", "nvlink"] = "pcie"
    # The pinned SSH host key ("ssh-ed25519 AAAA..."), checked to be a real key of that type;
    # required for a real host.
    host_key: Optional[_text(MAX_HOST_KEY, "SSH public host key", None, _host_key)] = None
    # Path on the operator's machine to the private key, when it is not given as the
    # secret `gpu-serving:sshPrivateKey`.
    private_key_path: Optional[_text(MAX_PATH, "key file path", None, _key_file)] = None
    connect_timeout_seconds: float = Field(15, gt=0, le=300)
    command_timeout_seconds: float = Field(600, gt=0, le=7200)

    @model_validator(mode="after")
    def _rehearsal_takes_no_connection_settings(self):
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


def _profile(value: str) -> str:
    if value not in PROFILES:
        raise ValueError(f"unknown profile {shown(value)}; built-in profiles: {', '.join(sorted(PROFILES))}")
    return value


class ModelSettings(Settings):
    profile: Optional[_text(MAX_NAME, "profile name", None, _profile)] = None
    name: Name
    path: Optional[AbsPath] = None  # default /models/<name>
    served_name: Optional[_text(MAX_SERVED_NAME, "served model name (letters, digits, . _ - / :)", SAFE_SERVED_NAME)] = None
    num_layers: int = Field(ge=1, le=1000)
    num_experts: int = Field(ge=0, le=100000)  # 0 = dense model
    moe_intermediate_size: int = Field(ge=0)
    num_attention_heads: Optional[int] = Field(None, ge=1, le=100000)  # config.json's; None: not checked
    kv_lora_rank: int = Field(ge=0)  # 0 = not MLA
    qk_rope_head_dim: int = Field(ge=0)
    kv_dtype_bytes: float = Field(2, gt=0, le=4)
    weights_gb: float = Field(gt=0, le=1_000_000)
    attention_weights_gb: float = Field(0, ge=0, le=1_000_000)
    # For non-MLA models: KV bytes per token per layer before TP split (2 x heads x dim x bytes).
    kv_bytes_per_token_per_layer: Optional[int] = Field(None, gt=0)
    # Where the host's checkpoint comes from (verify, host:, local:, hub:): model_source.py.
    source: _text(model_source.MAX_SOURCE, "model source", None, model_source.checked) = "verify"
    hub_endpoint: Optional[_text(model_source.MAX_ENDPOINT, "Hub endpoint URL", None, model_source.endpoint)] = None


    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: Any):
        if isinstance(data, dict) and data.get("profile") is not None:
            profile = data["profile"]
            # An unknown profile is refused by the field's own check (which names
            # model.profile); the numbers of a known one stand in meanwhile, so the refusal is
            # not buried under "numLayers is required" and the like.
            known = profile if isinstance(profile, str) and profile in PROFILES else next(iter(PROFILES))
            data = {**PROFILES[known], **data}
        return data

    @model_validator(mode="after")
    def _defaults(self):
        if self.path is None:
            object.__setattr__(self, "path", f"/models/{self.name}")
        if self.served_name is None:
            object.__setattr__(self, "served_name", self.name)
        return self

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0


# The networks between nodes gpu-serving knows NCCL defaults for (data/node-networks.json).
NODE_NETWORKS = ("tcp", "infiniband", "roce")
# As many as a stack has hosts (MAX_HOSTS).
MAX_NODES = 64


class StrategySettings(Settings):
    # Defaults to the stack name (tp8, pp8, ep8, ...): it names the unit.
    name: Optional[_text(32, "strategy name (lower-case letters, digits, _ -)", STRATEGY_NAME)] = None
    tp_size: int = Field(1, ge=1, le=64)
    pp_size: int = Field(1, ge=1, le=64)
    ep_size: int = Field(1, ge=1, le=64)
    dp_size: int = Field(1, ge=1, le=64)
    enable_dp_attention: bool = False
    # to_camel would spell it moeA2ABackend; users write moeA2aBackend.
    moe_a2a_backend: Literal["none", *A2A_BACKENDS] = Field("none", alias="moeA2aBackend")
    # Multi-node (one serving instance over several machines, SGLang's --nnodes): the
    # gpu-serving:hosts entries that form it, rank 0 first (rank = list order); or `nnodes`, the
    # number of hosts entries, which then all form it in their order. Unset: one node.
    nodes: Optional[list[Name]] = Field(None, max_length=MAX_NODES)
    nnodes: Optional[int] = Field(None, ge=1, le=MAX_NODES)
    # The port rank 0 listens on for the others (--dist-init-addr <rank 0>:<port>); 20000 as in
    # SGLang's multi-node examples.
    dist_init_port: int = Field(20000, ge=1024, le=65535)
    # The network between the nodes: its NCCL defaults come from components/core/data/node-networks.json.
    node_network: Literal[NODE_NETWORKS] = "tcp"
    # The interface NCCL's and Gloo's bootstrap (and NCCL's socket transport) use, e.g. eth0
    # (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); unset: NCCL picks one.
    socket_interface: Optional[_text(15, "network interface name (letters, digits, _ . -)", IPV6_ZONE)] = None



# The serving settings. Those that are nothing but an SGLang flag (memFractionStatic,
# maxRunningRequests, cudaGraphMaxBs, ...) are declared by the flag table (flags.py), after port
# and host; the ones below them mean more than a flag.
ServingSettings = create_model(
    "ServingSettings",
    __base__=Settings,
    __module__=__name__,
    port=(int, Field(30001, ge=1024, le=65535)),
    host=(_text(64, "IP address to bind", None, _bind), "0.0.0.0"),
    **flags.declared("serving"),
    # Each item is checked on its own, so a refusal names it (serving.extraArgs[3]).
    extra_args=(list[ExtraArg], Field(default_factory=list, max_length=MAX_ARGS)),
    # Written once, to the shared EnvironmentFile of every strategy unit of this model.
    environment=(dict[EnvKey, EnvValue], Field(default_factory=dict, max_length=MAX_ENV)),
    unit_prefix=(_text(MAX_NAME, "unit name prefix (letters, digits, . _ -)", UNIT_PREFIX), "sglang"),
    environment_dir=(AbsPath, "/etc/gpu-serving"),
    # Strategy units this one must never run beside (systemd Conflicts=). Default: every
    # strategy that has a Pulumi.<strategy>.yaml in the project.
    conflicts_with=(Optional[list[Name]], Field(None, max_length=MAX_CONFLICTS)),
    restart_sec=(int, Field(30, ge=1, le=3600)), timeout_start_sec=(int, Field(3600, ge=60, le=86400)),
)


def _apt_repository(v: str) -> str:
    # The full line is parsed at preview (cuda.settings_problems); here what must never pass.
    if v == "rehearsal":
        return v
    if not v.isprintable() or any(c in v for c in "\"'`$;|&<>\\"):
        raise ValueError(f"{shown(v)} contains a control character, quote, $, backtick or shell metacharacter; "
                         "an apt source is one line 'deb [signed-by=/path] URI SUITE'")
    if not v.isascii():
        raise ValueError(f"{shown(v)} contains non-ASCII characters; an apt source is one line 'deb [signed-by=/path] URI SUITE'")
    options = re.search(r"\[([^\]]*)\]", v)
    for option in (options.group(1).split() if options else []):
        if option.split("=", 1)[0] not in APT_SAFE_OPTIONS:
            raise ValueError(f"apt option {shown(option)} is not allowed (it would weaken or bypass the signature check); "
                             f"only {', '.join(sorted(APT_SAFE_OPTIONS))}")
    return v


class CudaSettings(Settings):
    version: _text(5, "CUDA version like 13.0 (ASCII digits)", CUDA_VERSION) = "13.0"
    home: Optional[AbsPath] = None  # default /usr/local/cuda-<version>
    # apt: NVIDIA's apt repository (pinned keyring); verify: the host comes with CUDA, only check it.
    install: Literal["apt", "verify"] = "apt"
    apt_package: Optional[_text(128, "Debian package name", APT_PACKAGE)] = None  # default cuda-toolkit-<major>-<minor>
    # "deb [signed-by=...] URL /" line; default NVIDIA's
    apt_repository: Optional[_text(MAX_APT_LINE, "apt source line", None, _apt_repository)] = None
    keyring_sha256: Optional[_text(64, "sha256 hex digest", SHA256)] = None

    @model_validator(mode="after")
    def _defaults(self):
        if self.home is None:
            object.__setattr__(self, "home", f"/usr/local/cuda-{self.version}")
        if self.apt_package is None:
            object.__setattr__(self, "apt_package", "cuda-toolkit-" + self.version.replace(".", "-"))
        return self

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


def _not_system(v: str) -> str:
    if v in SYSTEM_DIRS:
        raise ValueError(f"{shown(v)} is a system directory; a venv needs its own, e.g. /root/venv_sglang211 or /opt/sglang/venv")
    return v


def _wheelhouse(v: str) -> str:
    if not v or not v.isprintable():
        raise ValueError("must be a local directory of wheels (no control characters), or 'rehearsal'")
    return v


class VenvSettings(Settings):
    path: _text(MAX_PATH, "absolute path without spaces, quotes or shell characters",
                SAFE_PATH, _canonical, _not_system) = "/root/venv_sglang211"
    python: _text(5, "Python version like 3.11 (ASCII digits)", PYTHON_VERSION) = "3.11"
    # Pinned pip requirements ("name==version"); an unpinned one would make `up` non-repeatable.
    packages: list[PipSpec] = Field(default_factory=lambda: ["sglang[all]==0.5.23"], max_length=MAX_PACKAGES)
    # Local directory of wheels pushed to the host and installed with --no-index (offline
    # hosts); "rehearsal" builds the rehearsal engine's wheel.
    wheelhouse: Optional[_text(MAX_PATH, "wheel directory", None, _wheelhouse)] = None

    @field_validator("packages")
    @classmethod
    def _pins(cls, v):
        if not v:
            raise ValueError("at least one package (the serving engine) is needed")
        return v


_DEADLINES = ReadinessDeadlines()


class ReadinessSettings(Settings):
    # The defaults and why: core/specs.py (ReadinessDeadlines), what the providers read them as.
    timeout_seconds: float = Field(_DEADLINES.timeout_seconds, gt=0, le=86400)
    poll_initial_seconds: float = Field(_DEADLINES.poll_initial_seconds, gt=0, le=600)
    poll_max_seconds: float = Field(_DEADLINES.poll_max_seconds, gt=0, le=600)
    generation_timeout_seconds: float = Field(_DEADLINES.generation_timeout_seconds, gt=0, le=3600)
    settle_seconds: float = Field(_DEADLINES.settle_seconds, ge=0, le=600)
    fitness: Annotated[str, BeforeValidator(check_fitness_policy)] = _DEADLINES.fitness


BENCH_CLIENTS = ("venv", "rehearsal")
MAX_LEVELS = 16


class BenchmarkSettings(Settings):
    """``python -m components bench``: SGLang's serving benchmark (random-ids dataset, no
    download) run on the host against the serving server, one run per concurrency level."""
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(default_factory=lambda: [1, 32, 64],
                                                                      max_length=MAX_LEVELS)
    input_len: int = Field(1024, ge=1, le=1_048_576)
    output_len: int = Field(128, ge=1, le=1_048_576)
    # bench_serving's --random-range-ratio: lengths drawn from [ratio x len, len]; 1 = fixed.
    range_ratio: float = Field(1.0, gt=0, le=1)
    # Prompts per level = promptsPerConcurrency x concurrency: fewer than 5 rounds of the
    # concurrency measure mostly the ramp-up and the tail.
    prompts_per_concurrency: int = Field(5, ge=5, le=1000)
    seed: int = Field(1, ge=0, le=2**31 - 1)
    # Where the client comes from: "venv" = the serving venv's own sglang (a real host);
    # "rehearsal" = the real sglang wheel (no GPU dependencies) plus what its benchmark module
    # imports, pinned in rehearsal/bench_client.txt, pushed and installed beside the rehearsal engine.
    client: Literal["venv", "rehearsal"] = "venv"
    timeout_seconds: float = Field(3600, gt=0, le=86400)  # per level
    # Run after readiness in `pulumi up` (stack output `benchmark`): off, a real run takes minutes.
    on_deploy: bool = False

    @field_validator("on_deploy", mode="before")
    @classmethod
    def _yes_or_no(cls, v):
        # Only true or false (the strings too: `pulumi config set --path` may store one): a
        # "yes", 1 or "sometimes" is a guess at what was meant, and a wrong guess runs minutes of load.
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        raise ValueError(f"{v!r} is not true or false: onDeploy: true runs the benchmark in `pulumi up` after "
                         "readiness (stack output `benchmark`), onDeploy: false (the default) leaves it to "
                         "`python -m components bench`")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _numbers(cls, v):
        if isinstance(v, list) and any(isinstance(x, bool) for x in v):
            raise ValueError("levels are numbers of concurrent requests, not true/false: e.g. [1, 32, 64]")
        return v

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v):
        if not v:
            raise ValueError("at least one concurrency level is needed, e.g. [1, 32, 64]")
        if len(set(v)) != len(v):
            raise ValueError(f"levels must differ: {v} repeats one; e.g. {sorted(set(v))}")
        return v


# The router's versions gpu-serving has the pinned wheel set of (components/core/data/router/).
ROUTER_VERSIONS = ("1.13.0",)
# smg's --policy choices for a regular (not prefill/decode) fleet (`smg launch --help`).
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "least_load", "consistent_hashing", "prefix_hash")


class RouterSettings(Settings):
    """gpu-serving:router: SGLang's router (PyPI ``smg``) in front of the fleet's servers."""

    # The fleet entry (gpu-serving:hosts[].name) whose machine runs the router, or `host`: a
    # machine of its own (any gpu-serving:host setting).
    runs_on: Optional[Name] = None
    host: Optional[HostSettings] = None
    version: Literal[ROUTER_VERSIONS] = ROUTER_VERSIONS[-1]
    port: int = Field(30080, ge=1, le=65535)
    bind: _text(64, "IP address to bind", None, _bind) = "0.0.0.0"
    # smg's Prometheus endpoint (it would take 0.0.0.0:29000 otherwise), bound like the router.
    metrics_port: int = Field(29000, ge=1, le=65535)
    policy: Literal[ROUTER_POLICIES] = "cache_aware"
    venv_path: _text(MAX_PATH, "absolute path without spaces, quotes or shell characters",
                     SAFE_PATH, _canonical, _not_system) = "/opt/gpu-serving/router"
    # Local directory of the pinned wheels (default: the cache scripts/router-wheels fills).
    wheelhouse: Optional[_text(MAX_PATH, "wheel directory", None, _wheelhouse)] = None
    unit_name: _text(64, "unit name (letters, digits, . _ -)", UNIT_PREFIX) = "gpu-serving-router"
    # How long the router may take to list every ready worker as healthy.
    ready_timeout_seconds: float = Field(120, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_machine(self):
        if (self.runs_on is None) == (self.host is None):
            raise ValueError("set exactly one of runsOn (a gpu-serving:hosts entry's name) and host (a machine of its own)")
        if self.port == self.metrics_port:
            raise ValueError(f"port and metricsPort are both {self.port}: the router needs two ports, e.g. metricsPort 29000")
        return self


class RolloutSettings(Settings):
    """gpu-serving:rollout: how a strategy switch rolls over a fleet behind the router."""

    # Hosts out of the router at once.
    max_unavailable: int = Field(1, ge=1, le=64)
    # Longest wait for a removed host's requests in flight to finish before it is switched.
    drain_timeout_seconds: float = Field(300, gt=0, le=7200)


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


class StackSettings(BaseModel):
    """Everything one strategy stack declares."""

    model_config = ConfigDict(frozen=True)

    stack: str
    # The host this plan is for; with `hosts`, each entry in turn (see `per_host`).
    host: HostSettings
    model: ModelSettings
    strategy: StrategySettings
    serving: ServingSettings
    cuda: CudaSettings
    venv: VenvSettings
    readiness: ReadinessSettings
    benchmark: "BenchmarkSettings" = BenchmarkSettings()
    # gpu-serving:hosts, when the stack deploys to a fleet; empty for the one-host form.
    hosts: tuple[HostEntry, ...] = ()
    # gpu-serving:router: None without a router (a fleet switches all at once).
    router: Optional[RouterSettings] = None
    rollout: RolloutSettings = RolloutSettings()
    # Set by `per_host` on a multi-node stack's per-node settings: this node's rank and rank 0.
    node: Optional[NodePlace] = None
    # gpu-serving:disaggregation, checked (pd_settings.Disaggregation); `per_host` sets `role`
    # (pd_settings.RolePlace) on each server's settings, whose strategy is then its role's layout.
    disaggregation: Optional[Any] = None
    role: Optional[Any] = None

    @property
    def strategy_name(self) -> str:
        return self.strategy.name or self.stack

    @property
    def node_names(self) -> tuple[str, ...]:
        """The hosts entries forming one multi-node instance, rank 0 first; () for one node."""
        s = self.strategy
        if s.nodes:
            return tuple(s.nodes)
        if s.nnodes and s.nnodes > 1 and len(self.hosts) == s.nnodes:
            return tuple(h.name for h in self.hosts)
        return ()

    @property
    def nnodes(self) -> int:
        """How many machines one serving instance spans (1: an ordinary strategy)."""
        return self.node.nnodes if self.node else (len(self.node_names) or 1)

    def per_host(self, addresses: Optional[dict[str, str]] = None) -> list[tuple[str, "StackSettings"]]:
        """(entry name, the settings with that entry as `host`) per machine; ("", self) for the
        one-host form, whose resources keep their names. A multi-node stack: the nodes in rank
        order, each with its `node` place. `addresses`: rehearsal host name -> address (a
        rehearsal entry has none in the settings; the program reads it from the running host)."""
        if not self.hosts:
            return [("", self)]
        if self.disaggregation is not None:
            return self.disaggregation.per_server(self)
        names = self.node_names
        if not names:
            return [(h.name, self.model_copy(update={"host": h, "hosts": ()})) for h in self.hosts]
        by_name = {h.name: h for h in self.hosts}
        first = by_name[names[0]]
        rank0 = first.address or (addresses or {}).get(first.rehearsal) or f"rehearsal-{first.rehearsal}"
        return [(n, self.model_copy(update={"host": by_name[n], "hosts": (), "node": NodePlace(
                    k, len(names), names, rank0, self.strategy.dist_init_port)}))
                for k, n in enumerate(names)]


SECTIONS = {
    "host": HostSettings,
    "model": ModelSettings,
    "strategy": StrategySettings,
    "serving": ServingSettings,
    "cuda": CudaSettings,
    "venv": VenvSettings,
    "readiness": ReadinessSettings,
    "benchmark": BenchmarkSettings,
    "rollout": RolloutSettings,
}
# Sections that are off unless written.
OPTIONAL_SECTIONS = {"router": RouterSettings, pd_settings.KEY: pd_settings.DisaggregationSettings}
# Settings given as their own (secret) config keys rather than inside a section.
SECRET_KEYS = ("sshPrivateKey", "hfToken", "routerAdminKey")
# A list of host objects: the fleet one stack deploys to (one engine run for all of them).
HOSTS_KEY = "hosts"
MAX_HOSTS = 64
# Read by `watch` and `recommend` only (components/core/autoswitch.py), checked here with the rest.
AUTOSWITCH_KEY = "autoswitch"
CONFIG_KEYS = (*SECTIONS, *OPTIONAL_SECTIONS, HOSTS_KEY, AUTOSWITCH_KEY)


def _loc(section: str, loc: tuple) -> str:
    path = f"{NAMESPACE}:{section}"
    for part in loc:
        if part == "[key]":
            path += " (the name)"  # pydantic's mark for a map's key: the key itself is refused
        else:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _suggest(section: str, key: str) -> str:
    import difflib
    cls = HostEntry if section == HOSTS_KEY else {**SECTIONS, **OPTIONAL_SECTIONS, AUTOSWITCH_KEY: AutoswitchSettings}[section]
    fields = [f.alias or n for n, f in cls.model_fields.items()]
    close = difflib.get_close_matches(key, fields, n=1) if len(key) <= MAX_NAME else []
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(fields)}"


def parse_settings(stack: str, config: dict[str, Any]) -> StackSettings:
    """Validate a stack's raw config (keys without the namespace, e.g. ``{"strategy": {...}}``).

    Raises `ConfigError` listing every problem, each naming the setting.
    """
    errors: list[SettingError] = []
    sections: dict[str, Any] = {}
    for key in SECRET_KEYS:
        errors += check_secret_value(key, config.get(key))
    for key in config:
        if key not in CONFIG_KEYS and key not in SECRET_KEYS:
            import difflib
            close = difflib.get_close_matches(key, list(CONFIG_KEYS) + list(SECRET_KEYS), n=1)
            errors.append(SettingError(f"{NAMESPACE}:{key}", "unknown setting",
                                       f"did you mean {NAMESPACE}:{close[0]}?" if close else
                                       f"settings are {', '.join(NAMESPACE + ':' + s for s in CONFIG_KEYS)}"))
    for section, cls in SECTIONS.items():
        raw = config.get(section)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            errors.append(SettingError(f"{NAMESPACE}:{section}", f"must be an object of settings, got {type(raw).__name__}"))
            continue
        if section == "model" and "name" not in raw and "profile" not in raw:
            errors.append(SettingError(f"{NAMESPACE}:model", "names no model",
                                       f"set profile (one of {', '.join(sorted(PROFILES))}) or name plus the architecture numbers"))
            continue
        try:
            sections[section] = cls.model_validate(raw)
        except ValidationError as exc:
            errors += _validation_errors(section, exc)
    hosts = _parse_hosts(config.get(HOSTS_KEY), config.get("host") if isinstance(config.get("host"), dict) else {}, errors)
    router = _parse_router(config.get("router"), hosts, sections.get("serving"), errors, sections.get("strategy"), stack)
    try:
        autoswitch.parse(config.get(AUTOSWITCH_KEY))
    except ValidationError as exc:
        errors += _validation_errors(AUTOSWITCH_KEY, exc)
    disaggregation = pd_settings.parse(config.get(pd_settings.KEY), hosts=hosts, strategy=sections.get("strategy"),
                                       strategy_model=StrategySettings, router=router, serving=sections.get("serving"),
                                       model=sections.get("model"), errors=errors)
    _check_nodes(sections.get("strategy"), sections.get("serving"), hosts, errors)
    _check_ssh_ports(sections.get("host"), sections.get("serving"), sections.get("strategy"), hosts, router, errors)
    errors += model_source.check(sections.get("model"), hosts, SYSTEM_DIRS)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return StackSettings(stack=stack, hosts=hosts, router=router, disaggregation=disaggregation, **sections)


def _parse_router(raw: Any, hosts: tuple, serving, errors: list[SettingError], strategy=None, stack: str = "") -> Optional[RouterSettings]:
    """gpu-serving:router, checked against the fleet it fronts; `false` for none (a stack file turns
    off the router Pulumi.yaml declares for the project's fleets that way)."""
    if raw is None or raw is False:
        return None
    where = f"{NAMESPACE}:router"
    if strategy is not None and (strategy.nodes is not None or strategy.nnodes not in (None, 1)):
        errors.append(SettingError(where, "a router fronts a fleet of independent servers; a multi-node layout is one server "
                                   "(rank 0 answers)", f"turn it off for this stack with `gpu-serving:router: false` in "
                                   f"Pulumi.{stack}.yaml; a router declared in Pulumi.yaml applies to every stack of the project"))
        return None
    if not isinstance(raw, dict):
        errors.append(SettingError(where, f"must be an object of settings, got {type(raw).__name__}", "e.g. {runsOn: gpu1}, or false"))
        return None
    try:
        router = RouterSettings.model_validate(raw)
    except ValidationError as exc:
        errors.extend(_validation_errors("router", exc))
        return None
    if not hosts:
        errors.append(SettingError(where, "needs a fleet: the router fronts the servers of gpu-serving:hosts",
                                   "list the machines under gpu-serving:hosts, or remove gpu-serving:router"))
        return None
    names = [h.name for h in hosts]
    if router.runs_on is not None:
        if router.runs_on not in names:
            errors.append(SettingError(f"{where}.runsOn", f"{router.runs_on!r} is not a gpu-serving:hosts entry",
                                       f"one of {', '.join(names)}, or host: a machine of its own"))
            return None
        port = getattr(serving, "port", None)
        for key, value, hint in _router_ports(router):
            if port is not None and value == port:
                errors.append(SettingError(f"{where}.{key}", f"{value} is serving.port, the port {router.runs_on}'s server listens on",
                                           f"another port, e.g. {hint}"))
    else:
        mine = router.host.machine
        for h in hosts:
            for key, value, hint in _router_ports(router):
                if h.machine == mine and getattr(serving, "port", None) == value:
                    errors.append(SettingError(f"{where}.{key}", f"{value} is serving.port on {h.name}, the same machine",
                                               f"another port, e.g. {hint}"))
    return router


def _check_nodes(strategy, serving, hosts: tuple, errors: list[SettingError]) -> None:
    """strategy.nodes / strategy.nnodes against the fleet: one multi-node instance is the whole
    stack (every hosts entry, each once, rank 0 first), on machines with the same GPU count."""
    if strategy is None or (strategy.nodes is None and strategy.nnodes in (None, 1)):
        return
    where = f"{NAMESPACE}:strategy"
    names = [h.name for h in hosts]
    key = "nodes" if strategy.nodes is not None else "nnodes"
    if not hosts:
        errors.append(SettingError(f"{where}.{key}", "a multi-node layout needs the machines it spans, listed under "
                                   "gpu-serving:hosts (one entry a node)",
                                   "e.g. hosts: [{name: gpuA, address: ...}, {name: gpuB, address: ...}], strategy.nodes: [gpuA, gpuB]"))
        return
    if strategy.nodes is not None:
        nodes = list(strategy.nodes)
        unknown = [n for n in nodes if n not in names]
        if unknown:
            errors.append(SettingError(f"{where}.nodes", f"{', '.join(map(repr, unknown))} is not a gpu-serving:hosts entry",
                                       f"name hosts entries: {', '.join(names)}"))
            return
        twice = sorted({n for n in nodes if nodes.count(n) > 1})
        if twice:
            errors.append(SettingError(f"{where}.nodes", f"{', '.join(map(repr, twice))} is listed twice: a node holds one rank",
                                       "list each node once, rank 0 first"))
            return
        if len(nodes) < 2:
            errors.append(SettingError(f"{where}.nodes", "lists one node: a multi-node layout spans at least two",
                                       "list two or more hosts entries, or remove strategy.nodes for a one-node strategy"))
            return
        if strategy.nnodes is not None and strategy.nnodes != len(nodes):
            errors.append(SettingError(f"{where}.nnodes", f"nnodes {strategy.nnodes} but nodes lists {len(nodes)}",
                                       f"set nnodes: {len(nodes)}, or leave nnodes out"))
            return
        left = [n for n in names if n not in nodes]
        if left:
            errors.append(SettingError(f"{where}.nodes", f"leaves out {', '.join(left)}: a multi-node stack is one serving "
                                       "instance over all of its gpu-serving:hosts", f"list every entry: nodes: {names}, or "
                                       f"move {', '.join(left)} to a stack of its own"))
            return
    elif strategy.nnodes != len(hosts):
        errors.append(SettingError(f"{where}.nnodes", f"nnodes {strategy.nnodes} but gpu-serving:hosts lists {len(hosts)} "
                                   "machines: the instance spans all of them, one rank each",
                                   f"set nnodes: {len(hosts)}, or list the nodes by name (strategy.nodes)"))
        return
    counts = {h.gpu_count for h in hosts}
    if len(counts) > 1:
        first = hosts[0]
        for i, h in enumerate(hosts):
            if h.gpu_count != first.gpu_count:
                errors.append(SettingError(f"{NAMESPACE}:{HOSTS_KEY}[{i}].gpuCount",
                                           f"{h.name} has {h.gpu_count} GPUs, {first.name} {first.gpu_count}: every node of a "
                                           "multi-node layout runs the same number of ranks (SGLang splits the world evenly)",
                                           f"use nodes with {first.gpu_count} GPUs each"))
    port = getattr(serving, "port", None)
    if port is not None and port == strategy.dist_init_port:
        errors.append(SettingError(f"{where}.distInitPort", f"{port} is serving.port too: rank 0 listens on both",
                                   "another port, e.g. distInitPort: 20000"))


def _router_ports(router) -> tuple:
    """The router's listening ports: (its key under gpu-serving:router, the port, a default to suggest)."""
    return (("port", router.port, "30080"), ("metricsPort", router.metrics_port, "29000"))


def _check_ssh_ports(host, serving, strategy, hosts: tuple, router, errors: list[SettingError]) -> None:
    """A port a server of ours listens on is never the SSH port of its machine: sshd holds it, so
    the server could not start, and the switch would find the port taken only after writing the
    unit. Checked here, before anything reaches a host. (A rehearsal host's SSH port is its own.)"""
    machines = [(f"hosts[{i}].port, {h.name}'s SSH port", h) for i, h in enumerate(hosts)] if hosts else \
        [("host.port, the host's SSH port", host)]
    port = getattr(serving, "port", None)
    for what, m in machines:
        if m is not None and m.address and port is not None and port == m.port:
            errors.append(SettingError(f"{NAMESPACE}:serving.port", f"{port} is {what}: sshd listens there, so the server "
                                       "could not", "another port, e.g. 30000"))
    dist = getattr(strategy, "dist_init_port", None) if strategy is not None and hosts and (
        strategy.nodes is not None or strategy.nnodes not in (None, 1)) else None
    if dist is not None:
        first = (strategy.nodes or [hosts[0].name])[0]
        rank0 = next((h for h in hosts if h.name == first), None)
        if rank0 is not None and rank0.address and rank0.port == dist:
            errors.append(SettingError(f"{NAMESPACE}:strategy.distInitPort", f"{dist} is the SSH port of rank 0 ({rank0.name}): "
                                       "sshd listens there, the rendezvous could not", "another port, e.g. distInitPort: 20000"))
    if router is not None:
        if router.host is not None:
            machine, where = router.host, "router.host"
        else:
            machine = next((h for h in hosts if h.name == router.runs_on), None)
            where = f"{router.runs_on}, where it runs"
        for key, value, hint in _router_ports(router):
            if machine is not None and machine.address and value == machine.port:
                errors.append(SettingError(f"{NAMESPACE}:router.{key}", f"{value} is the SSH port of {where}: sshd listens there",
                                           f"another port, e.g. {hint}"))


def _validation_errors(section: str, exc: ValidationError, where=None) -> list[SettingError]:
    """pydantic's errors as SettingErrors; `where(loc)` names the setting (default: section.loc)."""
    where = where or (lambda loc: _loc(section, loc))
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            out.append(SettingError(where(loc), "unknown key", _suggest(section, str(loc[-1]))))
        elif err["type"] == "missing":
            fix = "set it in the stack file or pick a model profile" if section == "model" else ""
            out.append(SettingError(where(loc), "is required", fix))
        else:
            out.append(SettingError(where(loc), err["msg"].removeprefix("Value error, ")))
    return out


def _parse_hosts(raw: Any, common: dict, errors: list[SettingError]) -> tuple[HostEntry, ...]:
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

        def name_setting(loc, i=i, item=item):
            # A bad value inherited from gpu-serving:host is named there, where it is written.
            if loc and loc[0] not in item and loc[0] in common:
                return _loc("host", loc)
            return _loc(f"{HOSTS_KEY}[{i}]", loc)
        try:
            entry = HostEntry.model_validate({**common, **item})
            if names_machine:
                entries.append(entry)
        except ValidationError as exc:
            errors += _validation_errors(HOSTS_KEY, exc, name_setting)
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
