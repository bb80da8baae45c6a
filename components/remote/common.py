"""What every dynamic provider of remote/ does the same way: where it connects, how it reports
progress, which of its props changed. One copy, imported by providers.py and installers.py."""
from __future__ import annotations

import sys
from typing import Any, Mapping

from . import engine_log, ssh


def progress(message: str, ephemeral: bool = False) -> None:
    """A line (or block) for the run's output: progress, not silence. One message to the engine
    (engine_log.py); `ephemeral`: a step of a wait, shown while it happens, not kept among the
    run's diagnostics. Outside the engine, stderr."""
    if not engine_log.say(message, ephemeral=ephemeral):
        print(message, file=sys.stderr, flush=True)


def connection_of(props: Any) -> dict[str, Any]:
    """A resource's `connection` (every resource has one: how to reach its machine, ssh.Target's
    contract), {} when it has none or it is not a mapping (an Output not resolved)."""
    c = props.get("connection") if isinstance(props, Mapping) else None
    return dict(c) if isinstance(c, Mapping) else {}


def host_name(props: Any, t: ssh.Target) -> str:
    """A machine as the team names it in a message that outlives the run (the failure ledger, the
    fitness drift): its fleet entry, a rehearsal host's name, else the login."""
    entry = props.get("hostEntry") if isinstance(props, Mapping) else None
    return str(entry or "") or str(connection_of(props).get("rehearsal") or "") or t.label


def reachable(props: Any) -> bool:
    """The program resolved the resource's machine (a rehearsal host not running is `unavailable`)."""
    c = connection_of(props)
    return bool(c) and not c.get("unavailable")


def require_target(props: dict, stored: bool = False) -> ssh.Target:
    """The SSH target of a resource's props; a connection the program could not resolve (its
    `unavailable` says why) is refused here. `stored`: the props are the state's (a delete), so
    messages say where its key comes from."""
    c = connection_of(props)
    if c.get("unavailable"):
        raise ssh.RemoteError(c["unavailable"])
    return ssh.Target.from_props(props, stored=stored)


def resource_id(props: dict, *parts: str) -> str:
    """A resource's id: its machine as the program declared it (the connection's host, and its
    port for "port"), then `parts`: `10.213.0.2:sglang-kimi-k2.6-tp8.service`."""
    c = connection_of(props)
    return ":".join([str(c.get("host")), *(str(c.get("port")) if p == "port" else p for p in parts)])


def stop_and_disable(t: ssh.Target, unit: str) -> None:
    """`systemctl disable --now` of one unit a delete takes away (its failure is not the delete's:
    a unit already gone answers non-zero)."""
    ssh.run(t, ["systemctl", "disable", "--now", unit], purpose=f"stopping {unit}", timeout=180, check=False)


def changed(olds: dict, news: dict, keys: list[str]) -> list[str]:
    """The `keys` whose value differs between the stored state and the declaration (a
    provider's diff lists exactly these to the engine)."""
    # A connection by where and how it connects: a label added to it is no change of the host.
    def value(state: dict, k: str) -> Any:
        return ssh.reach(state.get(k)) if k == "connection" else state.get(k)
    return [k for k in keys if value(olds, k) != value(news, k)]


def moved(olds: dict, news: dict) -> list[str]:
    """`["connection"]` when the new props reach another machine than the state's: a replace
    (created on the new machine, then deleted on the old one), never an update that would leave
    the old machine serving, enabled and forgotten by the stack."""
    return ["connection"] if ssh.another_machine(olds.get("connection"), news.get("connection")) else []
