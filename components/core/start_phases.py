"""A start's phases, from the server's own journal lines. Pure.

SGLang logs each phase of a start (every TP rank does, with its prefix; the phase ends when the
last rank's line says so):

  "Load weight begin. avail mem=..."                           weights start loading
  "Load weight end. elapsed=228.09 s, type=..., ..."           weights loaded (its own elapsed)
  "KV Cache is allocated. #tokens: ..."                        KV pool allocated
  "Capture cuda graph begin. ..." / "Capture cuda graph end. Time elapsed: ..." (newer:
  "Capture ... CUDA graph end. elapsed=...")                   CUDA graphs captured
  "The server is fired up and ready to roll!"                  warm-up generation done

Phases: init (unit start -> first "Load weight begin": processes, NCCL), load (-> last "Load weight
end"), kv (-> last "KV Cache is allocated"), graphs (first capture begin -> last capture end),
warmup (-> ready line); total = unit start -> ready. The journal is read as
`journalctl -u UNIT -o json --since @START` (MESSAGE and __REALTIME_TIMESTAMP, microseconds).
Records are kept as JSON lines (one start each) in a host-side file; `add_record` keeps the newest
KEEP per host and layout.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

KEEP = 10  # starts remembered per host and layout
MARKERS = {
    "load_begin": re.compile(r"Load weight begin\b", re.ASCII),
    "load_end": re.compile(r"Load weight end\b", re.ASCII),
    "kv": re.compile(r"KV Cache is allocated\b", re.ASCII),
    "graph_begin": re.compile(r"Capture .*?(cuda|CUDA) graph begin\b", re.ASCII),
    "graph_end": re.compile(r"Capture .*?(cuda|CUDA) graph end\b", re.ASCII),
    "ready": re.compile(r"The server is fired up and ready to roll!"),
}
LOAD_ELAPSED = re.compile(r"Load weight end\. elapsed=([0-9.]+) s")
PHASES = ("init", "load", "kv", "graphs", "warmup")


@dataclass(frozen=True)
class StartRecord:
    host: str
    stack: str
    layout: str              # e.g. "pp8": the strategy a forecast is asked about
    started_at: float        # the unit's start, seconds since the epoch
    total: Optional[float]   # unit start -> ready; None when it never became ready
    phases: dict[str, Any] = field(default_factory=dict)
    load_reported: Optional[float] = None  # "Load weight end. elapsed=" (the slowest rank)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def entries_from_journal_json(text: str) -> list[tuple[float, str]]:
    """(seconds since the epoch, message) per line of `journalctl -o json`."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
            stamp = int(doc["__REALTIME_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue
        message = doc.get("MESSAGE")
        if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
            message = bytes(message).decode(errors="replace")
        out.append((stamp, str(message or "")))
    return out


def phases(entries: list[tuple[float, str]], *, host: str, stack: str, layout: str,
           started_at: Optional[float] = None) -> StartRecord:
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    load_reported = None
    for stamp, message in entries:
        for name, pattern in MARKERS.items():
            if pattern.search(message):
                first.setdefault(name, stamp)
                last[name] = stamp
        m = LOAD_ELAPSED.search(message)
        if m:
            load_reported = max(load_reported or 0.0, float(m.group(1)))
    start = started_at if started_at is not None else (entries[0][0] if entries else 0.0)
    ready = first.get("ready")
    got: dict[str, float] = {}

    def span(name: str, a: Optional[float], b: Optional[float]) -> None:
        if a is not None and b is not None and b >= a:
            got[name] = round(b - a, 3)
    span("init", start, first.get("load_begin"))
    span("load", first.get("load_begin"), last.get("load_end"))
    span("kv", last.get("load_end"), last.get("kv"))
    span("graphs", first.get("graph_begin"), last.get("graph_end"))
    span("warmup", last.get("graph_end", last.get("kv")), ready)
    total = round(ready - start, 3) if ready is not None and ready >= start else None
    return StartRecord(host, stack, layout, start, total, got, load_reported)


def parse_records(text: str) -> list[StartRecord]:
    """The stored starts (JSON lines); a line that is not a record is skipped."""
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
            out.append(StartRecord(**{k: doc[k] for k in ("host", "stack", "layout", "started_at", "total")},
                                   phases=dict(doc.get("phases") or {}), load_reported=doc.get("load_reported")))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def add_record(text: str, record: StartRecord, keep: int = KEEP) -> str:
    """The store with `record` added, the oldest of its host and layout beyond `keep` dropped."""
    records = [r for r in parse_records(text) if (r.host, r.layout, r.started_at) != (record.host, record.layout,
                                                                                      record.started_at)]
    records.append(record)
    records.sort(key=lambda r: r.started_at)
    kept: list[StartRecord] = []
    count: dict[tuple[str, str], int] = {}
    for r in reversed(records):
        key = (r.host, r.layout)
        count[key] = count.get(key, 0) + 1
        if count[key] <= keep:
            kept.append(r)
    return "".join(json.dumps(r.as_dict(), sort_keys=True) + "\n" for r in reversed(kept))
