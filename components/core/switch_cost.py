"""What a switch costs: minutes with nothing serving, forecast before it is approved. Pure.

From the target layout's recorded starts on the host (core/start_phases.py): the median of its
last HISTORY starts, their range and the load's share:
  "tp8 -> pp8 on gpu1: nothing serves for ~6 m 40 s (pp8's last 3 starts here: 6 m 12 s – 7 m 05 s;
   load 5 m 50 s of it)".
Without a recorded start: an estimate, labelled so, from the checkpoint's size and the host's
measured disk read rate (the load alone: init, graph capture and warm-up come on top and are not
known until one start is recorded); without a measured rate, no figure at all. The old server's
drain, when known, is added in front (nothing new serves while it drains either, once the new
server waits for the GPUs). A fleet behind the router rolls in batches: each batch costs its
slowest host, and the others serve meanwhile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Optional

from .start_phases import StartRecord

HISTORY = 3  # recorded starts a forecast is made from
GIB = 1 << 30


def duration(seconds: float) -> str:
    """6 m 40 s; 45 s; 1 h 02 m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} m {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} m"


@dataclass(frozen=True)
class Forecast:
    basis: str                 # "history", "estimate" or "none"
    seconds: Optional[float]   # nothing serving, drain included
    low: Optional[float] = None
    high: Optional[float] = None
    load: Optional[float] = None
    starts: int = 0
    text: str = ""


def forecast(*, host: str, source: Optional[str], target: str, history: list[StartRecord],
             checkpoint_bytes: Optional[int] = None, disk_bytes_per_s: Optional[float] = None,
             resident_bytes: int = 0, drain_seconds: Optional[float] = None) -> Forecast:
    """The switch `source` -> `target` on `host`. `resident_bytes`: of the checkpoint, already in
    the page cache (a prewarm): an estimate reads only the rest from disk."""
    head = f"{source} → {target} on {host}" if source else f"{target} on {host}"
    drain = drain_seconds or 0.0
    drain_note = f"; the old server's drain {duration(drain)} first" if drain else ""
    done = sorted((r for r in history if r.host == host and r.layout == target and r.total is not None),
                  key=lambda r: r.started_at)[-HISTORY:]
    if done:
        totals = [r.total for r in done if r.total is not None]  # all of them (`done` has a total)
        loads = [load for load in (r.phases.get("load") for r in done) if load is not None]
        mid = median(totals) + drain
        load = median(loads) if loads else None
        spread = duration(min(totals)) if len(done) == 1 else f"{duration(min(totals))} – {duration(max(totals))}"
        what = f"{target}'s last start here: {spread}" if len(done) == 1 else \
            f"{target}'s last {len(done)} starts here: {spread}"
        text = (f"{head}: nothing serves for ~{duration(mid)} ({what}"
                + (f"; load {duration(load)} of it" if load is not None else "") + drain_note + ")")
        return Forecast("history", mid, min(totals) + drain, max(totals) + drain, load, len(done), text)
    if checkpoint_bytes and disk_bytes_per_s:
        cold = max(checkpoint_bytes - resident_bytes, 0)
        load = cold / disk_bytes_per_s
        cached = f", {resident_bytes / GIB:.0f} GiB of it already in the page cache" if resident_bytes else ""
        text = (f"{head}: no start of {target} recorded here; estimate: nothing serves for at least "
                f"~{duration(load + drain)} (loading {checkpoint_bytes / GIB:.0f} GiB{cached} at the host's measured "
                f"{disk_bytes_per_s / GIB:.2f} GiB/s disk read; init, graph capture and warm-up come on top"
                + drain_note + ")")
        return Forecast("estimate", load + drain, load=load, text=text)
    return Forecast("none", None, text=f"{head}: no start of {target} recorded here and no disk read rate measured: "
                                       "no forecast")


@dataclass(frozen=True)
class Batch:
    hosts: tuple[str, ...]
    seconds: Optional[float]
    serving: int               # hosts serving meanwhile
    of: int


def roll(per_host: dict[str, Forecast], batch_size: int) -> tuple[list[Batch], str]:
    """A fleet's roll behind the router, `batch_size` hosts at a time, in the given order."""
    if batch_size < 1:
        raise ValueError("a roll takes at least one host at a time")
    hosts = list(per_host)
    n = len(hosts)
    batches = []
    for i in range(0, n, batch_size):
        group = tuple(hosts[i:i + batch_size])
        times = [per_host[h].seconds for h in group]
        known_times = [t for t in times if t is not None]
        batches.append(Batch(group, max(known_times) if len(known_times) == len(times) else None, n - len(group), n))
    lines = []
    for k, b in enumerate(batches, 1):
        cost = f"~{duration(b.seconds)}" if b.seconds is not None else "unknown (no forecast for a host)"
        lines.append(f"batch {k} of {len(batches)} ({', '.join(b.hosts)}): {cost}, {b.serving} of {b.of} hosts "
                     f"serving meanwhile ({math.floor(100 * b.serving / b.of)} % of the capacity)")
    known = [b.seconds for b in batches if b.seconds is not None]
    total = f"~{duration(sum(known))}" if len(known) == len(batches) else "unknown"
    return batches, f"the roll takes {total} in {len(batches)} batch(es):\n" + "\n".join(lines)
