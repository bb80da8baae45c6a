"""Whose CPU a timed run used: the rehearsal hosts' or this machine's (the tool's), sampled.

On this machine the rehearsal hosts run on the same cores as the tool, so a fleet run's time
holds the hosts' own work too (their sshd sessions, systemd, the simulated nvidia-smi and nvcc,
the servers' start), which on a real fleet each machine does on its own CPUs. Process accounting
(`--account`, bench/acct.py) cannot tell the two apart: it keeps a command name and whole
hundredths of a second per process, and most of a host's processes (a `systemctl`, a `curl`, a
shell) end in less than that and are recorded as using nothing.

`perf record -a` samples every core at a fixed rate (`HZ`) while the run goes and notes, beside
the samples, every process's fork and exec (its task events, the processes already running
included). A sample belongs to the hosts when its process descends from a `systemd-nspawn` (each
rehearsal host is one), to the kernel when it is a kernel thread, to idle when the core was
idle, and to this machine otherwise: the CLI, the engine, the program and provider processes,
the bench itself. `perf` comes from Debian's linux-perf (scripts/install-host-deps, which
bench/run calls, installs it). perf's own work is counted on this machine's side, as `perf`.

`bench/run --cpu-split` records every timed run; each sample then carries `cpu_split`.
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

HZ = 499
SIDES = ("hosts", "machine", "kernel", "idle")
# How many commands of each side a sample keeps (the rest are in the side's total).
TOP = 10

# `perf script -F comm,pid,time,event --show-task-events`: a sample is "<comm> <pid> <seconds>:
# cpu-clock:"; a task event "<comm> <pid> <seconds>: PERF_RECORD_FORK(<pid>:<tid>):(<ppid>:<ptid>)"
# or "... PERF_RECORD_COMM[ exec]: <comm>:<pid>/<tid>" (a process's name, set by an exec). perf
# writes the tasks already running as a fork and a name each at time 0, so the tree is whole
# from the start. A fork's own line names the parent: the child's name is its next COMM.
_LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<pid>\d+)\s+(?P<time>\d+\.\d+):\s+(?P<event>.*)$")
_FORK = re.compile(r"^PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
_COMM = re.compile(r"^PERF_RECORD_COMM(?: exec)?: (.*):(\d+)/(\d+)$")

KTHREADD = 2
NSPAWN = "systemd-nspawn"


def split(lines: Iterable[str], start: float, end: float, hz: float = HZ, top: int = TOP) -> dict:
    """CPU seconds by side (`SIDES`) of the `cpu-clock` samples taken between `start` and `end`
    (the clock perf was told to use), and the `top` commands of the hosts' and this machine's
    (a command: the name a process had when sampled, which an exec sets)."""
    parent: dict[int, int] = {}
    name: dict[int, str] = {}
    samples: Counter = Counter()
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        event = m["event"].strip()
        if event.startswith("cpu-clock"):
            if start <= float(m["time"]) <= end:
                samples[(int(m["pid"]), m["comm"])] += 1
        elif (fork := _FORK.match(event)) and fork[1] != fork[3]:
            # a new process (a new thread of a process has that process's pid)
            parent[int(fork[1])] = int(fork[3])
            name.pop(int(fork[1]), None)
        elif (comm := _COMM.match(event)) and comm[2] == comm[3]:
            name[int(comm[2])] = comm[1]
    roots = {pid for pid, comm in name.items() if comm == NSPAWN}

    def side(pid: int) -> str:
        if pid == 0:
            return "idle"
        seen = pid
        for _ in range(64):
            up = parent.get(seen)
            if seen == KTHREADD or up == KTHREADD:
                return "kernel"
            if up is None or up == seen:
                return "machine"
            if up in roots:
                return "hosts"
            seen = up
        return "machine"

    totals = {s: 0.0 for s in SIDES}
    commands: dict[str, Counter] = {"hosts": Counter(), "machine": Counter()}
    for (pid, command), n in samples.items():
        where = side(pid)
        totals[where] += n / hz
        if where in commands:
            commands[where][command] += n / hz
    out = {s: round(v, 3) for s, v in totals.items()}
    out["top"] = {s: [[c, round(v, 3)] for c, v in commands[s].most_common(top)] for s in commands}
    return out


class Recorder:
    """`perf record` of the whole machine for the `with` block; `split(start, end)` afterwards
    (times from time.monotonic(): perf is told to stamp with CLOCK_MONOTONIC)."""

    def __init__(self, hz: int = HZ):
        self.hz = hz
        self._lines: list[str] = []

    def __enter__(self) -> "Recorder":
        perf = shutil.which("perf")
        if perf is None:
            raise RuntimeError("--cpu-split needs perf (Debian: apt-get install linux-perf)")
        self._dir = Path(tempfile.mkdtemp(prefix="gs-perf-"))
        data = self._dir / "perf.data"
        argv = [perf, "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-F", str(self.hz), "-e", "cpu-clock",
                "-o", str(data)]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # perf writes its header once every core's events are open: from then on it records.
        deadline = time.monotonic() + 10
        while not (data.exists() and data.stat().st_size > 0):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                shutil.rmtree(self._dir, ignore_errors=True)
                raise RuntimeError(f"perf record did not start: {self._proc.stderr.read().strip()[-500:]}")
            time.sleep(0.02)
        time.sleep(0.1)
        return self

    def _stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __exit__(self, *exc) -> None:
        try:
            self._stop()
            if exc[0] is None:
                out = subprocess.run(["perf", "script", "-i", str(self._dir / "perf.data"), "-F", "comm,pid,time,event",
                                      "--show-task-events"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, timeout=300)
                self._lines = out.stdout.splitlines()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def split(self, start: float, end: float, top: int = TOP) -> dict:
        return split(self._lines, start, end, self.hz, top)


def per_host(by_hosts: dict[int, dict], side: str) -> Optional[float]:
    """What each host past the first adds to `side`'s CPU seconds, (N hosts - 1 host) / (N - 1)
    for the largest fleet measured, from {hosts: {side: seconds}}."""
    sizes = sorted(n for n in by_hosts if by_hosts[n].get(side) is not None)
    if len(sizes) < 2 or sizes[0] != 1:
        return None
    n = sizes[-1]
    return (by_hosts[n][side] - by_hosts[1][side]) / (n - 1)
