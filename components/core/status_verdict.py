"""What `python -m components status` concludes from what it read, and the exit status that says
it, so that `status` can be a probe. Pure: the host documents of remote/status.py in, the
summary line and the exit status out (cases in tests/data/status-verdict/).

A probe asks in this order, and the first question answered "no" gives the exit status:
could every host be read, does something serve on each, is it ready (and in its router), is it
as declared."""
from __future__ import annotations

from typing import Any

EXIT_AS_DECLARED = 0   # every host read serves, ready (in its router when there is one), as declared
EXIT_DRIFT = 1         # the serving stack differs from its declaration: files, drop-ins, running server, boot state
EXIT_NOT_READ = 2      # bad settings, or a host that could not be read
EXIT_NOTHING_SERVES = 3  # a host serves nothing: its unit stopped, failed, or waiting for systemd's restart
EXIT_NOT_READY = 4     # a host serves but not ready (loading, unhealthy, another layout, a rank not joined),
#                        or its router does not route to it
# When several hold, the first of these is the exit status.
EXIT_ORDER = (EXIT_NOT_READ, EXIT_NOTHING_SERVES, EXIT_NOT_READY, EXIT_DRIFT)

READY = "ready"


def _deployed_here(host: dict[str, Any]) -> bool:
    """A unit of the stacks asked about is on the host (so it was deployed there at some time)."""
    return any(s.get("state", "not on this host") != "not on this host" for s in host.get("stacks", []))


def nothing_serves(host: dict[str, Any], *, asked_for_a_stack: bool) -> bool:
    """The host serves nothing, and that is a finding: the stack asked for (`--stack`) should serve
    there, or a stack of the project was deployed there. A rehearsal host that is not booted, or a
    host no stack was ever deployed to, is only a finding when a stack was asked for."""
    if host.get("error") or host.get("serving"):
        return False
    return asked_for_a_stack or (not host.get("down") and _deployed_here(host))


def not_ready(host: dict[str, Any]) -> list[str]:
    """Why a host that serves is not serving users: its readiness now, its router membership."""
    if host.get("error") or not host.get("serving"):
        return []
    out = []
    r = host.get("readiness") or {}
    if r.get("status") != READY:
        out.append(f"{r.get('status', 'unknown')}" + (f" ({r['reason']})" if r.get("reason") else ""))
    router = host.get("router") or {}
    if router.get("in_router") is False:
        out.append(router.get("text") or "not in the router")
    return out


def summarize(hosts: list[dict[str, Any]], *, asked_for_a_stack: bool) -> dict[str, Any]:
    """The project's answer: every host's document, the findings by kind, a one-line summary and
    the exit status (EXIT_ORDER)."""
    drift = [f"{h['host']}: {s['stack']}" for h in hosts for s in h.get("stacks", []) if s.get("serving") and s.get("drift")]
    unreachable = [h["host"] for h in hosts if h.get("error")]
    down = [h["host"] for h in hosts if h.get("down")]
    empty = [h["host"] for h in hosts if nothing_serves(h, asked_for_a_stack=asked_for_a_stack)]
    waiting = [f"{h['host']}: {'; '.join(why)}" for h in hosts for why in [not_ready(h)] if why]
    parts = []
    if empty:
        parts.append("nothing serves on " + ", ".join(empty))
    if waiting:
        parts.append("serving but not ready: " + ", ".join(waiting))
    if drift:
        parts.append("drift on the serving stack: " + ", ".join(drift))
    elif any(h.get("serving") for h in hosts):
        parts.append("the serving stack's files are as declared")
    if unreachable:
        parts.append("not read: " + ", ".join(unreachable))
    if down:
        parts.append("not booted (nothing serves there): " + ", ".join(down))
    found = {EXIT_NOT_READ: bool(unreachable), EXIT_NOTHING_SERVES: bool(empty), EXIT_NOT_READY: bool(waiting),
             EXIT_DRIFT: bool(drift)}
    code = next((c for c in EXIT_ORDER if found[c]), EXIT_AS_DECLARED)
    return {"hosts": hosts, "drift": bool(drift), "unreachable": unreachable, "down": down, "nothing_serves": empty,
            "not_ready": waiting, "summary": "; ".join(parts) or "nothing to read", "exit": code}
