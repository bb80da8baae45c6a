"""Multi-node layouts (issue 17): one SGLang server over several machines, one unit a node.

Two providers:

- `RendezvousCheckProvider`: before any unit file of the layout is written, every node >= 1
  checks over SSH that it reaches rank 0's address (a route to it, and a TCP connection to rank
  0's sshd: the rendezvous port itself is not listening yet). A node that cannot is named and
  nothing changes on any node.
- `MultiNodeServiceProvider`: the switch of all the nodes as one, by the one switch executor
  (remote/switch_executor.py: every node locked, planned and refused before anything stops; the
  ranks started together; rank 0 judged by generation and layout, the others by unit and journal;
  a failure undone on every node). What stays here is how the ranks read as one service.
"""
from __future__ import annotations

from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from ..core import readiness as R
from ..core.specs import RendezvousSpec, ServiceSpec
from . import identity, ssh, switch_executor
from .common import changed as _changed
from .common import require_target as _require_target
from .common import resource_id
from .common import stop_and_disable as _stop_and_disable
from .provider_errors import DeployError
from .providers import ServiceProvider
from .service_diff import service_diff
from .service_state import declared_inputs, without_last_reading

# $1 rank 0's address, $2 a port it listens on (its sshd). Exit 3: no route; 4: no TCP connection.
REACH_SCRIPT = (
    "if command -v ip >/dev/null 2>&1; then r=$(ip route get \"$1\" 2>&1) || { echo \"no route: $r\"; exit 3; }; fi\n"
    "timeout 5 bash -c 'exec 3<>/dev/tcp/$0/$1' \"$1\" \"$2\" 2>/dev/null"
    " || { echo \"no TCP connection to $1 port $2 within 5 s\"; exit 4; }\n"
    "echo reachable\n"
)


@identity.guarded
class RendezvousCheckProvider(ResourceProvider):
    """props: connection (rank 0's), nodes [{name, rank, connection}], address (rank 0's as the
    others reach it), sshPort (rank 0's sshd), port (the rendezvous port), units (the units'
    hashes: a changed layout checks again)."""

    def _check_all(self, props: dict) -> None:
        spec = RendezvousSpec.from_props(props)
        problems = []
        for node in spec.nodes:
            if node.rank == 0:
                continue
            t = _require_target({"connection": node.connection})
            out = ssh.run(t, ["sh", "-c", REACH_SCRIPT, "sh", spec.address, str(spec.ssh_port)],
                          purpose=f"checking that {node.name} reaches rank 0", timeout=30, check=False, read=True)
            if out.rc != 0:
                problems.append(f"{node.label} cannot reach rank 0 ({spec.nodes[0].name}) at {spec.address}: "
                                f"{(out.stdout or out.stderr).strip()[-300:]}")
        if problems:
            raise DeployError("multi-node rendezvous: " + "; ".join(problems) + f". The ranks meet at {spec.address}:"
                              f"{spec.port} (strategy.distInitPort); nothing was changed on any node.")

    def create(self, props):
        self._check_all(props)
        spec = RendezvousSpec.from_props(props)
        return CreateResult(id_=f"{spec.address}:{spec.port}:rendezvous", outs=props)

    def update(self, id, olds, news):
        self._check_all(news)
        return UpdateResult(outs=news)

    def read(self, id, props):
        return ReadResult(id_=id, outs=props, inputs=props)

    def diff(self, id, olds, news):
        changed = _changed(olds, news, ["nodes", "address", "sshPort", "port", "units"])
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def delete(self, id, props):
        pass


@identity.guarded
class MultiNodeServiceProvider(ServiceProvider):
    """The layout's units on every node, switched as one by the switch executor (ServiceProvider's
    create and update hand the spec over; its `ranks` make it a multi-node switch). props:
    ServiceSpec with `ranks` [{name, rank, connection, execStart, environment}] in rank order
    (rank 0 first; the spec's own connection, execStart and environment are rank 0's). What differs
    from one host: the ranks read and diff as one service, and its id."""

    def check(self, olds, news):
        return CheckResult(news, [])

    @staticmethod
    def _id(props: dict) -> str:
        # Its own id: the same host and unit can be a single-host service of another stack.
        return resource_id(props, ServiceSpec.from_props(props).unit, "nodes")

    def _running_now(self, props: dict) -> str:
        spec = ServiceSpec.from_props(props)
        return switch_executor.ranks_running(self._lives(spec)) if spec.active else R.NOT_RUNNING

    @staticmethod
    def _lives(spec: ServiceSpec):
        return switch_executor.lives(switch_executor.nodes_of(spec))

    def read(self, id, props):
        lives = self._lives(ServiceSpec.from_props(props))
        if all(live is None for _, live in lives):
            return ReadResult(id_=None, outs={})
        live = switch_executor.together(lives)
        props = without_last_reading(props)  # the last reading's: this one says whether there are any
        return ReadResult(id_=id, outs={**props, **live}, inputs={**declared_inputs(props), **live})

    def diff(self, id, olds, news):
        return service_diff(olds, news, more=("ranks",))

    def delete(self, id, props):
        spec = ServiceSpec.from_props(props)
        for k in range(len(spec.ranks)):
            _stop_and_disable(_require_target(spec.node(k).to_props(), stored=True), spec.unit)
