"""What a roll needs to know before its first batch, read in the provider process when the program
asks (remote/ahead.py answers the READ_FLEET invoke; components/roll_check.py asks): each declared
host's reachability and what serves there (status.SERVING_SCRIPT, the read the switch preview
makes next, so it is served from the same answer), the router's worker list, and each server's
/health asked from the router's machine. Reads only; the decisions are components/core/roll.py's.

The answer holds no secret: words, URLs, unit names and booleans (the environments read to compare
with the declaration never leave this process).
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import asdict
from typing import Any

from ..core import reads
from ..core import roll as roll_plan
from . import ssh
from .router import RouterAdmin

# The probes' own bound is 3 s a server, all at once (roll.PROBE_SCRIPT); this bounds the command.
PROBE_TIMEOUT = 30


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400] or type(exc).__name__


def read_host(spec: dict) -> roll_plan.HostNow:
    """spec: name, url, connection, unit, execStart (argv), environment, secretKeys."""
    try:
        t = ssh.Target.from_props({"connection": spec["connection"]})
        text = ssh.fetch(t, reads.serving(with_environ=True)).stdout
        error = ""
    except ssh.RemoteError as exc:
        text, error = None, _one_line(exc).removeprefix(f"hosts[{spec['name']}]: ")
    return roll_plan.host_now(spec["name"], spec["url"], text, unit=spec["unit"], declared_argv=list(spec["execStart"]),
                              declared_environment=dict(spec.get("environment") or {}),
                              secret_keys=list(spec.get("secretKeys") or []), error=error)


def read_router(spec: dict, urls: list[str]) -> roll_plan.RouterNow:
    """spec: the router's admin props (connection, bind, port, venvPath, adminKey)."""
    admin = RouterAdmin(spec)
    try:
        workers, error = admin.workers(), ""
    except ssh.Unreachable as exc:
        return roll_plan.router_now(None, {}, machine_error=_one_line(exc))
    except (ssh.RemoteError, ValueError) as exc:
        # Not running yet (a first deploy installs it), or stopped: the run (re)starts it first.
        workers, error = None, _one_line(exc)
    every = list(dict.fromkeys([*urls, *(w.url for w in workers or [])]))
    try:
        res = ssh.run(admin.t, ["python3", "-c", roll_plan.PROBE_SCRIPT, *every], purpose="asking each server's /health",
                      timeout=PROBE_TIMEOUT, check=False, read=True)
        health = roll_plan.parse_probe(res.stdout) if res.rc == 0 else {}
    except ssh.RemoteError:
        health = {}
    return roll_plan.router_now(workers, health, error=error)


def read_fleet(doc: dict) -> dict[str, Any]:
    """doc: {"hosts": [spec...], "router": admin props}. Every host at once, and the router."""
    hosts = list(doc.get("hosts") or [])
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts)) + 1, thread_name_prefix="gpu-serving-fleet") as pool:
        router = pool.submit(read_router, doc["router"], [h["url"] for h in hosts])
        states = list(pool.map(read_host, hosts))
        seen = router.result()
    return {"hosts": [asdict(s) for s in states], "router": seen.as_dict()}
