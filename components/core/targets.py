"""The machines a stack touches that are not rehearsal hosts (issue 36.4): `scripts/deploy`
switches a rehearsal stack at once, as the README's main job, but shows the preview and asks (or
refuses without `--yes`) before it changes a real machine. Pure: the settings in, the machines
named as the stack names them out; `python -m components real-hosts --stack NAME` prints them."""
from __future__ import annotations

from .config import HostSettings, StackSettings


def _where(host: HostSettings) -> str:
    return f"{host.user}@{host.address}:{host.port}"


def real_machines(settings: StackSettings) -> list[str]:
    """Each machine of the stack with an address (a real host), in the stack's words: `host
    (root@gpu-box-1:22)`, `hosts[gpu2] (root@10.0.0.12:22)`, `router.host (...)`; [] when every
    machine is a rehearsal host."""
    out = []
    for entry, s in settings.per_host():
        if not s.host.is_rehearsal:
            out.append(f"hosts[{entry}] ({_where(s.host)})" if entry else f"host ({_where(s.host)})")
    router = settings.router
    if router is not None and router.host is not None and not router.host.is_rehearsal:
        out.append(f"router.host ({_where(router.host)})")
    return out
