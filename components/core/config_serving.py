"""The settings of what a stack serves and how: the model, the parallel layout, the server
(its flag-only settings declared by the flag table), CUDA, the venv, readiness, the serving
benchmark, the router and the roll behind it. Each section is checked on its own here; rules
across sections live in config.py, `strategy` and `memory`."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Self, get_args

from pydantic import BeforeValidator, Field, create_model, field_validator, model_validator

from . import flags, model_source
from .config_fields import (
    ABS_PATH,
    APT_PACKAGE,
    APT_SAFE_OPTIONS,
    CUDA_VERSION,
    IPV6_ZONE,
    MAX_APT_LINE,
    MAX_ARGS,
    MAX_CONFLICTS,
    MAX_ENV,
    MAX_NAME,
    MAX_PACKAGES,
    MAX_PATH,
    MAX_SERVED_NAME,
    PYTHON_VERSION,
    SAFE_PATH,
    SAFE_SERVED_NAME,
    SHA256,
    STRATEGY_NAME,
    SYSTEM_DIRS,
    UNIT_PREFIX,
    AbsPath,
    BindAddress,
    EnvKey,
    EnvValue,
    ExtraArg,
    Name,
    PipSpec,
    Settings,
    canonical,
    text_setting,
)
from .config_hosts import HostSettings
from .errors import shown
from .fitness_baseline import check_policy as check_fitness_policy
from .profiles import PROFILES
from .specs import ReadinessDeadlines

# moe_a2a_backend values for which SGLang overwrites ep_size with tp_size
# (server_args.py, _handle_a2a_moe); "none" keeps the declared ep_size.
A2aBackend = Literal["deepep", "deepep_v2", "mooncake", "nixl", "mori", "pplx", "flashinfer", "megamoe", "ascend_fuseep"]
A2A_BACKENDS: tuple[str, ...] = get_args(A2aBackend)


def _profile(value: str) -> str:
    if value not in PROFILES:
        raise ValueError(f"unknown profile {shown(value)}; built-in profiles: {', '.join(sorted(PROFILES))}")
    return value


ProfileName = Annotated[str, text_setting(MAX_NAME, "profile name", None, _profile)]
ServedName = Annotated[str, text_setting(MAX_SERVED_NAME, "served model name (letters, digits, . _ - / :)", SAFE_SERVED_NAME)]
ModelSource = Annotated[str, text_setting(model_source.MAX_SOURCE, "model source", None, model_source.checked)]
HubEndpoint = Annotated[str, text_setting(model_source.MAX_ENDPOINT, "Hub endpoint URL", None, model_source.endpoint)]


class ModelSettings(Settings):
    profile: Optional[ProfileName] = None
    name: Name
    # Unset, `_defaults` derives them (/models/<name>, the name): the type checker sees the text
    # every validated model holds.
    if TYPE_CHECKING:
        path: AbsPath = ""
        served_name: ServedName = ""
    else:
        path: Optional[AbsPath] = None  # default /models/<name>
        served_name: Optional[ServedName] = None
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
    source: ModelSource = "verify"
    hub_endpoint: Optional[HubEndpoint] = None

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("profile") is not None:
            profile = data["profile"]
            # An unknown profile is refused by the field's own check (which names
            # model.profile); the numbers of a known one stand in meanwhile, so the refusal is
            # not buried under "numLayers is required" and the like.
            known = profile if isinstance(profile, str) and profile in PROFILES else next(iter(PROFILES))
            data = {**PROFILES[known], **data}
        return data

    @model_validator(mode="after")
    def _defaults(self) -> Self:
        if self.path is None:
            object.__setattr__(self, "path", f"/models/{self.name}")
        if self.served_name is None:
            object.__setattr__(self, "served_name", self.name)
        return self

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0


# The networks between nodes gpu-serving knows NCCL defaults for (data/node-networks.json).
NodeNetwork = Literal["tcp", "infiniband", "roce"]
NODE_NETWORKS: tuple[str, ...] = get_args(NodeNetwork)
# As many as a stack has hosts (MAX_HOSTS).
MAX_NODES = 64


StrategyName = Annotated[str, text_setting(32, "strategy name (lower-case letters, digits, _ -)", STRATEGY_NAME)]
InterfaceName = Annotated[str, text_setting(15, "network interface name (letters, digits, _ . -)", IPV6_ZONE)]


class StrategySettings(Settings):
    # Defaults to the stack name (tp8, pp8, ep8, ...): it names the unit.
    name: Optional[StrategyName] = None
    tp_size: int = Field(1, ge=1, le=64)
    pp_size: int = Field(1, ge=1, le=64)
    ep_size: int = Field(1, ge=1, le=64)
    dp_size: int = Field(1, ge=1, le=64)
    enable_dp_attention: bool = False
    # to_camel would spell it moeA2ABackend; users write moeA2aBackend.
    moe_a2a_backend: Literal["none", A2aBackend] = Field("none", alias="moeA2aBackend")
    # Multi-node (one serving instance over several machines, SGLang's --nnodes): the
    # gpu-serving:hosts entries that form it, rank 0 first (rank = list order); or `nnodes`, the
    # number of hosts entries, which then all form it in their order. Unset: one node.
    nodes: Optional[list[Name]] = Field(None, max_length=MAX_NODES)
    nnodes: Optional[int] = Field(None, ge=1, le=MAX_NODES)
    # The port rank 0 listens on for the others (--dist-init-addr <rank 0>:<port>); 20000 as in
    # SGLang's multi-node examples.
    dist_init_port: int = Field(20000, ge=1024, le=65535)
    # The network between the nodes: its NCCL defaults come from components/core/data/node-networks.json.
    node_network: NodeNetwork = "tcp"
    # The interface NCCL's and Gloo's bootstrap (and NCCL's socket transport) use, e.g. eth0
    # (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); unset: NCCL picks one.
    socket_interface: Optional[InterfaceName] = None


class _ServingPlace(Settings):
    """Where the server listens: declared first, as SGLang's --port and --host come first."""

    port: int = Field(30001, ge=1024, le=65535)
    host: BindAddress = "0.0.0.0"


# The serving settings that are nothing but an SGLang flag (memFractionStatic,
# maxRunningRequests, cudaGraphMaxBs, ...): declared by the flag table (flags.py), after port and
# host. A type checker cannot read a model built at run time, so it sees them as `Any` attributes.
if TYPE_CHECKING:
    class _ServingFlags(_ServingPlace):
        def __getattr__(self, name: str) -> Any: ...
else:
    # __module__: the class names the module it is bound in (pickle and pydantic look it up
    # there), as the classes written out do.
    _ServingFlags = create_model("_ServingFlags", __base__=_ServingPlace, __module__=__name__,
                                 **flags.declared("serving"))

UnitPrefix = Annotated[str, text_setting(MAX_NAME, "unit name prefix (letters, digits, . _ -)", UNIT_PREFIX)]


class ServingSettings(_ServingFlags):
    """gpu-serving:serving: port and host, the flag table's settings, then those below, which
    mean more than a flag."""

    # Each item is checked on its own, so a refusal names it (serving.extraArgs[3]).
    extra_args: list[ExtraArg] = Field(default_factory=list, max_length=MAX_ARGS)
    # Written once, to the shared EnvironmentFile of every strategy unit of this model.
    environment: dict[EnvKey, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    unit_prefix: UnitPrefix = "sglang"
    environment_dir: AbsPath = "/etc/gpu-serving"
    # Strategy units this one must never run beside (systemd Conflicts=). Default: every
    # strategy that has a Pulumi.<strategy>.yaml in the project.
    conflicts_with: Optional[list[Name]] = Field(None, max_length=MAX_CONFLICTS)
    restart_sec: int = Field(30, ge=1, le=3600)
    timeout_start_sec: int = Field(3600, ge=60, le=86400)


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


CudaVersion = Annotated[str, text_setting(5, "CUDA version like 13.0 (ASCII digits)", CUDA_VERSION)]
AptPackage = Annotated[str, text_setting(128, "Debian package name", APT_PACKAGE)]
AptLine = Annotated[str, text_setting(MAX_APT_LINE, "apt source line", None, _apt_repository)]
Sha256 = Annotated[str, text_setting(64, "sha256 hex digest", SHA256)]


class CudaSettings(Settings):
    version: CudaVersion = "13.0"
    # Unset, `_defaults` derives home and aptPackage (the type checker sees a validated model's text).
    if TYPE_CHECKING:
        home: AbsPath = ""
    else:
        home: Optional[AbsPath] = None  # default /usr/local/cuda-<version>
    # apt: NVIDIA's apt repository (pinned keyring); verify: the host comes with CUDA, only check it.
    install: Literal["apt", "verify"] = "apt"
    if TYPE_CHECKING:
        apt_package: AptPackage = ""
    else:
        apt_package: Optional[AptPackage] = None  # default cuda-toolkit-<major>-<minor>
    # "deb [signed-by=...] URL /" line; default NVIDIA's
    apt_repository: Optional[AptLine] = None
    keyring_sha256: Optional[Sha256] = None

    @model_validator(mode="after")
    def _defaults(self) -> Self:
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


# A directory gpu-serving creates a venv in (--clear): never one of the system's own.
VenvPath = Annotated[str, text_setting(MAX_PATH, ABS_PATH, SAFE_PATH, canonical, _not_system)]
Wheelhouse = Annotated[str, text_setting(MAX_PATH, "wheel directory", None, _wheelhouse)]
PythonVersion = Annotated[str, text_setting(5, "Python version like 3.11 (ASCII digits)", PYTHON_VERSION)]


class VenvSettings(Settings):
    path: VenvPath = "/root/venv_sglang211"
    python: PythonVersion = "3.11"
    # Pinned pip requirements ("name==version"); an unpinned one would make `up` non-repeatable.
    packages: list[PipSpec] = Field(default_factory=lambda: ["sglang[all]==0.5.23"], max_length=MAX_PACKAGES)
    # Local directory of wheels pushed to the host and installed with --no-index (offline
    # hosts); "rehearsal" builds the rehearsal engine's wheel.
    wheelhouse: Optional[Wheelhouse] = None

    @field_validator("packages")
    @classmethod
    def _pins(cls, v: list[str]) -> list[str]:
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
    def _yes_or_no(cls, v: Any) -> bool:
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
    def _numbers(cls, v: Any) -> Any:
        if isinstance(v, list) and any(isinstance(x, bool) for x in v):
            raise ValueError("levels are numbers of concurrent requests, not true/false: e.g. [1, 32, 64]")
        return v

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("at least one concurrency level is needed, e.g. [1, 32, 64]")
        if len(set(v)) != len(v):
            raise ValueError(f"levels must differ: {v} repeats one; e.g. {sorted(set(v))}")
        return v


# The router's versions gpu-serving has the pinned wheel set of (components/core/data/router/).
RouterVersion = Literal["1.13.0"]
ROUTER_VERSIONS: tuple[RouterVersion, ...] = get_args(RouterVersion)
# smg's --policy choices for a regular (not prefill/decode) fleet (`smg launch --help`).
RouterPolicy = Literal["cache_aware", "round_robin", "random", "power_of_two", "least_load", "consistent_hashing", "prefix_hash"]
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
UnitName = Annotated[str, text_setting(64, "unit name (letters, digits, . _ -)", UNIT_PREFIX)]


class RouterSettings(Settings):
    """gpu-serving:router: SGLang's router (PyPI ``smg``) in front of the fleet's servers."""

    # The fleet entry (gpu-serving:hosts[].name) whose machine runs the router, or `host`: a
    # machine of its own (any gpu-serving:host setting).
    runs_on: Optional[Name] = None
    host: Optional[HostSettings] = None
    version: RouterVersion = ROUTER_VERSIONS[-1]
    port: int = Field(30080, ge=1, le=65535)
    bind: BindAddress = "0.0.0.0"
    # smg's Prometheus endpoint (it would take 0.0.0.0:29000 otherwise), bound like the router.
    metrics_port: int = Field(29000, ge=1, le=65535)
    policy: RouterPolicy = "cache_aware"
    venv_path: VenvPath = "/opt/gpu-serving/router"
    # Local directory of the pinned wheels (default: the cache scripts/router-wheels fills).
    wheelhouse: Optional[Wheelhouse] = None
    unit_name: UnitName = "gpu-serving-router"
    # How long the router may take to list every ready worker as healthy.
    ready_timeout_seconds: float = Field(120, gt=0, le=3600)

    @model_validator(mode="after")
    def _one_machine(self) -> Self:
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

