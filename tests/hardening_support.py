"""Shared by the hardening tests (issue 8): the figures of the summary line, a recording of every
command run on a rehearsal host over SSH, and the out-of-band controls that inject faults.

The summary line is printed at the end of the run (tests/conftest.py registers the plugin), from
counters the tests fill, whenever a hardening test counted something:

    hardening: 101 invalid configs refused (101 through pulumi with 0 host commands: 101 by preview,
    18 by up), 9 faults injected and survived, 0 secrets found in outputs (28 outputs checked)

(one line in the output).
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest


# ---------------------------------------------------------------------------------------------
# Figures for the summary line

@dataclass
class Figures:
    refused: set = field(default_factory=set)            # corpus cases the validator refused
    refused_by_pulumi: set = field(default_factory=set)  # ... also through pulumi preview/up, 0 commands
    by_operation: dict = field(default_factory=dict)     # "preview"/"up" -> cases refused by it
    batch: tuple = ()                                    # (cases, engine runs, at once, seconds)
    faults: dict = field(default_factory=dict)           # fault name -> survived (bool)
    outputs_checked: int = 0
    secrets_found: int = 0


FIGURES = Figures()


def refused(case: str, *, through_pulumi: bool = False, operations: tuple[str, ...] = ()) -> None:
    """`case` was refused; `through_pulumi`: by the real engine with 0 host commands and 0 logins,
    by the pulumi `operations` named (preview, up)."""
    (FIGURES.refused_by_pulumi if through_pulumi else FIGURES.refused).add(case)
    for op in operations:
        FIGURES.by_operation.setdefault(op, set()).add(case)


def corpus_batch(cases: int, runs: int, at_once: int, seconds: float) -> None:
    FIGURES.batch = (cases, runs, at_once, seconds)


def fault_injected(name: str) -> None:
    FIGURES.faults.setdefault(name, False)


def fault_survived(name: str) -> None:
    FIGURES.faults[name] = True


def secrets_checked(outputs: int, found: int) -> None:
    FIGURES.outputs_checked += outputs
    FIGURES.secrets_found += found


def summary_line() -> str:
    f = FIGURES
    survived = sum(f.faults.values())
    faults = (f"{len(f.faults)} faults injected and survived" if survived == len(f.faults)
              else f"{len(f.faults)} faults injected, {survived} survived")
    ops = ", ".join(f"{len(cases)} by {op}" for op, cases in sorted(f.by_operation.items(), key=lambda x: x[0] != "preview"))
    return (f"hardening: {len(f.refused | f.refused_by_pulumi)} invalid configs refused "
            f"({len(f.refused_by_pulumi)} through pulumi with 0 host commands{': ' + ops if ops else ''}), {faults}, "
            f"{f.secrets_found} secrets found in outputs ({f.outputs_checked} outputs checked)")


def counted() -> bool:
    f = FIGURES
    return bool(f.refused or f.refused_by_pulumi or f.faults or f.outputs_checked)


def _as_data(f: Figures) -> dict:
    """The figures in what pytest-xdist can carry from a worker to the controller."""
    return {"refused": sorted(f.refused), "refused_by_pulumi": sorted(f.refused_by_pulumi),
            "by_operation": {op: sorted(cases) for op, cases in f.by_operation.items()},
            "batch": list(f.batch), "faults": dict(f.faults), "outputs_checked": f.outputs_checked,
            "secrets_found": f.secrets_found}


def _merge(data: dict) -> None:
    f = FIGURES
    f.refused |= set(data["refused"])
    f.refused_by_pulumi |= set(data["refused_by_pulumi"])
    for op, cases in data["by_operation"].items():
        f.by_operation.setdefault(op, set()).update(cases)
    f.batch = tuple(data["batch"]) or f.batch
    for name, survived in data["faults"].items():
        f.faults[name] = f.faults.get(name, False) or survived
    f.outputs_checked += data["outputs_checked"]
    f.secrets_found += data["secrets_found"]


class SummaryPlugin:
    """Prints the line; under pytest-xdist each worker counts its own tests and hands its figures
    to the controller when it finishes, which adds them up and prints the one line."""

    WORKER_OUTPUT = "gpu-serving-hardening"

    def pytest_sessionfinish(self, session):
        out = getattr(session.config, "workeroutput", None)
        if out is not None:
            out[self.WORKER_OUTPUT] = _as_data(FIGURES)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        data = getattr(node, "workeroutput", {}).get(self.WORKER_OUTPUT)
        if data:
            _merge(data)

    def pytest_terminal_summary(self, terminalreporter):
        if counted():
            terminalreporter.write_sep("-", "gpu-serving hardening (issue 8)")
            terminalreporter.write_line(summary_line())
            if FIGURES.batch:
                cases, runs, at_once, seconds = FIGURES.batch
                terminalreporter.write_line(f"hardening: the bad-input corpus through pulumi: {cases} cases, {runs} engine "
                                            f"runs ({at_once} at once) in {seconds:.0f} s")


# ---------------------------------------------------------------------------------------------
# What runs on the host: every SSH command, recorded by sshd's ForceCommand

COMMAND_LOG = "/var/log/gpu-serving-test-commands.log"
_WRAPPER = "/usr/local/sbin/gpu-serving-test-cmdlog"
_WRAPPER_TEXT = f"""#!/bin/sh
# Test harness (tests/hardening_support.py): record the command, then run it as sshd would.
printf '%s %s\\n' "$(date +%s.%N)" "$(printf '%s' "${{SSH_ORIGINAL_COMMAND:-(login shell)}}" | base64 -w0)" >> {COMMAND_LOG}
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec "${{SHELL:-/bin/sh}}" -l; fi
exec "${{SHELL:-/bin/sh}}" -c "$SSH_ORIGINAL_COMMAND"
"""
_DROPIN = "/etc/ssh/sshd_config.d/99-gpu-serving-test-cmdlog.conf"


def install_command_log(host) -> None:
    """Make sshd on the rehearsal host record every command (exec, sftp subsystem, shell)."""
    script = (f"cat > {_WRAPPER} <<'EOF'\n{_WRAPPER_TEXT}EOF\n"
              f"chmod 755 {_WRAPPER} && touch {COMMAND_LOG} && "
              f"echo 'ForceCommand {_WRAPPER}' > {_DROPIN} && sshd -t && systemctl reload ssh")
    out = host.run(script, timeout=60)
    assert out.returncode == 0, out.stderr
    time.sleep(0.5)


class HostRecord:
    """Reads the rehearsal host's command log and sshd's journal from outside (through the
    overlay the container runs on), so that looking does not itself run a command there."""

    def __init__(self, host):
        self.host = host
        self.root = Path(host.instance_dir) / "merged"

    def commands(self) -> list[str]:
        try:
            lines = (self.root / COMMAND_LOG.lstrip("/")).read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            _, _, b64 = line.partition(" ")
            out.append(base64.b64decode(b64).decode(errors="replace"))
        return out

    def logins(self) -> int:
        """sshd's "Accepted publickey" lines: one per SSH connection that got in."""
        out = subprocess.run(["journalctl", "-D", str(self.root / "var/log/journal"), "-t", "sshd", "-o", "cat",
                              "--no-pager"], capture_output=True, text=True, timeout=60).stdout
        return out.count("Accepted publickey")

    def timed_commands(self) -> list[tuple[float, str]]:
        """(epoch seconds when it started, command) of every recorded command."""
        out = []
        for line in (self.root / COMMAND_LOG.lstrip("/")).read_text().splitlines() \
                if (self.root / COMMAND_LOG.lstrip("/")).exists() else []:
            when, _, b64 = line.partition(" ")
            out.append((float(when), base64.b64decode(b64).decode(errors="replace")))
        return out

    def timed_logins(self) -> list[float]:
        """Epoch seconds of every "Accepted publickey" line of sshd's journal."""
        out = subprocess.run(["journalctl", "-D", str(self.root / "var/log/journal"), "-t", "sshd", "-o", "json",
                              "--no-pager"], capture_output=True, text=True, timeout=60).stdout
        times = []
        for line in out.splitlines():
            entry = json.loads(line)
            if "Accepted publickey" in str(entry.get("MESSAGE", "")):
                times.append(int(entry["__REALTIME_TIMESTAMP"]) / 1e6)
        return times

    def mark(self) -> tuple[int, int]:
        time.sleep(0.5)  # let journald write what sshd logged
        return len(self.commands()), self.logins()

    def since(self, mark: tuple[int, int]) -> tuple[list[str], int]:
        """(commands run, logins) since `mark`."""
        now_commands, now_logins = self.mark()
        return self.commands()[mark[0]:], now_logins - mark[1]


# ---------------------------------------------------------------------------------------------
# Out-of-band controls (no SSH): the container's own systemd, through its namespaces

def nsenter(host, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command inside the rehearsal host without SSH (e.g. while sshd is stopped)."""
    from rehearsal import host as H
    leader = H.status(host.name).leader_pid
    assert leader, f"rehearsal host {host.name} is not running"
    return subprocess.run(["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "--", *argv],
                          capture_output=True, text=True, timeout=timeout)


def container_pids(host, comm: str, cmdline: str = "") -> list[int]:
    """PIDs (as seen from the test machine) of the rehearsal host's processes named `comm`."""
    from rehearsal import machine
    pids = []
    for pid in machine.container_pids(host.name):
        try:
            c = Path(f"/proc/{pid}/comm").read_text().strip()
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if c == comm and cmdline in line:
            pids.append(pid)
    return pids


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def sshd_listener(host) -> list[int]:
    return container_pids(host, "sshd", "[listener]")


def session_pids(host, pattern: str) -> list[str]:
    """The sshd session processes (on the host) of the connection that runs a command matching
    `pattern` (a regex over the command line, anchored with ^ so that it cannot match the shell
    doing the search)."""
    assert pattern.startswith("^")
    script = (r'''for p in $(pgrep -f "$1"); do q=$p; while [ "$q" -gt 1 ]; do '''
              r'''q=$(awk '{print $4}' /proc/$q/stat); c=$(cat /proc/$q/comm 2>/dev/null); '''
              r'''a=$(tr '\0' ' ' < /proc/$q/cmdline 2>/dev/null); '''
              r'''case "$c:$a" in sshd:*listener*) break;; sshd:*) echo "$q";; esac; done; done''')
    out = host.run(f"sh -c {shlex_quote(script)} sh {shlex_quote(pattern)}", timeout=30).stdout
    return sorted(set(out.split()))


def kill_connection_holding(host, pattern: str, sig: str = "KILL") -> list[str]:
    """Send `sig` to the sshd session processes of the connection running `pattern` (see
    `session_pids`): with KILL the client sees its connection drop, with STOP it freezes."""
    pids = session_pids(host, pattern)
    if pids:
        host.run(f"kill -{sig} " + " ".join(pids), timeout=30)
    return pids


def shlex_quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def wait_for(predicate, timeout: float, interval: float = 0.3, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


SIGSTOP, SIGCONT = signal.SIGSTOP, signal.SIGCONT


def ups_at_once(stacks: dict, outputs: dict[str, list[str]], join_seconds: float = 300) -> dict[str, tuple]:
    """`up` of each stack (name -> automation Stack), all released together by a barrier; per name:
    ("ok", its readiness output, when it finished) or ("error", the error's text, when it failed).
    Each run's output lines go to outputs[name]."""
    import threading

    from pulumi import automation as auto

    results: dict[str, tuple] = {}
    barrier = threading.Barrier(len(stacks))

    def up(name):
        barrier.wait()
        try:
            r = stacks[name].up(on_output=outputs[name].append)
            results[name] = ("ok", r.outputs["readiness"].value, time.monotonic())
        except auto.CommandError as exc:
            results[name] = ("error", str(exc), time.monotonic())
    threads = [threading.Thread(target=up, args=(name,)) for name in stacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_seconds)
    return results


def unit_states(d, strategies, unit: str) -> dict[str, str]:
    """Each strategy's `systemctl is-active` on the deployment's host (`unit`: a format of the strategy)."""
    out = d.sh("systemctl is-active " + " ".join(unit.format(s) for s in strategies) + "; true").split()
    return dict(zip(strategies, out))


def serving_one(d, strategies, unit: str) -> str:
    """The one strategy whose unit is active (fails when none or several are)."""
    states = unit_states(d, strategies, unit)
    active = [s for s, state in states.items() if state == "active"]
    assert len(active) == 1, states
    return active[0]
