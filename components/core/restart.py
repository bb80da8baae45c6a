"""What a preview says before an `up` restarts the model that serves (issue 36.3): the unit, the
host, that it will RESTART (a model reload: for a 590 GB checkpoint a long outage), and why, with
each difference. Pure (the stored state and the declaration in, the line out; cases in
tests/data/restart/); the service's check prints it, beside the switch block (status.py).

An update restarts a serving unit for two reasons (switch.why_restart): its declaration changed
(the argv, the environment, a secret, the layout), or its process was started from other settings
than declared (a hand edit and restart, since repaired on disk: `runningServer` says how). Both
are said here; a unit that does not serve (a switch, a start) is the switch block's to say.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .changes import argv_of, environment_changes, flag_changes
from .readiness import AS_DECLARED, NOT_RUNNING, running_reason
from .status import is_superseded
from .switch import runs_an_edit, why_restart

# The words of the line after the label (tests and README quote them).
WILL_RESTART = "will RESTART (model reload)"
STARTED_OTHERWISE = "the running server was started from other settings"
DECLARATION_CHANGED = "its declaration changed"
# `runningServer` of a process that runs other settings: this prefix, then the differences.
_RUNNING_PREFIX = running_reason([])
# Past this many differences the line names how many more (all of them: `python -m components plan`).
MAX_SHOWN = 10


def secret_changes(before: Optional[dict[str, Any]], after: Optional[dict[str, Any]]) -> list[str]:
    """The secret variables whose value changed, by name only (never a value)."""
    before, after = dict(before or {}), dict(after or {})
    return [f"{key} (a secret) changed" for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def declaration_changes(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """What the new declaration changes in what the server runs with, from the stored state (what
    the running process was started from, when it runs as declared) to the new props."""
    changes = flag_changes(argv_of(olds.get("execStart")), argv_of(news.get("execStart")))
    changes += environment_changes(dict(olds.get("environment") or {}), dict(news.get("environment") or {}))
    changes += secret_changes(olds.get("secretEnvironment"), news.get("secretEnvironment"))
    if not changes and olds.get("declared") != news.get("declared"):
        changes.append("the declared layout")
    return changes


def _shown(items: list[str]) -> str:
    if len(items) <= MAX_SHOWN:
        return "; ".join(items)
    return "; ".join(items[:MAX_SHOWN]) + f"; and {len(items) - MAX_SHOWN} more"


def restart_notice(olds: Optional[dict[str, Any]], news: dict[str, Any], *, label: str, host: str,
                   running_now: Callable[[], str] = lambda: AS_DECLARED) -> Optional[str]:
    """`<label>: <unit> on <host> will RESTART (model reload): <why>: <the differences>`, or None
    when the update restarts nothing that serves (nothing stored yet, declared stopped, not
    running, superseded by another strategy: those start rather than restart, and the switch
    block says so; or nothing that the server runs with changes). `olds`: the stored outputs as
    the refresh read them; `news`: the declared inputs; `running_now`: what the process runs, for a
    state written by an earlier version (switch.why_restart)."""
    if not olds or news.get("active", True) is False or olds.get("active", True) is False:
        return None
    running = olds.get("runningServer", AS_DECLARED)
    if running == NOT_RUNNING or is_superseded(running):
        return None
    if why_restart(olds, news, running_now) is None:
        return None
    reasons = []
    declared_changed = olds.get("configHash") != news.get("configHash") or olds.get("declared") != news.get("declared")
    # A state of an earlier version has no execStart to compare with: said without the details.
    changed = declaration_changes(olds, news) if declared_changed and "execStart" in olds else []
    if changed:
        reasons.append(f"{DECLARATION_CHANGED}: {_shown(changed)}")
    if runs_an_edit(olds):
        differences = running[len(_RUNNING_PREFIX):] if running.startswith(_RUNNING_PREFIX) else running
        reasons.append(f"{STARTED_OTHERWISE}: {differences}")
    if not reasons:
        reasons.append(f"{DECLARATION_CHANGED} (what the server runs with)")
    return f"{label}: {news.get('unit')} on {host} {WILL_RESTART}: " + "; and ".join(reasons)
