"""gpu-serving:disaggregation: prefill/decode disaggregation (SGLang's PD mode) as a strategy.

A PD stack names, among its gpu-serving:hosts, the hosts that run prefill servers and those that
run decode servers. Each host runs one server of its role on all the GPUs it uses (a role runs on
whole hosts); SGLang's router (gpu-serving:router, smg) sends every request to a prefill and a
decode server, and the decode server takes the request's KV cache from the prefill server over
the transfer backend. Each role's layout is gpu-serving:strategy's with the role's keys on top:

    gpu-serving:strategy: {tpSize: 8, epSize: 8}
    gpu-serving:disaggregation:
      prefill: {hosts: [gpu1]}
      decode: {hosts: [gpu2], dpSize: 8, enableDpAttention: true}

The flags each role's unit carries come from SGLang's server_args.py (docs: "PD Disaggregation"):
`--disaggregation-mode prefill|decode`, `--disaggregation-transfer-backend`,
`--disaggregation-bootstrap-port` (the prefill server's bootstrap server, 8998 by default),
`--disaggregation-ib-device`, and on the PREFILL server `--disaggregation-decode-tp` /
`--disaggregation-decode-dp` when the decode side's sizes differ from its own (SGLang refuses
them on a decode server: "Cannot set --disaggregation-decode-tp for the decode engine.").

Pure, and below config.py (config imports it): the merged layouts are validated with the
StrategySettings class config.py passes in, so the layout's rules keep one home.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from .errors import SettingError, shown
from .rules import NAMESPACE, rx

if TYPE_CHECKING:
    from .config_hosts import HostEntry
    from .config_serving import ModelSettings, RouterSettings, ServingSettings, StrategySettings

KEY = "disaggregation"
WHERE = f"{NAMESPACE}:{KEY}"
ROLES = ("prefill", "decode")
# SGLang's choices for --disaggregation-transfer-backend that run on NVIDIA GPUs between hosts
# (server_args.py also lists ascend, mori and fake: other hardware, or a test double).
TransferBackend = Literal["mooncake", "nixl"]
TRANSFER_BACKENDS: tuple[str, ...] = get_args(TransferBackend)
# ServerArgs.disaggregation_bootstrap_port.
DEFAULT_BOOTSTRAP_PORT = 8998
# The network the KV cache crosses: RDMA (InfiniBand, RoCE) or plain TCP (the plan warns then).
Network = Literal["tcp", "infiniband", "roce"]
NETWORKS: tuple[str, ...] = get_args(Network)
# An RDMA device as `ibv_devices` lists it (mlx5_0, mlx5_bond_0, ...).
IB_DEVICE = rx(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# The layout keys of gpu-serving:strategy a role may set for itself.
LAYOUT_KEYS = ("tpSize", "ppSize", "epSize", "dpSize", "enableDpAttention", "moeA2aBackend")
MAX_ROLE_HOSTS = 64


class _Settings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


def _ib_device(value: str) -> str:
    if not isinstance(value, str) or not IB_DEVICE.fullmatch(value):
        raise ValueError(f"{shown(str(value))} is not an RDMA device name (letters, digits, _ . : -, e.g. mlx5_0)")
    return value


class RoleSettings(_Settings):
    """One role: its hosts (gpu-serving:hosts names) and the layout keys it sets for itself."""

    hosts: list[str] = Field(min_length=1, max_length=MAX_ROLE_HOSTS)
    # Checked by StrategySettings once merged over gpu-serving:strategy (one home for the rules).
    tp_size: Optional[Any] = None
    pp_size: Optional[Any] = None
    ep_size: Optional[Any] = None
    dp_size: Optional[Any] = None
    enable_dp_attention: Optional[Any] = None
    moe_a2a_backend: Optional[Any] = Field(None, alias="moeA2aBackend")

    @field_validator("hosts")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not isinstance(name, str) or not 1 <= len(name) <= 64:
                raise ValueError(f"{shown(str(name))} is not a gpu-serving:hosts entry's name")
        return value

    def layout(self) -> dict[str, Any]:
        """The layout keys this role sets, as written."""
        return {k: v for k, v in self.model_dump(by_alias=True, exclude_unset=True).items() if k in LAYOUT_KEYS}


class DisaggregationSettings(_Settings):
    prefill: RoleSettings
    decode: RoleSettings
    transfer_backend: TransferBackend = "mooncake"
    # The prefill server's bootstrap server (the decode server's handshake); the router passes it on.
    bootstrap_port: int = Field(DEFAULT_BOOTSTRAP_PORT, ge=1024, le=65535)
    # RDMA devices for the transfer (SGLang: one device or a comma-separated list); unset: the
    # backend picks (Mooncake's auto-detection).
    ib_devices: Optional[list[str]] = Field(None, min_length=1, max_length=64)
    # What the KV cache crosses between a prefill and a decode host, and its speed: the plan says
    # what the link carries a second (over plain TCP it warns).
    network: Network = "tcp"
    link_gbps: float = Field(25, gt=0, le=3200)

    @field_validator("bootstrap_port", "link_gbps", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        # pydantic's lax mode reads true as 1.
        if isinstance(value, bool):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value

    @field_validator("ib_devices")
    @classmethod
    def _devices(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is not None:
            for device in value:
                _ib_device(device)
            if len(set(value)) != len(value):
                raise ValueError("lists a device twice")
        return value


@dataclass(frozen=True)
class RolePlace:
    """One server's place in a PD stack: what its unit's --disaggregation-* flags say
    (flags.py derives them from here, as a multi-node node's from NodePlace)."""

    role: str
    transfer_backend: str
    # The bootstrap server's port: written on the prefill server only (the router hands it to
    # the decode server with every request).
    bootstrap_port: Optional[int]
    ib_device: Optional[str]
    # On the prefill server, the decode side's sizes when they differ from its own.
    decode_tp: Optional[int] = None
    decode_dp: Optional[int] = None


@dataclass(frozen=True)
class Disaggregation:
    """The checked PD stack: the settings, each role's merged layout (a StrategySettings) and
    its hosts in the order written."""

    settings: DisaggregationSettings
    layouts: dict[str, StrategySettings]
    hosts: dict[str, list[str]]

    def roles(self) -> list[tuple[str, str]]:
        """(role, host name) for every server, prefill first."""
        return [(role, name) for role in ROLES for name in self.hosts[role]]

    def role_of(self, host: str) -> Optional[str]:
        return next((role for role, name in self.roles() if name == host), None)

    def place(self, role: str) -> RolePlace:
        s = self.settings
        ib = ",".join(s.ib_devices) if s.ib_devices else None
        if role == "decode":
            return RolePlace("decode", s.transfer_backend, None, ib)
        prefill, decode = self.layouts["prefill"], self.layouts["decode"]
        return RolePlace("prefill", s.transfer_backend, s.bootstrap_port, ib,
                         decode_tp=decode.tp_size if decode.tp_size != prefill.tp_size else None,
                         decode_dp=decode.dp_size if decode.dp_size != prefill.dp_size else None)

    def per_server(self, settings: Any) -> list[tuple[str, Any]]:
        """(host name, that server's settings) for StackSettings.per_host: the host, its role's
        layout as the strategy, its RolePlace. `settings`: a StackSettings (config.py, above this
        module)."""
        by_name = {h.name: h for h in settings.hosts}
        return [(name, settings.model_copy(update={"host": by_name[name], "hosts": (), "strategy": self.layouts[role],
                                                   "role": self.place(role)})) for role, name in self.roles()]

    def layout_setting(self, role: str, key: str) -> str:
        """Where a layout key of `role` is written: the role's own key, or gpu-serving:strategy's."""
        written = getattr(self.settings, role).layout()
        return f"{WHERE}.{role}.{key}" if key in written else f"{NAMESPACE}:strategy.{key}"


def world_size(layout: StrategySettings) -> int:
    return (1 if layout.enable_dp_attention else layout.dp_size) * layout.tp_size * layout.pp_size


def parse(raw: Any, *, hosts: tuple[HostEntry, ...], strategy: Optional[StrategySettings],
          strategy_model: type[StrategySettings], router: Optional[RouterSettings], serving: Optional[ServingSettings],
          model: Optional[ModelSettings], errors: list[SettingError]) -> Optional[Disaggregation]:
    """gpu-serving:disaggregation checked against the fleet, the router and the ports; None (and
    the problems in `errors`) when it cannot be used. `strategy_model`: config.StrategySettings."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errors.append(SettingError(WHERE, f"must be an object of settings, got {type(raw).__name__}",
                                   "e.g. {prefill: {hosts: [gpu1]}, decode: {hosts: [gpu2]}}"))
        return None
    try:
        settings = DisaggregationSettings.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            where = WHERE + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            if err["type"] == "extra_forbidden":
                errors.append(SettingError(where, "unknown key", f"a role sets hosts and {', '.join(LAYOUT_KEYS)}; "
                                           "the stack sets transferBackend, bootstrapPort, ibDevices, network, linkGbps"))
            elif err["type"] == "missing":
                errors.append(SettingError(where, "is required", "e.g. prefill: {hosts: [gpu1]}, decode: {hosts: [gpu2]}"))
            else:
                errors.append(SettingError(where, err["msg"].removeprefix("Value error, ")))
        return None
    before = len(errors)
    if not hosts:
        errors.append(SettingError(WHERE, "needs the machines it runs on, listed under gpu-serving:hosts (one role a host)",
                                   "e.g. hosts: [{name: gpu1, address: ...}, {name: gpu2, address: ...}], "
                                   "prefill: {hosts: [gpu1]}, decode: {hosts: [gpu2]}"))
        return None
    if router is None:
        errors.append(SettingError(f"{NAMESPACE}:router", "is required by prefill/decode disaggregation: SGLang's router "
                                   "(smg --pd-disaggregation) sends each request to a prefill and a decode server and "
                                   "passes the prefill server's bootstrap address to the decode server",
                                   "add gpu-serving:router, e.g. {runsOn: gpu1, port: 30080}"))
    if strategy is not None and (strategy.nodes is not None or strategy.nnodes not in (None, 1)):
        key = "nodes" if strategy.nodes is not None else "nnodes"
        errors.append(SettingError(f"{NAMESPACE}:strategy.{key}", "a multi-node layout cannot be a role of prefill/decode "
                                   "disaggregation here: each host runs one server of its role",
                                   "remove strategy.nodes/nnodes, or remove gpu-serving:disaggregation"))
    layouts = {role: _layout(role, getattr(settings, role), strategy, strategy_model, errors) for role in ROLES}
    named = _role_hosts(settings, hosts, layouts, model, serving, errors)
    checked = {role: layout for role, layout in layouts.items() if layout is not None}
    if len(checked) == len(layouts):
        _check_sides(settings, checked, errors)
    _check_ports(settings, hosts, named, router, serving, errors)
    if settings.ib_devices and settings.network == "tcp":
        errors.append(SettingError(f"{WHERE}.ibDevices", "names RDMA devices, but network is tcp (the KV cache would "
                                   "cross plain TCP)", "set network: infiniband (or roce), or remove ibDevices"))
    if len(errors) > before or len(checked) < len(layouts):
        return None
    return Disaggregation(settings, checked, named)


def _layout(role: str, rs: RoleSettings, strategy: Optional[StrategySettings], strategy_model: type[StrategySettings],
            errors: list[SettingError]) -> Optional[StrategySettings]:
    """gpu-serving:strategy's layout with the role's keys on top, checked as a strategy."""
    base = strategy.model_dump(by_alias=True, exclude_unset=True) if strategy is not None else {}
    own = rs.layout()
    try:
        return strategy_model.model_validate({**base, **own})
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            where = f"{WHERE}.{role}.{key}" if key in own else f"{NAMESPACE}:strategy.{key}"
            errors.append(SettingError(where, err["msg"].removeprefix("Value error, ")))
        return None


def _role_hosts(settings: DisaggregationSettings, hosts: tuple[HostEntry, ...], layouts: dict[str, Optional[StrategySettings]],
                model: Optional[ModelSettings], serving: Optional[ServingSettings],
                errors: list[SettingError]) -> dict[str, list[str]]:
    """Each role's hosts: gpu-serving:hosts entries, whole hosts (never both roles on one), and
    every entry in a role."""
    by_name = {h.name: h for h in hosts}
    named: dict[str, list[str]] = {}
    for role in ROLES:
        named[role] = []
        for i, name in enumerate(getattr(settings, role).hosts):
            where = f"{WHERE}.{role}.hosts[{i}]"
            if name not in by_name:
                errors.append(SettingError(where, f"{shown(name)} is not a gpu-serving:hosts entry",
                                           f"name one of {', '.join(by_name)}"))
            elif name in named[role]:
                errors.append(SettingError(where, f"{name!r} is listed twice: a host runs one server of its role",
                                           "list each host once"))
            else:
                named[role].append(name)
    for i, name in enumerate(settings.decode.hosts):
        if name in named["prefill"] and name in by_name:
            errors.append(SettingError(f"{WHERE}.decode.hosts[{i}]", _both_roles(by_name[name], layouts, model, serving),
                                       "give decode a hosts entry of its own (a second machine)"))
    for i, h in enumerate(hosts):
        if h.name not in named["prefill"] and h.name not in named["decode"]:
            errors.append(SettingError(f"{NAMESPACE}:hosts[{i}]", f"{h.name} is in neither role: a PD stack's hosts each "
                                       "run a prefill or a decode server",
                                       f"add {h.name} to disaggregation.prefill.hosts or .decode.hosts, or remove it"))
    return {role: [n for n in named[role] if not (role == "decode" and n in named["prefill"])] for role in ROLES}


def _both_roles(host: HostEntry, layouts: dict[str, Optional[StrategySettings]], model: Optional[ModelSettings],
                serving: Optional[ServingSettings]) -> str:
    """Why one host cannot hold both roles, with the numbers."""
    sizes = ", ".join(f"{role} {world_size(layout)}" for role in ROLES if (layout := layouts.get(role)) is not None)
    text = (f"{host.name} is named by both roles: each role runs on whole hosts, one server holding the GPUs it "
            f"uses (GPUs needed: {sizes}; {host.name} has {host.gpu_count})")
    fraction = getattr(serving, "mem_fraction_static", None)
    if model is not None and fraction:
        need = math.ceil(model.weights_gb / (host.gpu_memory_gb * fraction))
        text += (f"; {model.name}'s {model.weights_gb:g} GB of weights alone need {need} of its {host.gpu_count} GPUs "
                 f"({host.gpu_memory_gb:g} GB x {fraction:g} each) for one role")
    return text


def _check_sides(settings: DisaggregationSettings, layouts: dict[str, StrategySettings], errors: list[SettingError]) -> None:
    """What SGLang asserts between the two sides (server_args.validate_disagg_tp_size; the decode
    side's rank mapping in disaggregation/common/conn.py)."""
    p, d = layouts["prefill"], layouts["decode"]
    if max(p.tp_size, d.tp_size) % min(p.tp_size, d.tp_size):
        errors.append(SettingError(
            f"{WHERE}.decode.tpSize" if "tpSize" in settings.decode.layout() else f"{WHERE}.prefill.tpSize",
            f"decode tp {d.tp_size} and prefill tp {p.tp_size}: SGLang supports different tp sizes only when one is a "
            "multiple of the other (Different tp size is supported only when one tp is multiple of the other)",
            f"e.g. decode tpSize {p.tp_size}"))
    if d.pp_size not in (1, p.pp_size):
        errors.append(SettingError(
            f"{WHERE}.decode.ppSize" if "ppSize" in settings.decode.layout() else f"{NAMESPACE}:strategy.ppSize",
            f"decode pp {d.pp_size}, prefill pp {p.pp_size}: SGLang's decode side takes the KV cache from a prefill side "
            "with the same pp size or runs pp 1 (Decode pp size should be equal to prefill pp size or 1)",
            "decode ppSize 1"))


def _check_ports(settings: DisaggregationSettings, hosts: tuple[HostEntry, ...], named: dict[str, list[str]],
                 router: Optional[RouterSettings], serving: Optional[ServingSettings], errors: list[SettingError]) -> None:
    """The bootstrap port is one more port the prefill server listens on: not its serving port,
    not its machine's SSH port, not the router's ports on the same machine."""
    port = settings.bootstrap_port
    where = f"{WHERE}.bootstrapPort"
    if getattr(serving, "port", None) == port:
        errors.append(SettingError(where, f"{port} is serving.port too: the prefill server listens on both",
                                   f"another port, e.g. bootstrapPort: {DEFAULT_BOOTSTRAP_PORT}"))
    by_name = {h.name: h for h in hosts}
    for name in named.get("prefill", []):
        h = by_name[name]
        if h.address and h.port == port:
            errors.append(SettingError(where, f"{port} is the SSH port of {name}, a prefill host: sshd listens there",
                                       f"another port, e.g. bootstrapPort: {DEFAULT_BOOTSTRAP_PORT}"))
        if router is not None and (router.runs_on == name or (router.host is not None and router.host.machine == h.machine)):
            for key, value in (("port", router.port), ("metricsPort", router.metrics_port)):
                if value == port:
                    errors.append(SettingError(where, f"{port} is router.{key} too, on {name}, a prefill host",
                                               f"another port, e.g. bootstrapPort: {DEFAULT_BOOTSTRAP_PORT}"))
