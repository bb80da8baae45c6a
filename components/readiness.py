"""Readiness that cannot lie: pure classification of what a host shows after a unit starts.

Two signals must agree, as in the serving systems we learn from: the unit stays up (same main
PID, no restarts, not failed) AND the HTTP probes pass (port open -> /health_generate 200 -> the
server's own resolved layout equals the declared one). Each outcome has a name:

- ``ready``: generation works and the layout matches;
- ``crashed_during_load``: the unit failed, exited or was restarted by systemd before ready;
- ``timed_out``: still loading (port closed or warming up) at the deadline;
- ``unhealthy``: the server is up (it logged ready, or answered once) but generation fails;
- ``layout_mismatch``: it serves, but not the layout the stack declares.

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
OUTCOMES = (READY, CRASHED, TIMED_OUT, UNHEALTHY, LAYOUT_MISMATCH)

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
        def num(key):
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
            return Verdict(UNHEALTHY, "generating",
                           f"the server is up (it logged ready) but /health_generate answers {obs.health}: generation fails")
    if obs.elapsed >= deadline:
        return Verdict(TIMED_OUT, phase_of(obs),
                       f"still {phase_of(obs)} after {obs.elapsed:.0f} s (readiness.timeoutSeconds)")
    return Verdict(None, phase_of(obs))


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
