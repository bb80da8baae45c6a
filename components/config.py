"""The settings of a gpu-serving stack, validated with pydantic before anything touches a host.

Pulumi config keys (namespace ``gpu-serving``) map one-to-one to the models here:
``host``, ``model``, ``strategy``, ``serving``, ``cuda``, ``venv``, ``readiness``. Field names
are camelCase in YAML, as users write them. Per-field rules (types, ranges, safe characters)
live here; rules that tie several settings together (world size, expert split, memory) live in
`strategy` and `memory`.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .errors import ConfigError, SettingError
from .profiles import PROFILES

NAMESPACE = "gpu-serving"

# Characters allowed in anything that ends up on a command line or in a unit file. Paths,
# names and flag values never need shell or systemd metacharacters; refusing them here is what
# lets the renderers and the remote layer stay simple and safe.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:,+@=-]+$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SAFE_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]{0,127}$")
FLAG = re.compile(r"^--[a-z0-9]+(?:-[a-z0-9]+)*(?:=[A-Za-z0-9_./:,+@=-]+)?$")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
HOST_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|rsa-sha2-(256|512)) [A-Za-z0-9+/]+={0,2}$")
PIP_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")
CUDA_VERSION = re.compile(r"^\d{1,2}\.\d{1,2}$")

# moe_a2a_backend values for which SGLang overwrites ep_size with tp_size
# (server_args.py, _handle_a2a_moe); "none" keeps the declared ep_size.
A2A_BACKENDS = ("deepep", "deepep_v2", "mooncake", "nixl", "mori", "pplx", "flashinfer", "megamoe", "ascend_fuseep")
ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "fa3", "fa4", "flashinfer", "flashmla",
    "cutlass_mla", "trtllm_mla", "cutedsl_mla", "trtllm_mha", "aiter",
)
GRAMMAR_BACKENDS = ("xgrammar", "outlines", "llguidance", "none")


def _matching(pattern: re.Pattern | str, what: str):
    """A str type that must match `pattern`; the error says what was expected."""
    pattern = re.compile(pattern) if isinstance(pattern, str) else pattern

    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value
    return Annotated[str, AfterValidator(check)]


Name = _matching(SAFE_NAME, "name (letters, digits, . _ -)")


def _abs_path(value: str) -> str:
    if not SAFE_PATH.match(value):
        raise ValueError(f"{value!r} is not a valid absolute path without spaces, quotes or shell characters")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} contains a '..' segment: write the path it means")
    return value


AbsPath = Annotated[str, AfterValidator(_abs_path)]
# Directories of the operating system itself: a venv there would be created with --clear.
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
               "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin",
               "/usr/sbin", "/var", "/var/lib"}
# Environment keys that hold credentials: those come only as Pulumi secrets (gpu-serving:hfToken),
# never as plain config that would sit in the state and the preview in clear text.
SECRET_ENV_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS")
SECRET_ENV_SUFFIXES = ("_API_KEY", "_ACCESS_KEY", "_PRIVATE_KEY", "_SECRET_KEY")
# apt source options that weaken signature checking.
APT_SAFE_OPTIONS = {"signed-by", "arch"}
# Free text shown in messages only (gpuModel): printable, no shell or systemd metacharacters.
SAFE_TEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,127}$")
# Secrets go into a double-quoted line of the 0600 EnvironmentFile: these would end or extend it.
SECRET_FORBIDDEN = "\n\r\0\"\\$`'"


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
        if not value or any(c in value for c in SECRET_FORBIDDEN) or any(c.isspace() for c in value):
            return [SettingError(where, "contains whitespace, a quote, a backslash, $ or a backtick (a token never does)",
                                 "paste the token alone: pulumi config set --secret gpu-serving:hfToken")]
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
    address: Optional[str] = None
    rehearsal: Name = "default"
    port: int = Field(22, ge=1, le=65535)
    user: _matching(r"^[a-z_][a-z0-9_-]{0,31}$", "user name") = "root"
    gpu_count: int = Field(8, ge=1, le=64)
    gpu_memory_gb: float = Field(96, gt=0, le=1024)
    gpu_model: _matching(SAFE_TEXT, "GPU model name (letters, digits, spaces, . _ ( ) / + -)") = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    interconnect: Literal["pcie", "nvlink"] = "pcie"
    # The pinned SSH host key ("ssh-ed25519 AAAA..."); required for a real host.
    host_key: Optional[_matching(HOST_KEY, "SSH public host key (\"ssh-ed25519 AAAA...\")")] = None
    # Path on the operator's machine to the private key, when it is not given as the
    # secret `gpu-serving:sshPrivateKey`.
    private_key_path: Optional[_matching(r"^[~/][A-Za-z0-9_./+-]*$", "key file path")] = None
    connect_timeout_seconds: float = Field(15, gt=0, le=300)
    command_timeout_seconds: float = Field(600, gt=0, le=7200)

    @field_validator("address")
    @classmethod
    def _address(cls, v):
        if v is None:
            return v
        try:
            ipaddress.ip_address(v)
            return v
        except ValueError:
            pass
        if not HOSTNAME.match(v):
            raise ValueError(f"{v!r} is neither an IP address nor a host name")
        return v


    @model_validator(mode="after")
    def _rehearsal_takes_no_connection_settings(self):
        # The rehearsal host's port, user and keys come from `python -m rehearsal up` (its
        # host.json); a value set here would be silently ignored, so it is refused (issue 12.8).
        if self.address is None:
            ignored = [to_camel(f) for f in ("port", "user", "host_key", "private_key_path") if f in self.model_fields_set]
            if ignored:
                raise ValueError(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} only for a real host (with address); "
                                 f"the rehearsal host {self.rehearsal!r} is reached as `python -m rehearsal up` set it up: "
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


class ModelSettings(Settings):
    profile: Optional[str] = None
    name: Name
    path: Optional[AbsPath] = None  # default /models/<name>
    served_name: Optional[_matching(SAFE_SERVED_NAME, "served model name (letters, digits, . _ - / :)")] = None
    num_layers: int = Field(ge=1, le=1000)
    num_experts: int = Field(ge=0, le=100000)  # 0 = dense model
    moe_intermediate_size: int = Field(ge=0)
    kv_lora_rank: int = Field(ge=0)  # 0 = not MLA
    qk_rope_head_dim: int = Field(ge=0)
    kv_dtype_bytes: float = Field(2, gt=0, le=4)
    weights_gb: float = Field(gt=0, le=1_000_000)
    attention_weights_gb: float = Field(0, ge=0, le=1_000_000)
    # For non-MLA models: KV bytes per token per layer before TP split (2 x heads x dim x bytes).
    kv_bytes_per_token_per_layer: Optional[int] = Field(None, gt=0)


    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: Any):
        if isinstance(data, dict) and data.get("profile") is not None:
            profile = data["profile"]
            if not isinstance(profile, str) or profile not in PROFILES:
                raise ValueError(f"unknown profile {profile!r}; built-in profiles: {', '.join(sorted(PROFILES))}")
            data = {**PROFILES[profile], **data}
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


class StrategySettings(Settings):
    # Defaults to the stack name (tp8, pp8, ep8, ...): it names the unit.
    name: Optional[_matching(r"^[a-z0-9][a-z0-9_-]{0,31}$", "strategy name (lower-case letters, digits, _ -)")] = None
    tp_size: int = Field(1, ge=1, le=64)
    pp_size: int = Field(1, ge=1, le=64)
    ep_size: int = Field(1, ge=1, le=64)
    dp_size: int = Field(1, ge=1, le=64)
    enable_dp_attention: bool = False
    # to_camel would spell it moeA2ABackend; users write moeA2aBackend.
    moe_a2a_backend: Literal["none", *A2A_BACKENDS] = Field("none", alias="moeA2aBackend")



class ServingSettings(Settings):
    port: int = Field(30001, ge=1024, le=65535)
    host: str = "0.0.0.0"
    mem_fraction_static: float = Field(0.88, gt=0, lt=1)
    context_length: int = Field(32768, ge=1, le=10_000_000)
    max_running_requests: Optional[int] = Field(64, ge=1, le=100_000)
    attention_backend: Optional[Literal[ATTENTION_BACKENDS]] = "triton"
    grammar_backend: Optional[Literal[GRAMMAR_BACKENDS]] = "none"
    trust_remote_code: bool = True
    speculative_algorithm: Optional[Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]] = None
    extra_args: list[str] = Field(default_factory=list)
    # Written once, to the shared EnvironmentFile of every strategy unit of this model.
    environment: dict[str, str] = Field(default_factory=dict)
    unit_prefix: _matching(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", "unit name prefix (letters, digits, . _ -)") = "sglang"
    environment_dir: AbsPath = "/etc/gpu-serving"
    # Strategy units this one must never run beside (systemd Conflicts=). Default: every
    # strategy that has a Pulumi.<strategy>.yaml in the project.
    conflicts_with: Optional[list[Name]] = None
    restart_sec: int = Field(30, ge=1, le=3600)
    timeout_start_sec: int = Field(3600, ge=60, le=86400)

    @field_validator("host")
    @classmethod
    def _bind(cls, v):
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address to bind (use 0.0.0.0 or 127.0.0.1)") from None
        if "%" in v:
            raise ValueError(f"{v!r}: a scoped address (%zone) cannot be bound by the server; use 0.0.0.0 or ::")
        return v

    @field_validator("environment", mode="before")
    @classmethod
    def _env_to_str(cls, v):
        # YAML turns NCCL_IB_DISABLE: 1 into an int; the environment is text.
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x)) if isinstance(x, (int, float, bool)) else x for k, x in v.items()}
        return v

    @field_validator("environment")
    @classmethod
    def _env(cls, v: dict[str, str]):
        for key, value in v.items():
            if not ENV_KEY.match(key):
                raise ValueError(f"environment key {key!r} is not a valid variable name")
            if any(c in value for c in "\n\r\0\"\\$`'"):
                raise ValueError(f"environment {key}: value contains a newline, quote, backslash, $ or backtick")
            parts = key.upper().split("_")
            if any(p in SECRET_ENV_PARTS for p in parts) or key.upper().endswith(SECRET_ENV_SUFFIXES):
                raise ValueError(f"environment {key} looks like a credential: plain settings end up in clear text in the "
                                 "state and the preview; give it as a secret (gpu-serving:hfToken for HF_TOKEN)")
        return v


    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]):
        for i, arg in enumerate(v):
            if arg.startswith("-"):
                if not FLAG.match(arg):
                    raise ValueError(f"extraArgs[{i}] {arg!r} is not a --long-flag (lower-case, digits, dashes)")
            elif not SAFE_VALUE.match(arg):
                raise ValueError(f"extraArgs[{i}] {arg!r} contains characters that are not allowed (spaces, quotes, shell or systemd metacharacters)")
        return v


class CudaSettings(Settings):
    version: _matching(CUDA_VERSION, "CUDA version like 13.0") = "13.0"
    home: Optional[AbsPath] = None  # default /usr/local/cuda-<version>
    # apt: NVIDIA's apt repository (pinned keyring); verify: the host comes with CUDA, only check it.
    install: Literal["apt", "verify"] = "apt"
    apt_package: Optional[_matching(r"^[a-z0-9][a-z0-9.+-]+(=[A-Za-z0-9.+~:-]+)?$", "Debian package name")] = None  # default cuda-toolkit-<major>-<minor>
    apt_repository: Optional[str] = None  # "deb [signed-by=...] URL /" line; default NVIDIA's
    keyring_sha256: Optional[_matching(r"^[0-9a-f]{64}$", "sha256 hex digest")] = None


    @field_validator("apt_repository")
    @classmethod
    def _apt(cls, v):
        # The full line is parsed at preview (cuda.settings_problems); here what must never pass.
        if v is None or v == "rehearsal":
            return v
        if any(c in v for c in "\n\r\0\"'`$;|&<>\\"):
            raise ValueError(f"{v!r} contains a newline, quote, $, backtick or shell metacharacter; "
                             "an apt source is one line 'deb [signed-by=/path] URI SUITE'")
        options = re.search(r"\[([^\]]*)\]", v)
        for option in (options.group(1).split() if options else []):
            if option.split("=", 1)[0] not in APT_SAFE_OPTIONS:
                raise ValueError(f"apt option {option!r} is not allowed (it would weaken or bypass the signature check); "
                                 f"only {', '.join(sorted(APT_SAFE_OPTIONS))}")
        return v

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


class VenvSettings(Settings):
    path: AbsPath = "/root/venv_sglang211"
    python: _matching(r"^3\.\d{1,2}$", "Python version like 3.11") = "3.11"
    # Pinned pip requirements ("name==version"); an unpinned one would make `up` non-repeatable.
    packages: list[str] = Field(default_factory=lambda: ["sglang[all]==0.5.23"])
    # Local directory of wheels pushed to the host and installed with --no-index (offline
    # hosts); "rehearsal" builds the rehearsal engine's wheel.
    wheelhouse: Optional[str] = None


    @field_validator("path")
    @classmethod
    def _not_system(cls, v):
        if (v.rstrip("/") or "/") in SYSTEM_DIRS:
            raise ValueError(f"{v!r} is a system directory; a venv needs its own, e.g. /root/venv_sglang211 or /opt/sglang/venv")
        return v

    @field_validator("wheelhouse")
    @classmethod
    def _wheelhouse(cls, v):
        if v is not None and (not v or any(ord(c) < 32 for c in v)):
            raise ValueError("must be a local directory of wheels (no control characters), or 'rehearsal'")
        return v

    @field_validator("packages")
    @classmethod
    def _pins(cls, v):
        for i, spec in enumerate(v):
            if not PIP_SPEC.match(spec):
                raise ValueError(f"packages[{i}] {spec!r} must be pinned as name==version")
        if not v:
            raise ValueError("at least one package (the serving engine) is needed")
        return v


class ReadinessSettings(Settings):
    # A 590 GB checkpoint takes many minutes to load; the deadline covers load + warmup.
    timeout_seconds: float = Field(3600, gt=0, le=86400)
    # First poll right after the start, then 0.5 s growing x1.5 to pollMaxSeconds: a fast
    # server is seen ready within half a second, a long load is polled a few times a minute.
    poll_initial_seconds: float = Field(0.5, gt=0, le=600)
    poll_max_seconds: float = Field(30, gt=0, le=600)
    generation_timeout_seconds: float = Field(60, gt=0, le=3600)
    # Once ready, the unit must stay up this long (catches crash-loops right after ready).
    settle_seconds: float = Field(1, ge=0, le=600)


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
    # gpu-serving:hosts, when the stack deploys to a fleet; empty for the one-host form.
    hosts: tuple[HostEntry, ...] = ()

    @property
    def strategy_name(self) -> str:
        return self.strategy.name or self.stack

    def per_host(self) -> list[tuple[str, "StackSettings"]]:
        """(entry name, the settings with that entry as `host`) per machine; ("", self) for the
        one-host form, whose resources keep their names."""
        if not self.hosts:
            return [("", self)]
        return [(h.name, self.model_copy(update={"host": h, "hosts": ()})) for h in self.hosts]


SECTIONS = {
    "host": HostSettings,
    "model": ModelSettings,
    "strategy": StrategySettings,
    "serving": ServingSettings,
    "cuda": CudaSettings,
    "venv": VenvSettings,
    "readiness": ReadinessSettings,
}
# Settings given as their own (secret) config keys rather than inside a section.
SECRET_KEYS = ("sshPrivateKey", "hfToken")
# A list of host objects: the fleet one stack deploys to (one engine run for all of them).
HOSTS_KEY = "hosts"
MAX_HOSTS = 64
CONFIG_KEYS = (*SECTIONS, HOSTS_KEY)


def _loc(section: str, loc: tuple) -> str:
    path = f"{NAMESPACE}:{section}"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _suggest(section: str, key: str) -> str:
    import difflib
    cls = HostEntry if section == HOSTS_KEY else SECTIONS[section]
    fields = [f.alias or n for n, f in cls.model_fields.items()]
    close = difflib.get_close_matches(key, fields, n=1)
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
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return StackSettings(stack=stack, hosts=hosts, **sections)


def _validation_errors(section: str, exc: ValidationError, where=None) -> list[SettingError]:
    """pydantic's errors as SettingErrors; `where(loc)` names the setting (default: section.loc)."""
    where = where or (lambda loc: _loc(section, loc))
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            out.append(SettingError(where(loc), "unknown key", _suggest(section, str(loc[-1]))))
        elif err["type"] == "missing":
            out.append(SettingError(where(loc), "is required", "set it in the stack file or pick a model profile" if section == "model" else ""))
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
