"""What the strategy service's check says before a change that stops or reloads the model: the
switch block (what serves now on the host and stops, status.switch_block), the restart line
(the serving model reloads, restart.restart_notice, issue 36.3), and the failure ledger's warning
when the start would repeat one that failed before (ledger_store.warnings_before_start: the words
`plan` and `advise` say too). The engine calls a resource's
check in a preview and again in the update; both are said once a command (issue 36.18: in the
preview of a `pulumi up`, or in its update when it skipped the preview: cli.py decides).
"""
from __future__ import annotations

from ..core import readiness as R
from ..core import reads
from ..core import status as S
from ..core.changes import argv_of
from ..core.restart import restart_notice
from . import cli, ledger_store, ssh
from ..core.specs import ServiceSpec
from .common import progress


def secrets_of(props: dict) -> list[str]:
    return ServiceSpec.from_props(props).secrets


def before_change(olds: dict, news: dict) -> None:
    """Print the restart line when the update reloads the model that serves, and the switch block
    when another strategy serves and stops; nothing for a serving unit whose update starts nothing
    (its olds say it serves as declared and nothing it runs with changes), and nothing in the update
    of a `pulumi up` whose preview said it."""
    if not cli.provider_says_preview_things():
        return
    entry = news.get("hostEntry")
    label = f"hosts[{entry}] switch" if entry else "switch"
    try:
        if not news.get("active", True) or not isinstance(news.get("execStart"), (list, str)):
            return
        connection = news.get("connection")
        if not isinstance(connection, dict) or connection.get("unavailable"):
            return
        t = ssh.Target.from_props(news)
        restart = restart_notice(olds, news, label=f"hosts[{entry}] restart" if entry else "restart", host=t.label)
        if restart:
            progress(ssh.redact(restart, secrets_of(news)))
        serves = bool(olds) and olds.get("active", True) and olds.get("runningServer", R.AS_DECLARED) == R.AS_DECLARED
        if restart or not serves:
            # A start is coming: the team's failures it would repeat (the ledger read once a process).
            for line in ledger_store.warnings_before_start(argv_of(news["execStart"]), once=True):
                progress(ssh.redact(f"{label}: warning: {line}", secrets_of(news)))
        if serves:
            return  # it serves: a restart at most (said above), no other strategy to stop
        host = S.parse_serving(ssh.fetch(t, reads.serving(with_environ=True)).stdout)
        lines = S.switch_block(label=label, target_unit=news["unit"], target_stack=str(news.get("stack") or news["unit"]),
                               declared_argv=argv_of(news["execStart"]), declared_environment=news.get("environment") or {},
                               secret_keys=list(news.get("secretEnvironment") or {}), host=host,
                               ignore_variables=R.SYSTEMD_VARIABLES)
        if lines:
            progress("\n".join(lines))
    except Exception as exc:  # noqa: BLE001 - the preview goes on; the switch reads the host itself
        progress(f"{label}: could not read what serves now on the host ({type(exc).__name__}: "
                 f"{ssh.redact(str(exc), secrets_of(news))[:200]})")
