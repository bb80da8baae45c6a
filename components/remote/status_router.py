"""`status` and the drift watch: whether the fleet's router routes to each host now, read on the
router's own host with the key it keeps there (core/router.py: the script and the words). An
interrupted roll can leave a ready host out of the router; its own readiness does not show that."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..core import reads
from ..core import router as R
from . import ssh


def _router_url(conn: dict, settings) -> str:
    r = settings.router
    return R.worker_url(conn["host"] if r.bind in ("0.0.0.0", "::") else r.bind, r.port)


def read_workers(conn: dict, settings) -> tuple[Optional[list[R.Worker]], str]:
    """The router's GET /workers (None and why, when it cannot be read)."""
    r = settings.router
    t = ssh.Target.from_props({"connection": conn})
    request = reads.command(["sh", "-c", R.WORKERS_ON_HOST_SCRIPT, "sh", R.environment_path(settings),
                             R.local_url(r.bind, r.port) + "/workers", f"{r.venv_path}/bin/python", R.HTTP_SCRIPT],
                            purpose="reading the router's workers", timeout=60, check=False)
    try:
        status, body = R.parse_http(ssh.fetch(t, request).stdout)
        if status != 200:
            return None, f"GET /workers answered HTTP {status}: {body.strip()[:200]}"
        return R.parse_workers(body), ""
    except (ssh.RemoteError, ValueError) as exc:
        return None, str(exc)


def add_memberships(routers: dict[tuple, dict[str, Any]], conn_of: Callable[[str], Optional[dict]], docs: dict[str, dict]) -> None:
    """Each host doc of a fleet behind a router gets `router` (core.router.membership). `routers`:
    by router, {settings (a stack's that declares it), conn (its machine's connection, or None:
    the fleet entry runsOn names), runs_on, members: [(machine, port)]}; `conn_of(machine)`: a
    host's connection (None: not read); `docs`: the host documents by machine."""
    for router in routers.values():
        conn = router["conn"] or (conn_of(router["runs_on"]) if router["runs_on"] else None)
        if conn is None:
            continue  # its machine was not read: that host's own entry says why
        workers, error = read_workers(conn, router["settings"])
        where = _router_url(conn, router["settings"])
        for machine, port in router["members"]:
            member, doc = conn_of(machine), docs.get(machine)
            if member is None or doc is None or doc.get("error") or doc.get("down"):
                continue
            doc["router"] = R.membership(R.worker_url(member["host"], port), workers, where, error)
