"""A switch that would stop a server another fleet's router sends requests to is refused, in the
preview as in the update, before anything stops (ServiceProvider.check calls `refuse`). The
decision is core/roll.py's (`stops_a_routed_server`); the host's answer is the switch preview's
own read (status.SERVING_SCRIPT: each unit's X-GpuServing-RoutedBy), so it costs no round trip."""
from __future__ import annotations

from ..core import reads
from ..core import roll as roll_plan
from ..core import status as S
from ..core.switch import switch_planned
from . import ssh


class RoutedElsewhere(ssh.RemoteError):
    """The refusal; shown as its message alone, like every RemoteError."""


def refuse(olds: dict, news: dict) -> None:
    """Raise RoutedElsewhere when the switch `news` declares would stop a server routed by a router
    this stack does not declare. Nothing when no switch is planned, or the host cannot be read
    (the switch reads it itself, and says why it cannot)."""
    connection = news.get("connection")
    if not isinstance(connection, dict) or connection.get("unavailable") or not switch_planned(olds or None, news):
        return
    t = ssh.Target.from_props(news)
    try:
        host = S.parse_serving(ssh.fetch(t, reads.serving(with_environ=True)).stdout)
    except ssh.RemoteError:
        return
    router = news.get("router")
    own = str(router.get("routedBy") or "") if isinstance(router, dict) else ""
    who = f"hosts[{news['hostEntry']}]: " if news.get("hostEntry") else ""
    message = roll_plan.stops_a_routed_server(host.serving, str(news.get("unit")), own, who=who, where=t.host)
    if message:
        raise RoutedElsewhere(message)
