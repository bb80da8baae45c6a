"""The settings of a gpu-serving stack, validated with pydantic before anything touches a host.

Pulumi config keys (namespace ``gpu-serving``) map one-to-one to the models: ``host``, ``model``,
``strategy``, ``serving``, ``cuda``, ``venv``, ``readiness``, ... Field names are camelCase in
YAML, as users write them. The models live in three modules below this one:

- `config_fields`: every text setting's bound and pattern, the address, key, environment and
  extraArgs checks, the refusal of credentials in plain settings, the base model;
- `config_hosts`: `host`, the fleet's `hosts` entries, a node's place in a multi-node instance;
- `config_serving`: the model, the layout, the server, CUDA, the venv, readiness, the serving
  benchmark, the router and the roll.

Here: the stack as a whole (`StackSettings`), `parse_settings`, and the checks that tie sections
together (the router and the nodes against the fleet, the ports against SSH). Rules about the
numbers (world size, expert split, memory) live in `strategy` and `memory`. The other modules
import the models from here.
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from . import autoswitch, metrics_settings, model_source, pd_settings
from .autoswitch import AutoswitchSettings
from .config_fields import SYSTEM_DIRS, check_secret_value, validation_errors
from .config_hosts import HOSTS_KEY, HostEntry, HostSettings, NodePlace, parse_hosts
from .config_serving import (
    A2A_BACKENDS,
    ROUTER_VERSIONS,
    BenchmarkSettings,
    CudaSettings,
    ModelSettings,
    ReadinessSettings,
    RolloutSettings,
    RouterSettings,
    ServingSettings,
    StrategySettings,
    VenvSettings,
)
from .errors import ConfigError, SettingError
from .profiles import PROFILES
from .rules import NAMESPACE

# What the other modules import from here (the models' own modules are below this one).
__all__ = [
    "A2A_BACKENDS", "AUTOSWITCH_KEY", "CONFIG_KEYS", "METRICS_KEY", "HOSTS_KEY", "NAMESPACE", "OPTIONAL_SECTIONS", "ROUTER_VERSIONS",
    "SECRET_KEYS", "SECTIONS", "SYSTEM_DIRS", "BenchmarkSettings", "CudaSettings", "HostEntry", "HostSettings",
    "ModelSettings", "NodePlace", "ReadinessSettings", "RolloutSettings", "RouterSettings", "ServingSettings",
    "StackSettings", "StrategySettings", "VenvSettings", "parse_settings",
]


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
    benchmark: BenchmarkSettings = BenchmarkSettings()
    # gpu-serving:hosts, when the stack deploys to a fleet; empty for the one-host form.
    hosts: tuple[HostEntry, ...] = ()
    # gpu-serving:router: None without a router (a fleet switches all at once).
    router: Optional[RouterSettings] = None
    rollout: RolloutSettings = RolloutSettings()
    # Set by `per_host` on a multi-node stack's per-node settings: this node's rank and rank 0.
    node: Optional[NodePlace] = None
    # gpu-serving:disaggregation, checked (pd_settings.Disaggregation); `per_host` sets `role`
    # (pd_settings.RolePlace) on each server's settings, whose strategy is then its role's layout.
    # Held as they are (pydantic validates nothing in them again); the type checker sees the classes.
    if TYPE_CHECKING:
        disaggregation: Optional[pd_settings.Disaggregation] = None
        role: Optional[pd_settings.RolePlace] = None
    else:
        disaggregation: Optional[Any] = None
        role: Optional[Any] = None

    @property
    def declared_router(self) -> RouterSettings:
        """gpu-serving:router, of a stack that declares one (what its router unit and roll use)."""
        if self.router is None:
            raise ValueError(f"stack {self.stack} declares no gpu-serving:router")
        return self.router

    @property
    def node_place(self) -> NodePlace:
        """This node's place, on a multi-node stack's per-node settings (`per_host` sets it)."""
        if self.node is None:
            raise ValueError(f"stack {self.stack}: these settings are not a node's of a multi-node layout")
        return self.node

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

    def per_host(self, addresses: Optional[dict[str, str]] = None) -> list[tuple[str, StackSettings]]:
        """(entry name, the settings with that entry as `host`) per machine; ("", self) for the
        one-host form, whose resources keep their names. A multi-node stack: the nodes in rank
        order, each with its `node` place. `addresses`: rehearsal host name -> address (a
        rehearsal entry has none in the settings; the program reads it from the running host)."""
        if not self.hosts:
            return [("", self)]
        if self.disaggregation is not None:
            per_server: list[tuple[str, StackSettings]] = self.disaggregation.per_server(self)
            return per_server
        names = self.node_names
        if not names:
            return [(h.name, self.model_copy(update={"host": h, "hosts": ()})) for h in self.hosts]
        by_name = {h.name: h for h in self.hosts}
        first = by_name[names[0]]
        rank0 = first.address or (addresses or {}).get(first.rehearsal) or f"rehearsal-{first.rehearsal}"
        return [(n, self.model_copy(update={"host": by_name[n], "hosts": (), "node": NodePlace(
                    k, len(names), names, rank0, self.strategy.dist_init_port)}))
                for k, n in enumerate(names)]


SECTIONS: dict[str, type[BaseModel]] = {
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
OPTIONAL_SECTIONS: dict[str, type[BaseModel]] = {"router": RouterSettings, pd_settings.KEY: pd_settings.DisaggregationSettings}
# Settings given as their own (secret) config keys rather than inside a section.
SECRET_KEYS = ("sshPrivateKey", "hfToken", "routerAdminKey")
# Read by `watch` and `recommend` only (components/core/autoswitch.py), checked here with the rest.
AUTOSWITCH_KEY = "autoswitch"
# Read by the program on this machine (where `up` rewrites the Prometheus target file: core/metrics_settings.py).
METRICS_KEY = metrics_settings.METRICS_KEY
CONFIG_KEYS = (*SECTIONS, *OPTIONAL_SECTIONS, HOSTS_KEY, AUTOSWITCH_KEY, METRICS_KEY)


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
            errors += validation_errors(section, exc, cls)
    common = config.get("host")
    hosts = parse_hosts(config.get(HOSTS_KEY), common if isinstance(common, dict) else {}, errors)
    router = _parse_router(config.get("router"), hosts, sections.get("serving"), errors, sections.get("strategy"), stack)
    try:
        autoswitch.parse(config.get(AUTOSWITCH_KEY))
    except ValidationError as exc:
        errors += validation_errors(AUTOSWITCH_KEY, exc, AutoswitchSettings)
    try:
        metrics_settings.parse_metrics(config.get(METRICS_KEY))
    except ValidationError as exc:
        errors += validation_errors(METRICS_KEY, exc, metrics_settings.MetricsSettings)
    disaggregation = pd_settings.parse(config.get(pd_settings.KEY), hosts=hosts, strategy=sections.get("strategy"),
                                       strategy_model=StrategySettings, router=router, serving=sections.get("serving"),
                                       model=sections.get("model"), errors=errors)
    _check_nodes(sections.get("strategy"), sections.get("serving"), hosts, errors)
    _check_ssh_ports(sections.get("host"), sections.get("serving"), sections.get("strategy"), hosts, router, errors)
    errors += model_source.check(sections.get("model"), hosts, SYSTEM_DIRS)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return StackSettings(stack=stack, hosts=hosts, router=router, disaggregation=disaggregation, **sections)


def _parse_router(raw: Any, hosts: tuple[HostEntry, ...], serving: Optional[ServingSettings], errors: list[SettingError],
                  strategy: Optional[StrategySettings] = None, stack: str = "") -> Optional[RouterSettings]:
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
        errors.extend(validation_errors("router", exc, RouterSettings))
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
    elif router.host is not None:  # the model's own check: exactly one of runsOn and host
        mine = router.host.machine
        for h in hosts:
            for key, value, hint in _router_ports(router):
                if h.machine == mine and getattr(serving, "port", None) == value:
                    errors.append(SettingError(f"{where}.{key}", f"{value} is serving.port on {h.name}, the same machine",
                                               f"another port, e.g. {hint}"))
    return router


def _check_nodes(strategy: Optional[StrategySettings], serving: Optional[ServingSettings], hosts: tuple[HostEntry, ...],
                 errors: list[SettingError]) -> None:
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


def _router_ports(router: RouterSettings) -> tuple[tuple[str, int, str], ...]:
    """The router's listening ports: (its key under gpu-serving:router, the port, a default to suggest)."""
    return (("port", router.port, "30080"), ("metricsPort", router.metrics_port, "29000"))


def _check_ssh_ports(host: Optional[HostSettings], serving: Optional[ServingSettings], strategy: Optional[StrategySettings],
                     hosts: tuple[HostEntry, ...], router: Optional[RouterSettings], errors: list[SettingError]) -> None:
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
    if dist is not None and strategy is not None:
        first = (strategy.nodes or [hosts[0].name])[0]
        rank0 = next((h for h in hosts if h.name == first), None)
        if rank0 is not None and rank0.address and rank0.port == dist:
            errors.append(SettingError(f"{NAMESPACE}:strategy.distInitPort", f"{dist} is the SSH port of rank 0 ({rank0.name}): "
                                       "sshd listens there, the rendezvous could not", "another port, e.g. distInitPort: 20000"))
    if router is not None:
        machine: Optional[HostSettings]
        if router.host is not None:
            machine, where = router.host, "router.host"
        else:
            machine = next((h for h in hosts if h.name == router.runs_on), None)
            where = f"{router.runs_on}, where it runs"
        for key, value, hint in _router_ports(router):
            if machine is not None and machine.address and value == machine.port:
                errors.append(SettingError(f"{NAMESPACE}:router.{key}", f"{value} is the SSH port of {where}: sshd listens there",
                                           f"another port, e.g. {hint}"))

