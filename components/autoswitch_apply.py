"""`watch --apply`'s step of a tick (components/watch.py calls `step` after the traffic step):
for each serving group whose recommendation is a switch, the decision (core/autoswitch.py
`decide`: windows, dwell, the day's budget, drift and readiness open, the router, no outage) and,
with --apply, the switch itself: `pulumi up` of the recommended stack through the Automation API
(the `up` the watch hands in: components/watch.py `up_stack`), which rolls the fleet behind the
router one batch at a time. At most one switch a tick.

The decision log (`decisions.jsonl`, core/autoswitch_apply.py) lives beside status.json, under a
lock (`autoswitch.lock`, flock) held for the whole step: two watches sharing a state directory
(the systemd timer's and one run by hand) never decide or apply at once; the one that finds the
lock taken only recommends that tick. A switch's record is on disk before its `up` starts, so a
watch killed mid-roll still counts it against the dwell and the budget. Two watches with
different state directories share neither log nor lock; on the hosts, the switch's own host
lock (components/remote/host_lock.py) still runs one switch at a time per machine.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from .core import autoswitch
from .core import autoswitch_apply as AP
from .core import recommend as RC
from .core.config import AUTOSWITCH_KEY
from .core.errors import ConfigError
from .core.plan import check_stack
from .core.rules import NAMESPACE
from .core.stack_config import from_files
from .files import atomic_write

# `up(project_dir, stack, log)`: None when the stack is up, else the engine's failure in a few lines.
Up = Callable[[Path, str, Callable[[str], None]], Optional[str]]


@dataclass
class ApplyTick:
    section: dict = field(default_factory=dict)    # status.json's "autoswitch"
    changes: list = field(default_factory=list)    # the watch's change entries (already logged)
    prometheus: str = ""
    switched: Optional[tuple] = None               # (stack, hosts, when) of a switch this tick completed


@contextmanager
def held(path: Path) -> Iterator[bool]:
    """The lock, if no other process holds it (True), for as long as the block runs; closing the
    file gives it back, so a watch that dies never leaves it taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def read_log(path: Path) -> list[dict]:
    try:
        return AP.parse_log(path.read_text())
    except OSError:
        return []


def step(project_dir: Path, doc: dict, traffic, before: Optional[dict], state_dir: Path, *, apply: bool, up: Up,
         log: Callable[[str], None] = print, now: Optional[float] = None) -> ApplyTick:
    """The apply step of one tick. `doc`: the tick's document (drift, readiness per host);
    `traffic`: the traffic step's result (components/traffic_watch.py: its groups and their
    recommendations); `before`: the previous tick's status.json. Without `apply` the decisions
    go to status.json only (what would block a switch): no log, no lock, no line of its own
    (the watch's "recommended" line says the recommendation)."""
    now = time.time() if now is None else now
    path, lock = state_dir / AP.LOG_FILE, state_dir / AP.LOCK_FILE
    out = ApplyTick({"apply": apply, "log": str(path), "groups": []})
    if not apply:
        records = read_log(path)
        _decisions(project_dir, doc, traffic, records, out, apply=False, now=now, log=log)
    else:
        with held(lock) as mine:
            records = read_log(path)
            if not mine:
                out.section["lock"] = f"{lock} is held by another watch: this tick decided nothing"
                log(f"watch: autoswitch: {out.section['lock']}")
            else:
                _apply(project_dir, doc, traffic, before, path, records, out, up=up, now=now, log=log)
    out.section["recent"] = records[-5:]
    out.prometheus = AP.render_prometheus(out.section, records, now=now)
    return out


def _decisions(project_dir: Path, doc: dict, traffic, records: list[dict], out: ApplyTick, *, apply: bool, now: float,
               log: Callable[[str], None]) -> list[tuple[dict, RC.Recommendation, autoswitch.Decision]]:
    """Each group's decision on its recommended switch, kept in status.json's section."""
    found = []
    for group in traffic.doc.get("groups", []):
        rec = traffic.recommendations.get(group["stack"])
        if rec is None or rec.action != RC.SWITCH:
            continue
        decision = _decide(project_dir, doc, group, rec, records, apply=apply, now=now, log=log)
        if decision is None:
            continue  # a stack's settings cannot be read (logged)
        out.section["groups"].append({"stack": group["stack"], "to": rec.recommended, "decision": decision.as_dict(),
                                      "key": AP.decision_key(decision, rec.recommended)})
        found.append((group, rec, decision))
    return found


def _apply(project_dir: Path, doc: dict, traffic, before: Optional[dict], path: Path, records: list[dict],
           out: ApplyTick, *, up: Up, now: float, log: Callable[[str], None]) -> None:
    """Under the lock: outcomes measured, decisions logged when new, at most one switch performed."""
    def say(kind: str, record: dict, line: str) -> None:
        log(f"watch: {line}")
        out.changes.append(AP.change(kind, record, line) | {"logged": True})

    changed = False
    for i, record in enumerate(records):
        done = AP.measured(record, traffic.doc, now=now)
        if done is not None:
            records[i] = done
            changed = True
            say("measured", done, AP.measured_line(done))
    previous = {g["stack"]: g for g in ((before or {}).get("autoswitch") or {}).get("groups", [])}
    switched = False
    for group, rec, decision in _decisions(project_dir, doc, traffic, records, out, apply=True, now=now, log=log):
        if decision.apply and switched:
            continue  # one switch a tick: the next tick decides again, on what this one changed
        if AP.decision_key(decision, rec.recommended) == (previous.get(group["stack"]) or {}).get("key") \
                and not decision.apply:
            continue  # the same decision as the last tick: logged then
        record = autoswitch.log_record(rec, decision, now=now) | {"observed": AP.observed(group)}
        records.append(record)
        changed = True
        say("decided", record, AP.decided_line(record))
        if decision.apply:
            switched = True
            record["switch"] = {"started": now}
            atomic_write(path, AP.render_log(records))  # counted even if the watch dies mid-roll
            error = up(project_dir, rec.recommended, log)
            record["switch"].update({"finished": time.time(), "ok": error is None, "error": error})
            say("finished", record, AP.finished_line(record))
            if error is None:
                out.switched = (rec.recommended, list(group["hosts"]), record["switch"]["finished"])
    if changed:
        atomic_write(path, AP.render_log(records))


def _decide(project_dir: Path, doc: dict, group: dict, rec: RC.Recommendation, records: list[dict], *, apply: bool,
            now: float, log: Callable[[str], None]) -> Optional[autoswitch.Decision]:
    """The decision for one group's recommended switch; None when a stack's settings cannot be read."""
    try:
        current = check_stack(group["stack"], from_files(project_dir, group["stack"]), project_dir).settings
        target = check_stack(rec.recommended, from_files(project_dir, rec.recommended), project_dir).settings
        settings = autoswitch.parse(from_files(project_dir, group["stack"]).values.get(f"{NAMESPACE}:{AUTOSWITCH_KEY}"))
    except ConfigError as exc:
        log(f"watch: autoswitch: {group['stack']} -> {rec.recommended} not decided: {exc}")
        return None
    drift, failed = AP.open_on(doc, [group["stack"], rec.recommended])
    behind, outage = AP.rolls(current, target)
    decision = autoswitch.decide(rec, settings, now=now, behind_router=behind, drift=drift, failed_readiness=failed,
                                 switches=AP.switch_starts(records), last_switch_at=AP.last_switch_at(records),
                                 outage=outage)
    return decision if apply else AP.without_apply(decision)
