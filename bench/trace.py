"""Where a `pulumi` command's time goes, from the engine's own log (`pulumi ... -v=9 --logtostderr
--logflow`: one JSON object a line, each with its time to the nanosecond). Pure: parses text, so
tests/test_bench_trace.py checks it with a recorded log (tests/data/bench/).

A command runs the program once (preview, drift check) or twice (`up`: the preview, then the
update). For each program run the log shows, in this order:

  "*** Starting Update(preview=...) ***"       the engine begins the run
  "langhost[python].Run(... executing"         the language host is asked to run the program
  "registering resource: ty=pulumi:pulumi:Stack"  the SDK is up (its imports, the stack
       resource prepared); the program's __main__ starts
  "Waiting for outstanding RPCs to complete"   the program's __main__ has returned: its imports,
       its settings check, its resources declared (the SDK sends them, and awaits their outputs,
       from here on)
  "Launching plugin 'pulumi-python (resource)'" .. "Provider[...].GetPluginInfo() executing"
       the dynamic-provider process starts and answers
  "Provider[...].Read(" executing .. success    the refresh reads of the hosts
  "run_pulumi_func completed" .. "langhost[python].Run(... success"   the program's exit
  "*** Update(preview=...) complete ***"

The phases below are intervals between those events; whatever is not in one of them (the CLI's
start, the engine's steps, the state's writes, waiting on the hosts' changes) is "engine".
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Iterable, Optional

PHASES = ("sdk", "program", "provider", "reads", "exit")
# What each phase is called in the tables.
PHASE_TITLES = {
    "sdk": "SDK start (Run -> the stack resource)",
    "program": "the program's __main__",
    "provider": "provider process start",
    "reads": "host reads (first read -> last)",
    "exit": "program exit",
    "engine": "engine and CLI (the rest)",
}

_READ = re.compile(r"^Provider\[[^\]]+\]\.Read\(")
# The switch itself: the service resource's create or update (its type in the URN).
_SERVICE_STEP = re.compile(r"^Provider\[[^\]]+\]\.(Update|Create)\([^)]*:SystemdService::")

# A traced switch (`switch_phases`), one `pulumi up` that starts the declared strategy on every
# host: its parts in the order they happen.
SWITCH_PHASES = ("preview", "to_first_read", "to_service", "service", "rest")
SWITCH_PHASE_TITLES = {
    "preview": "the preview",
    "to_first_read": "... of which the program's start to its first host read",
    "to_service": "the update, to the first service step",
    "service": "the service steps (first start to last end)",
    "rest": "the update after them",
    "cli": "the CLI before and after",
}


def _time(text: str) -> float:
    """Seconds since the epoch of the log's RFC 3339 time (nanoseconds cut to microseconds)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        raise ValueError(f"not a log time: {text!r}")
    frac = (m.group(2) or "0")[:6].ljust(6, "0")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{frac}{zone}").timestamp()


def events(lines: Iterable[str]) -> list[tuple[float, str]]:
    """(time, message) of every JSON log line; other lines (the CLI's own output) are skipped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "time" in d and "msg" in d:
            out.append((_time(d["time"]), str(d["msg"])))
    return out


def _span(first: Optional[float], last: Optional[float]) -> float:
    return max(0.0, last - first) if first is not None and last is not None else 0.0


def program_runs(evts: list[tuple[float, str]]) -> list[dict]:
    """One dict a program run: {"preview": bool, "seconds": run length, phase: seconds}."""
    runs: list[dict] = []
    cur: Optional[dict] = None
    for t, msg in evts:
        if msg.startswith("*** Starting Update("):
            cur = {"preview": "preview=true" in msg, "start": t, "marks": {}, "reads": {}}
            continue
        if cur is None:
            continue
        marks = cur["marks"]
        if msg.startswith("langhost[python].Run("):
            marks.setdefault("run" if msg.endswith("executing") else "run_done", t)
        elif msg.startswith("registering resource: ty=pulumi:pulumi:Stack,"):
            marks.setdefault("stack", t)
        elif msg.startswith("Waiting for outstanding RPCs to complete"):
            marks.setdefault("main_done", t)
        elif msg.startswith("newPlugin(): Launching plugin") and "(resource)" in msg:
            marks.setdefault("provider_launch", t)
        elif msg.startswith("Provider[") and ".GetPluginInfo() executing" in msg:
            marks.setdefault("provider_ready", t)
        elif _READ.match(msg):
            if msg.endswith("executing") or " executing (" in msg:
                cur["reads"].setdefault("first", t)
            elif " success" in msg or " failed" in msg:
                cur["reads"]["last"] = t
        elif msg.startswith("run_pulumi_func completed"):
            marks.setdefault("program_done", t)
        elif msg.startswith("*** Update(") and msg.endswith("complete ***"):
            m = marks
            run = {"preview": cur["preview"], "seconds": t - cur["start"],
                   "sdk": _span(m.get("run"), m.get("stack")),
                   "program": _span(m.get("stack"), m.get("main_done")),
                   "provider": _span(m.get("provider_launch"), m.get("provider_ready")),
                   "reads": _span(cur["reads"].get("first"), cur["reads"].get("last")),
                   "exit": _span(m.get("program_done"), m.get("run_done"))}
            runs.append(run)
            cur = None
    return runs


def split(lines: Iterable[str], started: float, ended: float) -> dict:
    """The phases of one command, summed over its program runs, in seconds: the command ran
    from `started` to `ended` (epoch seconds, the caller's clock); "engine" is the rest."""
    runs = program_runs(events(lines))
    out = {"total": ended - started, "program_runs": len(runs)}
    for phase in PHASES:
        out[phase] = sum(r[phase] for r in runs)
    out["engine"] = out["total"] - sum(out[p] for p in PHASES)
    return out


def switch_phases(lines: Iterable[str], started: float, ended: float) -> dict:
    """The parts of one traced `pulumi up` that switches (bench/runner.py: gpu-serving's switch,
    traced), in seconds: the preview (and in it the program's start to its first host read), the
    update to its first service step, the service steps of every host (the first one's start to
    the last one's end: stop, start, the server's start, the settle, the report), the update after
    them, and the CLI's own time before and after. `hosts`: how many service steps there were.
    Raises ValueError for a log with no service step (nothing was switched)."""
    marks: dict[str, float] = {}
    services: set[str] = set()
    preview: Optional[bool] = None
    for t, msg in events(lines):
        if msg.startswith("*** Starting Update("):
            preview = "preview=true" in msg
            marks.setdefault("preview_start" if preview else "update_start", t)
        elif msg.startswith("*** Update(") and msg.endswith("complete ***"):
            marks.setdefault("preview_end" if preview else "update_end", t)
        elif preview is True and msg.startswith("langhost[python].Run(") and msg.endswith("executing"):
            marks.setdefault("program_start", t)
        elif preview is True and _READ.match(msg) and " executing" in msg:
            marks.setdefault("first_read", t)
        elif preview is False and _SERVICE_STEP.match(msg):
            if " executing" in msg:
                marks.setdefault("service_start", t)
                services.add(msg.split("::")[-1].split(")")[0])
            elif " success" in msg or " failed" in msg:
                marks["service_end"] = t
    need = ("preview_start", "preview_end", "update_start", "update_end", "service_start", "service_end")
    if any(k not in marks for k in need):
        raise ValueError("not a traced switch: no service step in the update "
                         f"(found {', '.join(sorted(marks)) or 'nothing'})")
    m = marks
    out = {"total": ended - started, "hosts": len(services),
           "preview": m["preview_end"] - m["preview_start"],
           "to_first_read": _span(m.get("program_start"), m.get("first_read")),
           "to_service": m["service_start"] - m["update_start"],
           "service": m["service_end"] - m["service_start"],
           "rest": m["update_end"] - m["service_end"]}
    out["cli"] = out["total"] - out["preview"] - (m["update_end"] - m["update_start"])
    return out
