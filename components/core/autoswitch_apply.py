"""`watch --apply`, pure: what a tick's apply step reads and writes (components/autoswitch_apply.py
does the I/O: the lock, the log file, the `pulumi up`). Cases tests/data/autoswitch/apply/.

- What is open on the stacks a switch involves, from the tick's document (core/watch.py): drift
  (a host whose resources differ from the declaration, or that could not be checked) and failed
  readiness (a host serving but not ready, or serving but out of the router): each blocks.
- Whether the switch rolls: both stacks behind the same router (the roll keeps serving, 0
  failed requests), and no prefill/decode stack involved (its switch stops the pair at once).
- The decision log: one JSON record a line in `decisions.jsonl` beside status.json (the newest
  KEEP_RECORDS kept), written when a group's decision changes (not every tick), and when a switch
  starts, finishes, and is measured: why, the checks, the expected figures (core/autoswitch.py
  `log_record`), what the watch observed before, the switch's start, end and result, then the
  measured outcome, once a full tick of the new stack is observed after the switch ended.
- The dwell and the day's budget are read from the log's applied switches (a failed one counts:
  no retry loop); the change lines the watch logs and posts; its Prometheus lines.
"""
from __future__ import annotations

import json
from dataclasses import replace
from statistics import median
from typing import TYPE_CHECKING, Any, Optional

from . import autoswitch
from .autoswitch import Check, Decision

if TYPE_CHECKING:
    from .config import RouterSettings, StackSettings

LOG_FILE = "decisions.jsonl"
LOCK_FILE = "autoswitch.lock"
KEEP_RECORDS = 500   # about a year of daily switches and their blocked recommendations


# --- the log ---------------------------------------------------------------------------------

def parse_log(text: str) -> list[dict[str, Any]]:
    """The records (oldest first); a line that is not a record (a torn write) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("at"), (int, float)):
            out.append(doc)
    return out


def render_log(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records[-KEEP_RECORDS:])


def switch_starts(records: list[dict[str, Any]]) -> list[float]:
    """When each applied switch started, failed ones included: they count against the day's
    budget and start the dwell as well (a failing switch is not retried every tick)."""
    return [float(r["switch"]["started"]) for r in records if r.get("applied") and r.get("switch")]


def last_switch_at(records: list[dict[str, Any]]) -> Optional[float]:
    starts = switch_starts(records)
    return max(starts) if starts else None


def decision_key(decision: Decision, target: str) -> list[Any]:
    """What makes a decision new for the log: its target, whether it applies, the checks that failed."""
    return [target, decision.apply, sorted(c.name for c in decision.checks if not c.ok)]


# --- what blocks a switch ----------------------------------------------------------------------

def _who(h: dict[str, Any]) -> str:
    return str(h.get("entry") or h.get("host"))


def open_on(doc: dict[str, Any], stacks: list[str]) -> tuple[list[str], list[str]]:
    """(drift, failed readiness) open on `stacks` in the tick's document. A host that could not
    be checked counts as drift (nothing is known of it), and so does a stack the watch does not
    preview; a host serving but out of the router, as failed readiness (an interrupted roll: users
    do not reach it)."""
    drift: list[str] = []
    failed: list[str] = []
    watched = {s["stack"] for s in doc.get("stacks", [])}
    drift += [f"stack {name} is not watched (add it to --stacks): its drift is not known" for name in stacks
              if name not in watched]
    for s in doc.get("stacks", []):
        if s["stack"] not in stacks:
            continue
        if s.get("error"):
            drift.append(f"stack {s['stack']} not checked: {s['error']}")
        for h in s.get("hosts", []):
            if h.get("error"):
                drift.append(f"{_who(h)}: not checked ({h['error']})")
                continue
            if h.get("drifted"):
                names = ", ".join(dict.fromkeys(str(i.get("resource")) for i in h["drifted"]))
                drift.append(f"{_who(h)}: stack {s['stack']}: {names} differ from the declaration")
            if h.get("serving_here") and h.get("ready") is False:
                failed.append(f"{_who(h)}: stack {s['stack']}: readiness {h.get('readiness') or 'unknown'}")
            if h.get("serving_here") and (h.get("router") or {}).get("in_router") is False:
                failed.append(f"{_who(h)}: stack {s['stack']} serves, out of the router")
    return list(dict.fromkeys(drift)), list(dict.fromkeys(failed))


def _router_place(r: RouterSettings) -> tuple[Any, ...]:
    return (r.runs_on, r.host.machine if r.host is not None else None, r.port, r.unit_name)


def rolls(current: StackSettings, target: StackSettings) -> tuple[bool, Optional[str]]:
    """(behind the router: both stacks behind the same one, so the switch rolls host by host;
    the outage a prefill/decode stack would cause, or None)."""
    behind = (current.router is not None and target.router is not None
              and _router_place(current.router) == _router_place(target.router))
    pd = [s.stack for s in (current, target) if s.disaggregation is not None]
    outage = None
    if pd:
        outage = (f"{', '.join(pd)} {'is a prefill/decode stack' if len(pd) == 1 else 'are prefill/decode stacks'}: "
                  "its switch stops the pair at once (an outage, docs/pd.md), never applied by the watch")
    return behind, outage


def without_apply(decision: Decision) -> Decision:
    """The decision of a watch run without --apply: every check as it went, and `apply` failed."""
    checks = decision.checks + (Check("apply", False, "watch runs without --apply: it only recommends"),)
    failed = [c for c in checks if not c.ok]
    return replace(decision, apply=False, checks=checks, why="recommend only: " + "; ".join(c.detail for c in failed))


# --- the records -------------------------------------------------------------------------------

def observed(group: dict[str, Any]) -> dict[str, Any]:
    """What the watch saw of the serving stack when it decided: the window's figures."""
    summary = group.get("summary") or {}
    return {"concurrency": summary.get("concurrency"), "output_tok_s": summary.get("output_tok_s"),
            "ticks": summary.get("ticks"), "hosts": list(group.get("hosts") or [])}


def _median(values: list[float]) -> Optional[float]:
    return median(values) if values else None


def measured(record: dict[str, Any], traffic: dict[str, Any], *, now: float) -> Optional[dict[str, Any]]:
    """The record with its outcome, once the new stack's window holds a tick wholly after the
    switch ended with generated tokens counted; None when not yet (or nothing to measure)."""
    switch = record.get("switch") or {}
    if not record.get("applied") or not switch.get("ok") or record.get("outcome") is not None:
        return None
    finished = float(switch.get("finished") or 0)
    group = next((g for g in traffic.get("groups", []) if g.get("stack") == record.get("to")), None)
    if group is None:
        return None
    after = [o for o in group.get("window") or []
             if o.get("output_tok_s") is not None and o.get("at", 0) - (o.get("seconds") or 0) >= finished]
    if not after:
        return None
    tok_s = _median([float(o["output_tok_s"]) for o in after])
    concurrency = _median([float(o["concurrency"]) for o in after if o.get("concurrency") is not None])
    before = record.get("observed") or {}
    out = autoswitch.with_outcome(record, measured_tok_s=tok_s, measured_before=before.get("output_tok_s"), at=now)
    out["outcome"].update({"ticks": len(after), "concurrency_before": before.get("concurrency"),
                           "concurrency_after": concurrency})
    return out


# --- the words ---------------------------------------------------------------------------------

def _tok(v: Any) -> str:
    return "?" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")


def expected_words(record: dict[str, Any]) -> str:
    e = record.get("expected") or {}
    before, after = e.get("tok_s_before"), e.get("tok_s_after")
    gain = f", {100 * (after / before - 1):+.0f} %" if before and after else ""
    return f"expected {_tok(before)} -> {_tok(after)} output tok/s{gain} ({e.get('basis') or 'no basis'})"


def change(kind: str, record: dict[str, Any], line: str) -> dict[str, Any]:
    """A change entry in the watch's shape (core/watch.py `changes`)."""
    return {"kind": "autoswitch", "event": kind, "stack": record.get("from"), "stacks": [record.get("from")],
            "host": ",".join((record.get("observed") or {}).get("hosts") or []), "line": line}


def decided_line(record: dict[str, Any]) -> str:
    head = f"autoswitch: {record['from']} -> {record['to']}"
    if record.get("applied"):
        return f"{head}: applying ({record['why'].removeprefix('apply: ')}); {expected_words(record)}"
    return f"{head} recommended, not applied: {record['why'].removeprefix('recommend only: ')}"


def finished_line(record: dict[str, Any]) -> str:
    switch = record.get("switch") or {}
    head = f"autoswitch: {record['from']} -> {record['to']}"
    took = float(switch.get("finished") or 0) - float(switch.get("started") or 0)
    if switch.get("ok"):
        return f"{head}: switched in {took / 60:.1f} min through `pulumi up` (the roll behind the router)"
    return f"{head}: the switch failed after {took / 60:.1f} min: {switch.get('error')}"


def measured_line(record: dict[str, Any]) -> str:
    o = record.get("outcome") or {}
    gain = f" ({o['gain_percent']:+.0f} %)" if o.get("gain_percent") is not None else ""
    share = f", {o['of_expected_percent']:.0f} % of the expected {_tok(record['expected'].get('tok_s_after'))}" \
        if o.get("of_expected_percent") is not None else ""
    return (f"autoswitch: {record['from']} -> {record['to']} measured {_tok(o.get('tok_s_before'))} -> "
            f"{_tok(o.get('tok_s_after'))} output tok/s{gain}{share}, at {_tok(o.get('concurrency_after'))} requests "
            f"in flight (before: {_tok(o.get('concurrency_before'))})")


# --- status.json and Prometheus --------------------------------------------------------------------

def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(section: dict[str, Any], records: list[dict[str, Any]], *, now: float) -> str:
    """The apply step's gauges, beside the watch's own metrics."""
    lines = ["# HELP gpu_serving_autoswitch_apply 1 when the watch runs with --apply",
             "# TYPE gpu_serving_autoswitch_apply gauge",
             f"gpu_serving_autoswitch_apply {int(bool(section.get('apply')))}",
             "# HELP gpu_serving_autoswitch_switches_last_24h Switches the watch started in the last 24 h (its budget "
             "counts them), by result",
             "# TYPE gpu_serving_autoswitch_switches_last_24h gauge"]
    recent = [r for r in records if r.get("applied") and r.get("switch") and now - float(r["switch"]["started"]) < autoswitch.DAY]
    for result in ("ok", "failed", "running"):
        count = sum(1 for r in recent if _result(r) == result)
        lines.append(f'gpu_serving_autoswitch_switches_last_24h{{result="{result}"}} {count}')
    last = last_switch_at(records)
    if last is not None:
        lines += ["# HELP gpu_serving_autoswitch_last_switch_timestamp_seconds When the last switch started (Unix time)",
                  "# TYPE gpu_serving_autoswitch_last_switch_timestamp_seconds gauge",
                  f"gpu_serving_autoswitch_last_switch_timestamp_seconds {last:.3f}"]
    lines += ["# HELP gpu_serving_autoswitch_blocked 1 for each check that keeps a recommended switch from being applied",
              "# TYPE gpu_serving_autoswitch_blocked gauge"]
    for g in section.get("groups", []):
        for c in (g.get("decision") or {}).get("checks", []):
            if not c["ok"]:
                lines.append(f'gpu_serving_autoswitch_blocked{{stack="{_label(g["stack"])}",to="{_label(g["to"])}",'
                             f'check="{_label(c["name"])}"}} 1')
    return "\n".join(lines) + "\n"


def _result(record: dict[str, Any]) -> str:
    switch = record.get("switch") or {}
    if "ok" not in switch:
        return "running"
    return "ok" if switch["ok"] else "failed"
