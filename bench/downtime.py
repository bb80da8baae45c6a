"""The downtime a switch adds, measured from the host side (docs/benchmarks.md, "Downtime").

While a tool switches, a prober on this machine asks each host's serving port for a real
generation (`/health_generate`) every PROBE_INTERVAL seconds. The rehearsal hosts run on this
machine's kernel, so the prober's clock, the host's journal timestamps (systemd's job messages
for the units, sshd's "Starting session" lines) and the moment the tool's command returned are
on one clock. From them, per host:

- (a) `stop_to_start`: the old server's last successful generation -> the new unit's start job
  (systemd's "Starting"/"Started" message for it);
- (b) `ready_to_return`: the new server's first successful generation -> the tool's command
  returned (for a fleet: the last host's first generation);
- (c) `idle_sessions`: SSH sessions (commands, SFTP) the host's sshd started while the GPUs were
  idle: from the old unit's stop job to the new server's first successful generation.

A value is accurate to one probe (PROBE_INTERVAL plus one generation's time). `compute` is pure
(tests/test_bench_stats.py); `Prober` and `journal_events` do the I/O.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

# Often enough that (a) and (b) are resolved to well under their targets (0.5 s, 1 s), rarely
# enough that 4 probers leave the 2 cores to the tool.
PROBE_INTERVAL = 0.05


class Prober:
    """Asks http://address:port/health_generate every PROBE_INTERVAL s in a thread; `results`:
    (time the answer came, True for a 200) in order."""

    def __init__(self, address: str, port: int):
        self.url = f"http://{address}:{port}/health_generate"
        self.results: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"prober-{address}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    ok = r.status == 200
            except (urllib.error.URLError, OSError, ValueError):
                ok = False
            self.results.append((time.time(), ok))
            self._stop.wait(PROBE_INTERVAL)

    def __enter__(self) -> "Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# systemd's own lines (PID 1) when a unit's process dies, fails or is started again by Restart=.
FAILURE_MESSAGES = ("Main process exited", "Failed with result", "Scheduled restart job", "State '")


def journal_events(journal: Path, since: float, units: list[str]) -> list[dict]:
    """The host's journal after `since` (epoch s), read from outside the host: systemd's job
    messages for `units` and sshd's session lines, as {t, kind, unit} in time order."""
    argv = ["journalctl", "-D", str(journal), "--since", f"@{since:.3f}", "-o", "json", "--no-pager"]
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    events = []
    for line in out.splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        t = int(e.get("__REALTIME_TIMESTAMP", 0)) / 1e6
        if e.get("SYSLOG_IDENTIFIER") == "sshd" and "Starting session:" in str(e.get("MESSAGE", "")):
            events.append({"t": t, "kind": "session", "unit": None})
        elif e.get("UNIT") in units and e.get("_PID") == "1":
            # JOB_TYPE where systemd gives it; else its message ("Starting …", "Stopping …").
            message = str(e.get("MESSAGE", ""))
            kind = e.get("JOB_TYPE") or ("start" if message.startswith(("Starting ", "Started ")) else
                                         "stop" if message.startswith("Stopping ") else None)
            if kind in ("start", "stop", "restart"):
                events.append({"t": t, "kind": kind, "unit": e["UNIT"]})
            elif message.startswith(FAILURE_MESSAGES):
                # What systemd said of a unit that failed or was restarted under the run: a run
                # whose server took long to answer says why (a rehearsal host's flake, or ours).
                events.append({"t": t, "kind": "failure", "unit": e["UNIT"], "message": message[:160]})
    return sorted(events, key=lambda e: e["t"])


def compute(probes: list[tuple[float, bool]], events: list[dict], old_unit: str, new_unit: str) -> dict:
    """(a), (b)'s start and (c) for one host: {stop_to_start, first_ok, idle_sessions, ...};
    a value is None when its evidence is missing (no generation seen, no start job)."""
    stops = [e["t"] for e in events if e["kind"] == "stop" and e["unit"] == old_unit]
    starts = [e["t"] for e in events if e["kind"] in ("start", "restart") and e["unit"] == new_unit]
    start = starts[0] if starts else None
    stop = stops[0] if stops else start
    last_ok = max((t for t, ok in probes if ok and start is not None and t <= start), default=None)
    first_ok = min((t for t, ok in probes if ok and start is not None and t > start), default=None)
    idle = None
    if stop is not None and first_ok is not None:
        idle = sum(1 for e in events if e["kind"] == "session" and stop <= e["t"] <= first_ok)
    return {
        "stop_to_start": None if last_ok is None or start is None else round(start - last_ok, 3),
        "first_ok": first_ok,
        "idle_sessions": idle,
        "idle_seconds": None if stop is None or first_ok is None else round(first_ok - stop, 3),
        "failures": [e["message"] for e in events if e["kind"] == "failure" and e["unit"] in (old_unit, new_unit)],
    }


def combine(per_host: list[dict], returned: float) -> dict:
    """One run over all its hosts: (a) the worst host's, (b) from the last host's first
    generation to the command's return, (c) the most any host saw."""
    def worst(key: str) -> Optional[float]:
        values = [h[key] for h in per_host if h.get(key) is not None]
        return max(values) if values and len(values) == len(per_host) else None
    firsts = [h.get("first_ok") for h in per_host]
    last_first = max(firsts) if firsts and None not in firsts else None
    return {"stop_to_start": worst("stop_to_start"),
            "ready_to_return": None if last_first is None else round(returned - last_first, 3),
            "idle_sessions": worst("idle_sessions"), "idle_seconds": worst("idle_seconds"),
            **({"failures": failures} if (failures := [m for h in per_host for m in h.get("failures") or []]) else {})}
