"""Readiness that cannot lie: pure classification of what a host shows after a unit starts.

Two signals must agree, as in the serving systems we learn from: the unit stays up (same main
PID, no restarts, not failed) AND the HTTP probes pass (port open -> /health_generate 200 -> the
server's own resolved layout equals the declared one). Each outcome has a name:

- ``ready``: generation works and the layout matches;
- ``crashed_during_load``: the unit failed, exited or was restarted by systemd before ready;
- ``timed_out``: still loading (port closed or warming up) at the deadline;
- ``unhealthy``: the server is up (it logged ready, or answered once) but generation fails;
- ``layout_mismatch``: it serves, but not the layout the stack declares (the reason lists each
  field, declared vs running);
- ``output_mismatch``: it serves the declared layout but answers otherwise than the model did when
  the reference was recorded (core/golden.py: which prompts, how far off);
- ``perf_regression``: it answers right but below readiness.minSpeedRatio of the stored baseline
  (core/speed_check.py: both figures side by side).
A dead DP rank is ``unhealthy`` with the reason "dp rank k: ..." (core/dp_ranks.py).

A refresh looks once, without a start to compare with, and adds two names of its own, so that
"was ready, then stopped answering" is never mistaken for "never became ready":

- ``loading``: the unit runs but the server does not answer yet (systemd restarted it after a
  crash, or someone restarted it): not a failure yet; an `up` waits for it;
- ``stopped``: the unit does not run at all (stopped, failed, or waiting for systemd's restart).

The remote part (`components/remote/probe.py`) only gathers `Observation`s; everything that
decides lives here and is tested with data.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

READY = "ready"
CRASHED = "crashed_during_load"
TIMED_OUT = "timed_out"
UNHEALTHY = "unhealthy"
LAYOUT_MISMATCH = "layout_mismatch"
# It generates, in the declared layout, but the answers are not the model's (other weights, a
# broken kernel, garbage): handled like crashed_during_load (rolled back, files restored).
OUTPUT_MISMATCH = "output_mismatch"
# It answers right, but slower than readiness.minSpeedRatio of the newest baseline on this host and
# layout: reported (warn, the default) or rolled back (readiness.onPerfRegression: rollback).
PERF_REGRESSION = "perf_regression"
# Seen only by a refresh's single look (`judge_now`), never as the end of a start:
LOADING = "loading"  # the unit runs, the server does not answer yet: it was (re)started
STOPPED = "stopped"  # the unit does not run: it was stopped, failed, or waits to be restarted
OUTCOMES = (READY, CRASHED, TIMED_OUT, UNHEALTHY, LAYOUT_MISMATCH, OUTPUT_MISMATCH, PERF_REGRESSION, LOADING, STOPPED)

# Fields of /server_info that make up the declared layout, compared one by one.
LAYOUT_FIELDS = ("tp_size", "pp_size", "ep_size", "dp_size", "enable_dp_attention", "model_path",
                 "served_model_name", "port")


@dataclass(frozen=True)
class UnitState:
    active_state: str  # active, activating, deactivating, inactive, failed
    sub_state: str
    main_pid: int
    n_restarts: int
    result: str = "success"
    exec_main_status: int = 0

    @classmethod
    def from_show(cls, props: dict[str, str]) -> "UnitState":
        def num(key: str) -> int:
            try:
                return int(props.get(key, "0") or 0)
            except ValueError:
                return 0
        return cls(props.get("ActiveState", "unknown"), props.get("SubState", ""), num("MainPID"),
                   num("NRestarts"), props.get("Result", ""), num("ExecMainStatus"))


@dataclass(frozen=True)
class Observation:
    elapsed: float
    unit: UnitState
    # HTTP status of /health_generate; 0 when the port is closed (connection refused).
    health: int
    logged_ready: bool = False


@dataclass(frozen=True)
class Verdict:
    """`outcome` None means: not decided yet, keep polling (`phase` says what it is doing)."""

    outcome: Optional[str]
    phase: str
    reason: str = ""


def phase_of(obs: Observation) -> str:
    if obs.health == 0:
        return "loading"
    if obs.health == 503 and not obs.logged_ready:
        return "warming up"
    return "generating"


def _generation_fails(obs: Observation) -> str:
    """The reason of every `unhealthy` that comes from /health_generate, the wait's and the
    refresh's alike (a refresh never reads the journal, so it never says "logged ready")."""
    logged = " (it logged ready)" if obs.logged_ready else ""
    return f"the server is up{logged} but /health_generate answers {obs.health}: generation fails"


def judge(baseline: UnitState, obs: Observation, deadline: float, ever_healthy: bool = False,
          unhealthy_after: Optional[float] = None) -> Verdict:
    """One poll's verdict. `baseline` is the unit right after `systemctl start`.

    `unhealthy_after`: the elapsed time from which a server that logged ready but still fails
    /health_generate is called unhealthy (its first ready line + the generation timeout),
    instead of waiting for the whole load deadline.
    """
    u = obs.unit
    restarted = u.n_restarts > baseline.n_restarts or (baseline.main_pid and u.main_pid and u.main_pid != baseline.main_pid)
    # "auto-restart": the process exited and systemd waits RestartSec before trying again; do
    # not wait for the retry to call it a crash.
    exited = u.sub_state == "auto-restart"
    if u.active_state in ("failed", "inactive", "deactivating") or restarted or exited:
        if exited:
            how = f"the process exited ({u.result}, exit status {u.exec_main_status}); systemd is about to restart it"
        elif restarted and u.active_state == "active":
            how = f"systemd restarted it ({u.n_restarts - baseline.n_restarts} restart(s))"
        else:
            how = f"unit is {u.active_state} ({u.result}, exit status {u.exec_main_status})"
        if ever_healthy or obs.logged_ready:
            return Verdict(UNHEALTHY, "generating", f"the server was up, then stopped: {how}")
        return Verdict(CRASHED, "loading", f"the server stopped before it was ready: {how}")
    if obs.health == 200:
        return Verdict(READY, "generating")
    if obs.health not in (0, 503) or (obs.health == 503 and obs.logged_ready):
        limit = deadline if unhealthy_after is None else min(deadline, unhealthy_after)
        if obs.elapsed >= limit or obs.health not in (0, 503):
            return Verdict(UNHEALTHY, "generating", _generation_fails(obs))
    if obs.elapsed >= deadline:
        return Verdict(TIMED_OUT, phase_of(obs),
                       f"still {phase_of(obs)} after {obs.elapsed:.0f} s (readiness.timeoutSeconds)")
    return Verdict(None, phase_of(obs))


def judge_now(obs: Observation) -> Verdict:
    """The verdict of one look at a unit nobody just started (a refresh): no baseline, no
    deadline, no journal. A server that loads is `loading`, not a failure: an `up` waits for it."""
    u = obs.unit
    running = u.active_state in ("active", "activating", "reloading") and u.sub_state != "auto-restart"
    if not running:
        how = f"unit is {u.active_state}" + (f" ({u.sub_state})" if u.sub_state else "")
        if u.result and u.result != "success":
            how += f", last result {u.result}, exit status {u.exec_main_status}"
        return Verdict(STOPPED, "stopped", f"the server does not run: {how}")
    if obs.health == 200:
        return Verdict(READY, "generating")
    if obs.health == 0:
        return Verdict(LOADING, "loading", "the unit runs but the port is closed: the server is loading "
                                           f"({u.n_restarts} restart(s) by systemd so far)")
    if obs.health == 503:
        return Verdict(LOADING, "warming up", "the server answers /health_generate with 503: warming up, "
                                              "or generation fails")
    return Verdict(UNHEALTHY, "generating", _generation_fails(obs))


def _number(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def compare_layout(declared: dict[str, Any], server_info: dict[str, Any]) -> list[dict[str, Any]]:
    """Each field where the running server differs from the declaration."""
    out = []
    for key in LAYOUT_FIELDS:
        if key not in declared:
            continue
        want, have = declared[key], server_info.get(key)
        if isinstance(want, bool) or isinstance(have, bool):
            same = bool(want) == bool(have)
        elif _number(want) is not None and _number(have) is not None:
            # Pulumi state turns ints into floats (8 -> 8.0): compare numbers as numbers.
            same = _number(want) == _number(have)
        else:
            same = str(want) == str(have)
        if not same:
            out.append({"field": key, "declared": want, "running": have})
    return out


def layout_reason(mismatches: list[dict[str, Any]]) -> str:
    """Every layout_mismatch message: each field, declared vs running."""
    def shown(value: Any) -> Any:
        # Pulumi state turns ints into floats: say 8, not 8.0.
        return int(value) if isinstance(value, float) and value.is_integer() else value
    return "the server runs another layout than declared: " + ", ".join(
        f"{m['field']} declared {shown(m['declared'])} running {shown(m['running'])}" for m in mismatches)


def next_poll(previous: float, initial: float, maximum: float) -> float:
    """Backoff: start fast (a rehearsal host is ready in seconds), grow to `maximum` so a
    many-minute load is polled a few times a minute, not hammered."""
    if previous <= 0:
        return initial
    return min(maximum, previous * 1.5)


@dataclass
class Report:
    """What `pulumi stack output readiness --json` shows."""

    status: str
    unit: str
    url: str
    probe: str = "/health_generate"
    seconds_to_ready: Optional[float] = None
    checked_at: str = ""
    layout: dict[str, Any] = field(default_factory=dict)
    model: Optional[str] = None
    served_model_name: Optional[str] = None
    version: Optional[str] = None
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolved_layout(server_info: dict[str, Any]) -> dict[str, Any]:
    keys = ("tp_size", "pp_size", "ep_size", "dp_size", "enable_dp_attention", "moe_a2a_backend")
    return {k: server_info.get(k) for k in keys}


def build_report(verdict: Verdict, *, unit: str, url: str, declared: dict[str, Any], checked_at: str,
                 info_read: Optional[tuple[str, dict[str, Any], dict[str, Any]]] = None,
                 seconds_to_ready: Optional[float] = None) -> Report:
    """The one builder of the readiness report, for a start (`probe.wait_ready`) and a refresh
    alike. `verdict.outcome` must be decided; `info_read` is (probe used, /server_info,
    /v1/models) when the server generates: a ready server is then checked against the declared
    layout and becomes `layout_mismatch` (naming each field) when it differs."""
    if verdict.outcome not in OUTCOMES:
        raise ValueError(f"not an outcome: {verdict.outcome!r}")
    report = Report(status=verdict.outcome, unit=unit, url=url, checked_at=checked_at, reason=verdict.reason)
    if verdict.outcome != READY:
        return report
    probe, info, models = info_read or ("/server_info", {}, {})
    report.probe = f"/health_generate + {probe}"
    report.seconds_to_ready = seconds_to_ready
    report.layout = resolved_layout(info)
    report.model = info.get("model_path")
    data = (models or {}).get("data") or []
    report.served_model_name = data[0].get("id") if data and isinstance(data[0], dict) else info.get("served_model_name")
    report.version = info.get("version")
    report.mismatches = compare_layout(declared, info)
    if report.mismatches:
        report.status = LAYOUT_MISMATCH
        report.reason = layout_reason(report.mismatches)
    return report


# --- What the running server was started from ------------------------------------------------
#
# The files on the host can be repaired while the process still runs what a hand edit gave it
# (edit, `systemctl restart`, files restored). So the service reads back what its main process
# really runs, /proc/<MainPID>/cmdline and /proc/<MainPID>/environ (what systemd passed at exec,
# whatever the process did since), and compares it with the declaration: argv exactly, every
# declared variable exactly, and any variable that neither the declaration nor systemd put there.
# A hash carried in the unit's Environment= would not do: a hand edit of ExecStart keeps it.

AS_DECLARED = "as declared"
NOT_RUNNING = "not running"

# Variables systemd sets for a service itself (systemd.exec(5), "Environment Variables in Spawned
# Processes"), by name; the manager's own environment (`systemctl show-environment`) is compared
# by value instead.
SYSTEMD_VARIABLES = frozenset({
    "PATH", "LANG", "LANGUAGE", "USER", "LOGNAME", "HOME", "SHELL", "INVOCATION_ID", "XDG_RUNTIME_DIR",
    "RUNTIME_DIRECTORY", "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
    "CREDENTIALS_DIRECTORY", "MAINPID", "MANAGERPID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
    "NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "SYSTEMD_EXEC_PID", "TERM", "JOURNAL_STREAM",
    "SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS", "PIDFILE", "FDSTORE", "LOG_NAMESPACE",
    "MEMORY_PRESSURE_WATCH", "MEMORY_PRESSURE_WRITE", "REMOTE_ADDR", "REMOTE_PORT", "SYSTEMD_NSS_DYNAMIC_BYPASS",
})


def parse_environment(text: str) -> dict[str, str]:
    """KEY=value lines of an EnvironmentFile as systemd reads the ones we write (comments and
    blank lines skipped, one pair of double quotes removed, backslash escapes inside them)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key] = value
    return out


def secret_hash(secrets: Optional[dict[str, str]]) -> str:
    """The secret part of the running config, as a hash: the values never leave it."""
    import hashlib
    return hashlib.sha256(repr(sorted((secrets or {}).items())).encode()).hexdigest()


def running_config_hash(argv: list[str], environment: dict[str, str], secret_hash: str) -> str:
    """`configHash`: what the server is started from, the ExecStart argv, every variable the
    process gets (the shared file's and the unit's own) and the secrets' hash, and nothing else
    of the unit text (its comments, Description=, Conflicts= or After= lines, or which file a
    variable comes from, never restart a server)."""
    import hashlib
    import json
    doc = {"argv": [str(a) for a in argv], "environment": sorted(environment.items()), "secrets": secret_hash}
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def split_nul(data: bytes) -> list[str]:
    """/proc/<pid>/cmdline or environ: NUL-terminated strings."""
    return [part.decode(errors="replace") for part in data.split(b"\0") if part]


def flag_groups(argv: list[str]) -> list[tuple[str, str]]:
    """argv as (flag, its values), so a difference reads `--max-running-requests 128`; what
    precedes the first flag (the interpreter, `-m sglang.launch_server`) is one group."""
    groups: list[tuple[str, list[str]]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append((arg, []))
        else:
            groups[-1][1].append(arg)
    return [(flag, " ".join(values)) for flag, values in groups]


def compare_running(declared_argv: list[str], declared_environment: dict[str, str], secret_keys_same: dict[str, bool],
                    running_argv: list[str], running_environment: dict[str, str],
                    manager_environment: dict[str, str]) -> list[str]:
    """Each way the running process differs from the declaration, in words (no secret value).

    `secret_keys_same`: for each secret variable, whether the process has the declared value (the
    caller compares; only the answer comes here)."""
    out: list[str] = []
    if [str(a) for a in declared_argv] != running_argv:
        want = dict(flag_groups([str(a) for a in declared_argv]))
        have = dict(flag_groups(running_argv))
        for flag in list(want) + [f for f in have if f not in want]:
            if flag not in have:
                out.append(f"{flag} {want[flag]}".rstrip() + " declared, not running")
            elif flag not in want:
                out.append(f"{flag} {have[flag]}".rstrip() + " running, not declared")
            elif want[flag] != have[flag]:
                out.append(f"{flag} {have[flag]} (declared {want[flag]})")
        if not out:
            out.append("ExecStart differs in the order of its arguments")
    for key, value in sorted(declared_environment.items()):
        if key not in running_environment:
            out.append(f"{key} not set (declared {value})")
        elif running_environment[key] != value:
            out.append(f"{key}={running_environment[key]} (declared {value})")
    for key, same in sorted(secret_keys_same.items()):
        if not same:
            out.append(f"{key} (a secret) is not the declared value")
    for key, value in sorted(running_environment.items()):
        if key in declared_environment or key in secret_keys_same or key in SYSTEMD_VARIABLES:
            continue
        if manager_environment.get(key) == value:
            continue
        out.append(f"{key}={value} set, not declared")
    return out


def running_reason(differences: list[str]) -> str:
    """The value of the service's `runningServer` field when the process differs."""
    return "the running server was started from other settings (an up restarts it): " + "; ".join(differences)


# ---------------------------------------------------------------------------------------------
# Multi-node layouts (issue 17). Only rank 0 runs the HTTP server and the tokenizer; every other
# rank answers 200 on /health and /health_generate from a dummy server whatever happens, so it is
# judged by its unit alone: still the process it started as, not restarted, not failed. Whether
# it joined rank 0 comes from its journal: each SGLang TP rank logs this line once its process
# group is up (model_runner: "Init torch distributed ends").
JOINED_LINE = "Init torch distributed ends"


def rank_problem(baseline: UnitState, now: UnitState) -> Optional[str]:
    """What is wrong with a rank >= 1 since its start (None: it runs as it started)."""
    if now.active_state in ("failed", "inactive") or now.main_pid == 0:
        return f"its unit is {now.active_state} ({now.result or 'no result'}, exit status {now.exec_main_status})"
    if now.n_restarts > baseline.n_restarts:
        return f"systemd restarted it {now.n_restarts - baseline.n_restarts} time(s)"
    if baseline.main_pid and now.main_pid != baseline.main_pid:
        return f"its main process changed (pid {baseline.main_pid} -> {now.main_pid})"
    return None


def rank_now(rank: int, nnodes: int, joined: bool) -> tuple[str, str]:
    """One look at a running rank >= 1 (`status`, the drift watch), judged as a switch judges it:
    by its unit (it runs: the caller looked) and its journal, never by its HTTP answer (a dummy
    server's 200). (status, reason)."""
    if joined:
        return READY, ""
    return LOADING, (f"rank {rank} of {nnodes} has not joined rank 0 yet: no '{JOINED_LINE}' in its journal since its "
                     "unit started")


def ranks_waited_for(waiting: list[str], gone: list[str]) -> tuple[str, Optional[str]]:
    """While rank 0 loads, the ranks >= 1 that have not joined it, named at once rather than at
    rank 0's deadline: (the note its progress line carries, why waiting longer is pointless: a
    rank that stopped before joining, so rank 0 can never be ready). `waiting`: "rank k on
    <host>" still running; `gone`: the same with the problem (`rank_problem`)."""
    if gone:
        return f"rank(s) that stopped before joining: {'; '.join(gone)}", f"{'; '.join(gone)}, before it joined rank 0"
    if waiting:
        return f"waiting for {', '.join(waiting)} to join (no '{JOINED_LINE}' in its journal yet)", None
    return "every rank joined", None


@dataclass(frozen=True)
class RankState:
    """A rank >= 1 after rank 0's verdict: `problem` from `rank_problem`, `joined` from its journal."""

    rank: int
    host: str
    problem: Optional[str]
    joined: bool


def judge_ranks(rank0_status: str, rank0_reason: str, ranks: list[RankState]) -> tuple[str, str, Optional[int]]:
    """The layout's verdict from rank 0's and the other ranks' states: (status, reason, the rank
    whose journal explains it, or None for rank 0's). Rank 0 ready and every rank as it started:
    ready. Rank 0 not ready and a rank whose journal shows no join: timed_out, "rank k on <host>
    did not join". A rank that joined, then failed or restarted: crashed_during_load, naming it."""
    missing = [r for r in ranks if not r.joined]
    if rank0_status != READY and missing:
        # Rank 0 cannot be ready without every rank: the ones that never joined are the cause,
        # whether they still wait or gave up (then their unit's state is said too).
        names = "; ".join(f"rank {r.rank} on {r.host} did not join" + (f" ({r.problem})" if r.problem else "") for r in missing)
        return TIMED_OUT, f"{names}; rank 0: {rank0_status}" + (f" ({rank0_reason})" if rank0_reason else ""), missing[0].rank
    broken = [r for r in ranks if r.problem]
    if broken:
        r = broken[0]
        return CRASHED, f"rank {r.rank} on {r.host}: {r.problem}" + (
            f"; rank 0: {rank0_status}" + (f" ({rank0_reason})" if rank0_reason else "") if rank0_status != READY else ""), r.rank
    return rank0_status, rank0_reason, None
