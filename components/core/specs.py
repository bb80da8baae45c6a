"""The contract of each dynamic resource: one frozen dataclass per resource, the only place that
knows its props' key names and defaults (issue 37, step 1).

The engine keeps a resource's props in the stack's state and hands them back to every verb of
its provider (create, read, update, diff, delete). So these dicts are a contract across program
versions: the program builds them (`to_props`), every provider verb opens with `from_props`, and
`from_props` also reads what earlier versions of the program stored (a key missing, a list where a
line is now). `to_props` must give exactly the dict the program has always given for the same
settings (tests/test_program_inputs.py freezes it): another key or default is an update of every
deployed stack.

Values the program passes as Pulumi Outputs (the connection, a secret's hash) go through `to_props`
untouched: a field is typed by what a provider sees, `Any` where the program may pass an Output.
A connection stays the mapping ssh.Target reads (remote/ssh.py): how to reach a machine is the
transport's contract, not a resource's.

Specs of the installers, the router and the benchmark live in specs_install.py and specs_router.py.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

Props = Mapping[str, Any]


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _entry(props: Props) -> str:
    return str(props.get("hostEntry") or "")


def _with_entry(props: dict[str, Any], entry: str) -> dict[str, Any]:
    """`hostEntry` only for a fleet's resources: the one-host form never had the key."""
    return {**props, "hostEntry": entry} if entry else props


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadinessDeadlines:
    """`gpu-serving:readiness` as the providers get it: how long a start may take and how it is
    polled. The defaults' one home: the settings (core/config.py: ReadinessSettings) take theirs
    from here, and a state written before a setting existed reads as its default. (Not the other
    way round: the providers' process never loads the settings models, tests/test_program_imports.py.)"""

    # A 590 GB checkpoint takes many minutes to load; the deadline covers load and warm-up.
    timeout_seconds: float = 3600.0
    # Polls wait on the host, from the start: 0.5 s growing x1.5 to poll_max_seconds, answering at
    # once on the server's signals (port, ready line, generation): the interval bounds the round
    # trips, never how late readiness is seen.
    poll_initial_seconds: float = 0.5
    poll_max_seconds: float = 30.0
    # One generation after the server said it is ready: SGLang's own health check allows 20 s.
    generation_timeout_seconds: float = 60.0
    # Once ready, the unit must stay up this long (catches a crash-loop right after ready).
    settle_seconds: float = 1.0
    # A start on a machine whose fitness drifted from its benchmark baseline (core/fitness_baseline.py).
    fitness: str = "warn"

    @classmethod
    def from_props(cls, value: Any) -> "ReadinessDeadlines":
        d = _mapping(value)
        base = cls()
        return cls(timeout_seconds=float(d.get("timeoutSeconds", base.timeout_seconds)),
                   poll_initial_seconds=float(d.get("pollInitialSeconds", base.poll_initial_seconds)),
                   poll_max_seconds=float(d.get("pollMaxSeconds", base.poll_max_seconds)),
                   generation_timeout_seconds=float(d.get("generationTimeoutSeconds", base.generation_timeout_seconds)),
                   settle_seconds=float(d.get("settleSeconds", base.settle_seconds)),
                   fitness=str(d.get("fitness", base.fitness)))

    @classmethod
    def from_settings(cls, settings: Any) -> "ReadinessDeadlines":
        """From the validated settings (core/config.py: ReadinessSettings)."""
        return cls.from_props(settings.model_dump(by_alias=True))

    def to_props(self) -> dict[str, Any]:
        return {"timeoutSeconds": self.timeout_seconds, "pollInitialSeconds": self.poll_initial_seconds,
                "pollMaxSeconds": self.poll_max_seconds, "generationTimeoutSeconds": self.generation_timeout_seconds,
                "settleSeconds": self.settle_seconds, "fitness": self.fitness}


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouterPlace:
    """A fleet host's place behind SGLang's router (the service's `router` prop): how to reach the
    router's admin API, the URL it knows this host's server by, and the roll's bounds."""

    connection: Any
    bind: str
    port: int
    venv_path: str
    admin_key: str
    worker_url: str
    drain_timeout: float = 300.0
    ready_timeout: float = 120.0
    # The key a member's unit carries (X-GpuServing-RoutedBy): which fleet's router routes to it.
    routed_by: str = ""
    # Serves as declared but is out of the router: its update puts it back, with no restart.
    rejoin: bool = False

    @classmethod
    def from_props(cls, value: Any) -> Optional["RouterPlace"]:
        d = _mapping(value)
        if not d:
            return None
        return cls(connection=d.get("connection"), bind=str(d.get("bind", "")), port=int(d.get("port") or 0),
                   venv_path=str(d.get("venvPath", "")), admin_key=str(d.get("adminKey", "")),
                   worker_url=str(d.get("workerUrl", "")), drain_timeout=float(d.get("drainTimeout") or 300),
                   ready_timeout=float(d.get("readyTimeout") or 120), routed_by=str(d.get("routedBy") or ""),
                   rejoin=bool(d.get("rejoin")))

    def admin(self) -> dict[str, Any]:
        """What the router's admin API client needs (specs_router.RouterAdminAccess's props)."""
        return {"connection": self.connection, "bind": self.bind, "port": self.port, "venvPath": self.venv_path,
                "adminKey": self.admin_key}

    def to_props(self) -> dict[str, Any]:
        return {**self.admin(), "workerUrl": self.worker_url, "drainTimeout": self.drain_timeout,
                "readyTimeout": self.ready_timeout, "routedBy": self.routed_by, **({"rejoin": True} if self.rejoin else {})}


# ---------------------------------------------------------------------------------------------
def argv(exec_start: Any) -> list[str]:
    """A service's `execStart` as an argv: one shell-quoted line in the props (a preview shows one
    line, not one per argument), a list in states written before."""
    if isinstance(exec_start, str):
        return shlex.split(exec_start)
    return [str(a) for a in exec_start or []]


@dataclass(frozen=True)
class RankSpec:
    """One node of a multi-node layout (the multi-node service's `ranks`): its machine, and what its
    unit runs there."""

    name: str
    rank: int
    connection: Any
    exec_start: Any
    environment: Mapping[str, str]

    @classmethod
    def from_props(cls, value: Any) -> "RankSpec":
        d = _mapping(value)
        return cls(name=str(d.get("name", "")), rank=int(d.get("rank") or 0), connection=d.get("connection"),
                   exec_start=d.get("execStart"), environment=_mapping(d.get("environment")))

    def to_props(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "connection": self.connection, "execStart": self.exec_start,
                "environment": self.environment}


@dataclass(frozen=True)
class ServiceSpec:
    """A serving strategy's unit as a resource (SystemdService; MultiNodeService with `ranks`):
    which unit, what its main process must run (`exec_start`, `environment`: compared with
    /proc/<MainPID> on refresh; `config_hash`: a change restarts it), where it answers (`bind`,
    `port`), the layout readiness confirms (`declared`), the deadlines, and whether it should run
    (`active`, `enabled`). A fleet host's place behind the router in `router`; a multi-node
    layout's nodes in `ranks`, rank 0 first (rank 0 is also the spec itself)."""

    connection: Any
    unit: str
    config_hash: Any = ""
    exec_start: Any = ""
    environment: Mapping[str, str] = field(default_factory=dict)
    bind: str = "127.0.0.1"
    port: int = 30000
    declared: Mapping[str, Any] = field(default_factory=dict)
    readiness: ReadinessDeadlines = field(default_factory=ReadinessDeadlines)
    secret_environment: Any = field(default_factory=dict)
    stack: str = ""
    host_entry: str = ""
    router: Optional[RouterPlace] = None
    # The router's props as the program passed them (a secret Output while the program runs).
    router_props: Any = None
    ranks: tuple[RankSpec, ...] = ()
    active: bool = True
    enabled: bool = True
    # Whether a state holds what the process is compared with (states before that did not).
    compares_process: bool = True

    @classmethod
    def from_props(cls, props: Props) -> "ServiceSpec":
        return cls(connection=props.get("connection"), unit=str(props.get("unit", "")),
                   config_hash=props.get("configHash", ""), exec_start=props.get("execStart", ""),
                   environment=_mapping(props.get("environment")), bind=str(props.get("bind") or "127.0.0.1"),
                   port=int(props.get("port") or 30000), declared=_mapping(props.get("declared")),
                   readiness=ReadinessDeadlines.from_props(props.get("readiness")),
                   secret_environment=_mapping(props.get("secretEnvironment")), stack=str(props.get("stack") or ""),
                   host_entry=_entry(props), router=RouterPlace.from_props(props.get("router")),
                   router_props=props.get("router"),
                   ranks=tuple(RankSpec.from_props(r) for r in props.get("ranks") or ()),
                   active=bool(props.get("active", True)), enabled=bool(props.get("enabled", True)),
                   compares_process="execStart" in props and "environment" in props)

    def to_props(self) -> dict[str, Any]:
        """The inputs the program registers (not the outputs a provider adds)."""
        props: dict[str, Any] = {
            "connection": self.connection, "unit": self.unit, "configHash": self.config_hash, "execStart": self.exec_start,
            "environment": dict(self.environment), "bind": self.bind, "port": self.port, "declared": dict(self.declared),
            "readiness": self.readiness.to_props(), "secretEnvironment": self.secret_environment, "stack": self.stack}
        if self.ranks:
            props["ranks"] = [r.to_props() for r in self.ranks]
        if self.router_props is not None:
            props["router"] = self.router_props
        elif self.router is not None:
            props["router"] = self.router.to_props()
        return _with_entry(props, self.host_entry)

    @property
    def argv(self) -> list[str]:
        return argv(self.exec_start)

    @property
    def secrets(self) -> list[str]:
        """Every secret value the service's messages must never carry: the SSH key and the
        secret environment's values."""
        values = [str(_mapping(self.connection).get("privateKey") or "")]
        values += [str(v) for v in _mapping(self.secret_environment).values()]
        return [v for v in values if v]

    @property
    def who(self) -> str:
        """The fleet entry a message is about (`hosts[gpu2]: `); empty for the one-host form."""
        return f"hosts[{self.host_entry}]: " if self.host_entry else ""

    @property
    def behind_router(self) -> bool:
        return self.router is not None and self.active

    def node(self, rank: int) -> "ServiceSpec":
        """The spec a one-host service would have for node `rank` of a multi-node layout."""
        r = self.ranks[rank]
        return replace(self, connection=r.connection, exec_start=r.exec_start, environment=r.environment,
                       host_entry=r.name, ranks=())


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteFileSpec:
    """A file on a host (RemoteFile): written atomically, read back on refresh. The secret
    environment's KEY="value" lines are appended on the host and kept out of `content`, so the plain
    part stays readable in diffs."""

    connection: Any
    path: str
    content: str = ""
    mode: str = "0644"
    secret_environment: Any = field(default_factory=dict)
    retain_on_delete: bool = False  # shared by every strategy stack (the environment file)
    reload_systemd: bool = False    # a unit file: daemon-reload after a write or a delete
    show_when_new: bool = False     # printed whole by the preview when it is new
    host_entry: str = ""
    # Which keys the program gave: the environment file has `secretEnvironment`, the unit file not.
    given: frozenset[str] = frozenset()

    @classmethod
    def from_props(cls, props: Props) -> "RemoteFileSpec":
        return cls(connection=props.get("connection"), path=str(props.get("path", "")), content=str(props.get("content") or ""),
                   mode=str(props.get("mode") or "0644"), secret_environment=_mapping(props.get("secretEnvironment")),
                   retain_on_delete=bool(props.get("retainOnDelete")), reload_systemd=bool(props.get("reloadSystemd")),
                   show_when_new=bool(props.get("showWhenNew")), host_entry=_entry(props), given=frozenset(props))

    def to_props(self) -> dict[str, Any]:
        props: dict[str, Any] = {"connection": self.connection, "path": self.path, "content": self.content, "mode": self.mode}
        optional = {"secretEnvironment": self.secret_environment, "retainOnDelete": self.retain_on_delete,
                    "reloadSystemd": self.reload_systemd, "showWhenNew": self.show_when_new}
        props.update({k: v for k, v in optional.items() if k in self.given})
        return _with_entry(props, self.host_entry)

    @property
    def secret_lines(self) -> str:
        """What the host's file holds after `content`: one KEY="value" line a secret, sorted."""
        return "".join(f'{k}="{v}"\n' for k, v in sorted(_mapping(self.secret_environment).items()))

    @property
    def mode_bits(self) -> int:
        return int(self.mode, 8)

    @property
    def who(self) -> str:
        return f"hosts[{self.host_entry}]: " if self.host_entry else ""


def file_spec(connection: Any, path: str, content: str, mode: str, host_entry: str = "", **flags: Any) -> RemoteFileSpec:
    """A RemoteFileSpec as the components declare one: `flags` in the props' words
    (secretEnvironment, retainOnDelete, reloadSystemd, showWhenNew), each given only when named."""
    names = {"secretEnvironment": "secret_environment", "retainOnDelete": "retain_on_delete",
             "reloadSystemd": "reload_systemd", "showWhenNew": "show_when_new"}
    return RemoteFileSpec(connection=connection, path=path, content=content, mode=mode, host_entry=host_entry,
                          given=frozenset(flags), **{names[k]: v for k, v in flags.items()})


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpectedHardware:
    """What the stack expects of the machine (HostFacts' `expect`): a machine that runs no strategy
    (the router's) expects nothing (`needed_gpus` 0)."""

    needed_gpus: int
    gpu_count: int = 0
    gpu_memory_gb: float = 0.0
    interconnect: str = "pcie"

    @classmethod
    def from_props(cls, value: Any) -> "ExpectedHardware":
        d = _mapping(value)
        return cls(needed_gpus=int(d.get("neededGpus") or 0), gpu_count=int(d.get("gpuCount") or 0),
                   gpu_memory_gb=float(d.get("gpuMemoryGb") or 0), interconnect=str(d.get("interconnect") or "pcie"))

    def to_props(self) -> dict[str, Any]:
        if not self.needed_gpus:
            return {"neededGpus": 0}
        return {"gpuCount": self.gpu_count, "gpuMemoryGb": self.gpu_memory_gb, "interconnect": self.interconnect,
                "neededGpus": self.needed_gpus}


@dataclass(frozen=True)
class HostFactsSpec:
    """The machine's facts (HostFacts): read in one round trip, checked against `expect`. `prefetch`
    (reads.py specs of the reads the later resources make) is plumbing, never a change."""

    connection: Any
    cuda_home: str
    expect: ExpectedHardware
    prefetch: Any = None
    host_entry: str = ""

    @classmethod
    def from_props(cls, props: Props) -> "HostFactsSpec":
        return cls(connection=props.get("connection"), cuda_home=str(props.get("cudaHome") or ""),
                   expect=ExpectedHardware.from_props(props.get("expect")), prefetch=props.get("prefetch"),
                   host_entry=_entry(props))

    def to_props(self) -> dict[str, Any]:
        return _with_entry({"connection": self.connection, "cudaHome": self.cuda_home, "expect": self.expect.to_props(),
                            "prefetch": self.prefetch}, self.host_entry)

    @property
    def who(self) -> str:
        return f"hosts[{self.host_entry}]: " if self.host_entry else ""


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadinessSpec:
    """The readiness record as a resource (Readiness): the service's check when it started the unit
    (`report`), one look on refresh."""

    connection: Any
    unit: str
    bind: str
    port: int
    declared: Mapping[str, Any]
    readiness: ReadinessDeadlines
    report: Any = None
    host_entry: str = ""

    # The inputs the program gives (the rest of a state is the report's fields).
    INPUTS = ("connection", "unit", "bind", "port", "declared", "readiness", "report", "hostEntry")

    @classmethod
    def from_props(cls, props: Props) -> "ReadinessSpec":
        return cls(connection=props.get("connection"), unit=str(props.get("unit", "the unit")),
                   bind=str(props.get("bind") or "127.0.0.1"), port=int(props.get("port") or 30000),
                   declared=_mapping(props.get("declared")), readiness=ReadinessDeadlines.from_props(props.get("readiness")),
                   report=props.get("report"), host_entry=_entry(props))

    def to_props(self) -> dict[str, Any]:
        return _with_entry({"connection": self.connection, "unit": self.unit, "bind": self.bind, "port": self.port,
                            "declared": dict(self.declared), "readiness": self.readiness.to_props(), "report": self.report},
                           self.host_entry)

    @property
    def who(self) -> str:
        return f"hosts[{self.host_entry}]: " if self.host_entry else ""


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RendezvousNode:
    name: str
    rank: int
    connection: Any

    @property
    def label(self) -> str:
        return f"{self.name} (rank {self.rank})"


@dataclass(frozen=True)
class RendezvousSpec:
    """Every node of a multi-node layout reaches rank 0 (RendezvousCheck), checked before its units
    change: rank 0's address as the others reach it, its sshd port (the rendezvous port does not
    listen yet), the rendezvous port, and each node's unit hash (a changed layout checks again)."""

    connection: Any
    nodes: tuple[RendezvousNode, ...]
    address: str
    ssh_port: Any  # rank 0's connection's port: an Output while the program runs
    port: int
    units: Mapping[str, str]

    @classmethod
    def from_props(cls, props: Props) -> "RendezvousSpec":
        nodes = tuple(RendezvousNode(name=str(n.get("name", "")), rank=int(n.get("rank") or 0), connection=n.get("connection"))
                      for n in (_mapping(x) for x in props.get("nodes") or ()))
        return cls(connection=props.get("connection"), nodes=nodes, address=str(props.get("address", "")),
                   ssh_port=int(props.get("sshPort") or 22), port=int(props.get("port") or 0), units=_mapping(props.get("units")))

    def to_props(self) -> dict[str, Any]:
        return {"connection": self.connection,
                "nodes": [{"name": n.name, "rank": n.rank, "connection": n.connection} for n in self.nodes],
                "address": self.address, "sshPort": self.ssh_port, "port": self.port, "units": dict(self.units)}
