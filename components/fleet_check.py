"""Before a fleet's run changes anything: every host's address known, and behind a router, the
roll planned from what the hosts and the router say now (components/core/roll.py).

The program asks the provider process to read the fleet (remote/fleet_read.py, through an invoke
it waits for: the order of the hosts' switches is made of the answer) and registers, when the run
must stop, one `RunRefused` resource that every resource declared after it waits for (a stack
transformation adds it to their depends_on, components included: a component registering while
the engine stops would fail the program with "Resource monitor has terminated"). Its check fails
the preview and the update before anything else is even registered. A destroy or a refresh runs
the program too, and the engine checks no resource there (it skips one it has no state of), so
the stack is declared as ever: a refusal never keeps it from being destroyed, or its drift and
outputs from being read."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi.runtime import config as runtime_config

from .core import roll as roll_plan
from .core import router as R
from .core.config import StackSettings
from .gpu_host import GpuHostArgs, connection_of
from .remote.ahead import READ_FLEET
from .remote.rehearsal_adapter import host_record, not_running
from .resources import RunRefused


@dataclass
class FleetCheck:
    """`refused`: why the run stops (RunRefused registered); `roll`: the roll's order behind a router."""
    refused: Optional[str] = None
    roll: Optional[roll_plan.RollPlan] = None


# This program run's refusal: the transformation acts for it only (tests run programs one after
# another in one process, on one root stack resource).
_REFUSAL: list = []


def begin_run() -> None:
    _REFUSAL.clear()


def refuse(message: str) -> None:
    """Register the refusal, and make every resource declared after it wait for it."""
    refusal = RunRefused("run-refused", message)
    _REFUSAL[:] = [refusal]

    def wait_for_the_refusal(args: pulumi.ResourceTransformationArgs) -> Optional[pulumi.ResourceTransformationResult]:
        if _REFUSAL != [refusal]:
            return None
        return pulumi.ResourceTransformationResult(
            args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(depends_on=[refusal])))

    pulumi.runtime.register_stack_transformation(wait_for_the_refusal)


def unresolved(settings: StackSettings) -> list[tuple[str, str]]:
    """(entry, why) for each machine of the stack whose address is not known: a rehearsal host
    that is not running (the engine would get `rehearsal-<name>` for it)."""
    out = [(f"hosts[{h.name}]", not_running(h.rehearsal, f"hosts[{h.name}]")) for h in settings.hosts
           if h.is_rehearsal and host_record(h.rehearsal) is None]
    router_host = settings.router.host if settings.router is not None else None
    if router_host is not None and router_host.is_rehearsal and host_record(router_host.rehearsal) is None:
        out.append(("gpu-serving:router.host", not_running(router_host.rehearsal, "gpu-serving:router.host")))
    return out


def read_fleet(doc: dict) -> Optional[dict]:
    """The provider process's reading of the fleet (remote/fleet_read.py), waited for; None outside
    a real engine (the SDK's mocks). An invoke's answer or failure, never an exception."""
    from google.protobuf import json_format
    from pulumi.runtime import rpc, settings
    from pulumi.runtime.proto import resource_pb2, resource_pb2_grpc

    monitor = settings.get_monitor()
    if not isinstance(monitor, resource_pb2_grpc.ResourceMonitorStub):
        return None
    request = resource_pb2.ResourceInvokeRequest(tok=READ_FLEET)
    # A JSON text marked secret (it holds the private keys and the router's key), as read_ahead sends its own.
    request.args.update({"fleet": {rpc._special_sig_key: rpc._special_secret_sig, "value": json.dumps(doc)}})
    try:
        response = monitor.Invoke(request)
    except Exception as exc:  # noqa: BLE001 - the roll is refused with it, not the program crashed
        return {"error": f"the provider did not answer ({type(exc).__name__})"}
    if response.failures:
        return {"error": "; ".join(f.reason for f in response.failures)[:400]}
    value = json_format.MessageToDict(getattr(response, "return"))
    # The engine marks the answer secret as the arguments were (the sig key beside "value"): unwrap.
    while isinstance(value, dict) and "value" in value:
        value = value["value"]
    try:
        answer = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        answer = None
    return answer if isinstance(answer, dict) else {"error": "the provider's answer was not a fleet"}


def _plan_roll(settings: StackSettings, plans: list, private_key, secret_keys: list[str]) -> roll_plan.RollPlan:
    r = settings.declared_router
    names = [n for n, _ in plans]
    conns = {n: connection_of(GpuHostArgs(p.settings, private_key=private_key, entry=n)) for n, p in plans}
    urls = {n: R.worker_url(conns[n][1], p.settings.serving.port) for n, p in plans}
    if r.runs_on is not None:
        router_conn = conns[r.runs_on]
    else:
        router_conn = connection_of(GpuHostArgs(settings.model_copy(update={"host": r.host, "hosts": ()}),
                                                private_key=private_key, setting="gpu-serving:router.host"))
    key = runtime_config.get_config("gpu-serving:routerAdminKey")
    if router_conn[2] is None or not isinstance(key, str) or any(conns[n][2] is None for n in names):
        return roll_plan.unknown(names, settings.rollout.max_unavailable)
    answer = read_fleet({
        "hosts": [{"name": n, "url": urls[n], "connection": conns[n][2], "unit": p.unit.name,
                   "execStart": [str(a) for a in p.unit.exec_start], "environment": p.environment,
                   "secretKeys": secret_keys} for n, p in plans],
        "router": {"connection": router_conn[2], "bind": r.bind, "port": r.port, "venvPath": r.venv_path, "adminKey": key},
    })
    if answer is None:
        return roll_plan.unknown(names, settings.rollout.max_unavailable)
    if answer.get("error"):
        return roll_plan.RollPlan((), 0, refused=f"the roll to {settings.strategy_name} is refused before any host leaves the "
                                                 f"router: the fleet could not be read first ({answer['error']})")
    hosts = [roll_plan.host_from_dict(h) for h in answer.get("hosts") or []]
    router = roll_plan.RouterNow.from_dict(answer.get("router") or {})
    return roll_plan.plan(hosts, router, settings.strategy_name, max_unavailable=settings.rollout.max_unavailable)


def check_fleet(settings: StackSettings, plans: list, private_key, secret_keys: list[str]) -> FleetCheck:
    """A fleet's (or a multi-node stack's) check before its first resource, and its roll behind a
    router; a refusal is registered here (`refuse`), before the program declares anything else."""
    if not settings.hosts:
        return FleetCheck()
    missing = unresolved(settings)
    check = FleetCheck(refused=roll_plan.unresolved(missing)) if missing else FleetCheck()
    if not missing and settings.router is not None and not settings.node_names:
        roll = _plan_roll(settings, plans, private_key, secret_keys)
        check = FleetCheck(refused=roll.refused, roll=roll)
    if check.refused:
        refuse(check.refused)
    return check
