"""Host-side probes for readiness: each poll is one SSH command that reads the unit's state
and the server's health together, so the two signals are taken at the same moment."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

from ..core import readiness as R
from ..core import reads
from ..core.facts import SHOW_OPTIONS, parse_systemctl_show, show_options, split_sections
from ..core.specs import ReadinessDeadlines

# The read-only scripts live with the read requests (reads.py, pure); named here too.
from ..core.reads import (  # noqa: F401
    INFO_SCRIPT,
    POLL_SCRIPT,
    SERVICE_SCRIPT,
    SNAPSHOT_SCRIPT,
    probe_address,
)
from . import ssh

# The steps of a switch plan that run before a start, or after it, as words "action:unit,unit"
# (`step_words`), in order, in the same round trip as the start or the read that follows: the
# first that fails ends the script, printing "@@failed=<exit status> <word>" and its output.
# enable/disable leave systemd's reload to one daemon-reload after the last of them (each would
# reload on its own: ~0.5 s each on a busy host, after the new server is ready).
RUN_STEPS = r"""
reload=
for step in "$@"; do
  action=${step%%:*}; units=$(printf '%s' "${step#*:}" | tr , ' ')
  case $action in
    daemon-reload) out=$(systemctl daemon-reload 2>&1) ;;
    stop) out=$(systemctl stop --quiet -- $units 2>&1) ;;
    enable|disable) reload=1; out=$(systemctl "$action" --no-reload --quiet -- $units 2>&1) ;;
    *) out="unknown step $action"; false ;;
  esac || { rc=$?; [ -z "$reload" ] || systemctl daemon-reload; printf '@@failed=%s %s\n%s\n' "$rc" "$step" "$out"; exit 0; }
done
if [ -n "$reload" ]; then
  out=$(systemctl daemon-reload 2>&1) || { printf '@@failed=%s daemon-reload:\n%s\n' "$?" "$out"; exit 0; }
fi
"""

# $1 verb (start | restart), $2 unit, $3.. the plan's steps before the start (RUN_STEPS: the
# daemon-reload, the stop of the strategy that serves): the host's clock (the journal is read from
# then on), those steps, the crash-loop counter reset (a deliberate start is not a crash loop:
# StartLimitBurst would otherwise refuse the 4th switch to a strategy within
# StartLimitIntervalSec), the start, then the unit's state right after it (the baseline readiness
# compares restarts and PIDs with). One round trip: nothing of ours runs between the moment the
# old server is down and the new one's start.
START_SCRIPT = r"""
date +%s
verb=$1; unit=$2; shift 2
""" + RUN_STEPS + r"""
echo @@start
systemctl reset-failed -- "$unit" 2>/dev/null
systemctl "$verb" -- "$unit" 2>&1; echo "@@rc=$?"
echo @@unit
systemctl show """ + SHOW_OPTIONS + r""" -- "$unit"
"""

# $1 unit, $2.. the plan's steps (RUN_STEPS) when there is no start to wait for, or after it
# (enable the new strategy, disable the others), then what $1 is and runs now (SERVICE_SCRIPT),
# in one round trip.
STEPS_SCRIPT = r"""
unit=$1; shift
""" + RUN_STEPS + r"""
echo @@read
set -- "$unit"
""" + SERVICE_SCRIPT


def step_words(steps) -> list[str]:
    """switch.Step objects as RUN_STEPS's words."""
    return [f"{s.action}:{','.join(s.units)}" for s in steps]


def _step_failed(t: ssh.Target, stdout: str) -> None:
    """Raise the RemoteError of the step RUN_STEPS reports as failed, if any."""
    head, marker, rest = stdout.partition("@@failed=")
    if not marker:
        return
    first, _, output = rest.partition("\n")
    rc, _, word = first.partition(" ")
    action, _, units = word.partition(":")
    names = units.replace(",", ", ")
    purpose = {"daemon-reload": "systemctl daemon-reload", "stop": f"stopping {names}",
               "enable": f"enabling {names}", "disable": f"disabling {names}"}.get(action, word)
    tail = "\n".join(output.strip().splitlines()[-15:])
    raise ssh.RemoteError(f"{purpose} on {t.label} failed (exit {rc}):\n{tail}")


def run_steps(t: ssh.Target, unit: str, steps) -> str:
    """STEPS_SCRIPT: the steps in order, then SERVICE_SCRIPT's answer for `unit` (returned).
    Raises RemoteError naming the first step that failed (the later ones did not run)."""
    out = ssh.run(t, ["sh", "-c", STEPS_SCRIPT, "sh", unit, *step_words(steps)],
                  purpose=f"switching to {unit}" if steps else f"reading the state of {unit}", timeout=300, check=False)
    _step_failed(t, out.stdout)
    if "@@read\n" not in out.stdout:
        raise ssh.RemoteError(f"reading the state of {unit} on {t.label} failed (exit {out.rc}):\n{out.stderr.strip()[-500:]}")
    return out.stdout.partition("@@read\n")[2]


def unit_state(t: ssh.Target, unit: str) -> R.UnitState:
    out = ssh.run(t, ["systemctl", "show", *show_options(), "--", unit],
                  purpose=f"reading the state of {unit}", timeout=30, read=True)
    return R.UnitState.from_show(next(iter(parse_systemctl_show(out.stdout).values()), {}))


def _observation(out: str, elapsed: float) -> R.Observation:
    s = split_sections("@@unit\n" + out)
    props = next(iter(parse_systemctl_show(s.get("unit", "")).values()), {})
    code_text, _, rc_text = s.get("health", "000 7").strip().partition(" ")
    try:
        code = int(code_text)
    except ValueError:
        code = 0
    if code == 0 and rc_text.strip() == "28":
        code = 503  # accepted the connection but did not answer in time: busy, not closed
    ready_lines = s.get("ready", "0").strip() or "0"
    return R.Observation(elapsed=elapsed, unit=R.UnitState.from_show(props), health=code,
                         logged_ready=ready_lines.isdigit() and int(ready_lines) > 0)


def observe(t: ssh.Target, unit: str, address: str, port: int, gen_timeout: float, since: int, elapsed: float) -> R.Observation:
    out = ssh.run(t, ["sh", "-c", POLL_SCRIPT, "sh", unit, address, str(port), str(int(gen_timeout)), str(since)],
                  purpose=f"probing {unit}", timeout=gen_timeout + 30, check=False, read=True)
    return _observation(out.stdout, elapsed)


def snapshot(t: ssh.Target, unit: str, address: str, port: int, gen_timeout: float, since: Optional[int],
             elapsed: float, wait: float = 0.0, settle: float = 0.0, seen_port: str = "", seen_ready: bool = False
             ) -> tuple[R.Observation, Optional[tuple[str, dict, dict]], Optional[R.Observation]]:
    """One round trip: the poll, (probe used, server info, /v1/models) when it generates, and the
    look `settle` seconds after its first generation (None: no settle asked, or it did not
    generate). `wait`, `seen_port`, `seen_ready`: reads.snapshot; `elapsed` is the caller's clock
    when it sent the poll."""
    t0 = time.monotonic()
    out = ssh.fetch(t, reads.snapshot(unit, address, port, gen_timeout, since, wait, settle, seen_port, seen_ready))
    head, marker, settled = out.stdout.partition("\n@@settled\n")
    took = time.monotonic() - t0
    obs = _observation(head, elapsed + (took - (settle if marker else 0.0) if wait else 0.0))
    again = _observation(settled, elapsed + took) if marker else None
    return obs, (_info(out.stdout) if (again or obs).health == 200 else None), again


def read_snapshot(stdout: str, elapsed: float) -> tuple[R.Observation, Optional[tuple[str, dict, dict]]]:
    """What a snapshot without settle printed: the observation, and what the server runs when it generates."""
    obs = _observation(stdout, elapsed)
    return obs, (_info(stdout) if obs.health == 200 else None)


def start(t: ssh.Target, unit: str, verb: str = "start", before=()) -> tuple[int, R.UnitState]:
    """`systemctl start|restart unit` in one round trip, after the plan's steps `before` (the
    daemon-reload, the stop of the strategy that serves): (host clock before those steps, the
    unit's state right after the start). Raises RemoteError when a step or systemctl fails (a
    failed step: nothing after it ran, the start neither)."""
    out = ssh.run(t, ["sh", "-c", START_SCRIPT, "sh", verb, unit, *step_words(before)], purpose=f"starting {unit}",
                  timeout=180 + 240 * bool(before), check=False)
    _step_failed(t, out.stdout.partition("@@start")[0])
    head, _, rest = out.stdout.partition("@@start")
    s = split_sections("@@start" + rest)
    started = s.get("start", "")
    rc = started.strip().rpartition("@@rc=")[2].strip()
    if rc != "0":
        detail = "\n".join((started.replace(f"@@rc={rc}", "") + out.stderr).strip().splitlines()[-15:])
        raise ssh.RemoteError(f"starting {unit} on {t.label} failed (systemctl {verb} exit {rc or '?'}):\n{detail}")
    props = next(iter(parse_systemctl_show(s.get("unit", "")).values()), {})
    return int(float(head.strip().splitlines()[0])), R.UnitState.from_show(props)


def rank_look(t: ssh.Target, unit: str) -> tuple[R.UnitState, bool]:
    """A rank >= 1 now: its unit's state, and whether its current run joined rank 0 (its journal)."""
    s = split_sections("@@unit\n" + ssh.fetch(t, reads.rank(unit, R.JOINED_LINE)).stdout)
    joined = s.get("joined", "0").strip()
    return (R.UnitState.from_show(next(iter(parse_systemctl_show(s.get("unit", "")).values()), {})),
            joined.isdigit() and int(joined) > 0)


def _body(section: str) -> tuple[int, Optional[dict]]:
    text = section.rstrip("\n")
    body, _, code = text.rpartition("\n")
    try:
        status = int(code.strip())
    except ValueError:
        return 0, None
    try:
        return status, json.loads(body) if body.strip() else None
    except json.JSONDecodeError:
        return status, None


def _info(out: str) -> tuple[str, dict, dict]:
    s = split_sections(out)
    status, info = _body(s.get("server_info", ""))
    probe = "/server_info"
    if status != 200 or not isinstance(info, dict):
        status, info = _body(s.get("get_server_info", ""))
        probe = "/get_server_info"
    _, models = _body(s.get("models", ""))
    return probe, (info if isinstance(info, dict) else {}), (models if isinstance(models, dict) else {})


def server_info(t: ssh.Target, address: str, port: int) -> tuple[str, dict, dict]:
    """(probe used, server info, /v1/models) — /server_info, else the deprecated /get_server_info."""
    out = ssh.run(t, ["sh", "-c", INFO_SCRIPT, "sh", address, str(port)], purpose="reading /server_info",
                  timeout=60, check=False, read=True)
    return _info(out.stdout)


def journal_tail(t: ssh.Target, unit: str, since: int, lines: int = 50, secrets=()) -> str:
    out = ssh.run(t, ["journalctl", "-u", unit, "--since", f"@{since}", "-n", str(lines), "--no-pager", "-o", "short-iso"],
                  purpose=f"reading the journal of {unit}", timeout=30, check=False, read=True)
    return ssh.redact(out.stdout.strip(), secrets)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def wait_ready(t: ssh.Target, unit: str, *, bind: str, port: int, declared: dict[str, Any], deadlines: ReadinessDeadlines,
               since: Optional[int], baseline: R.UnitState, progress: Callable[[str], None],
               others: Optional[Callable[[], Optional[str]]] = None) -> R.Report:
    """Poll until a verdict; returns the report (status is one of readiness.OUTCOMES).
    `since` None: the journal is not read (waiting for a server someone else started). `others`:
    asked at each poll while it loads, whether what else it waits for (a multi-node layout's
    ranks) makes waiting longer pointless: the reason, and the wait ends, timed out."""
    address = probe_address(bind)
    url = f"http://{address}:{port}"
    start = time.monotonic()
    deadline = deadlines.timeout_seconds
    # After a start the first poll already waits on the host (it answers at once if the unit stops
    # or the server is ready); a server someone else started is looked at once first.
    pause = deadlines.poll_initial_seconds if since is not None else 0.0
    ever_healthy = False
    ready_logged_at = None
    gen_timeout = deadlines.generation_timeout_seconds
    settle = deadlines.settle_seconds
    last_phase = None
    seen_port = ""
    while True:
        elapsed = time.monotonic() - start
        # The host waits up to `pause` for a signal of the server (port, ready line, generation);
        # never past the moment a verdict is due.
        limit = deadline if ready_logged_at is None else min(deadline, ready_logged_at + gen_timeout)
        obs, info_read, settled = snapshot(t, unit, address, port, gen_timeout, since, elapsed,
                                           wait=min(pause, max(0.0, limit - elapsed)), settle=settle,
                                           seen_port=seen_port, seen_ready=ready_logged_at is not None)
        elapsed = obs.elapsed
        seen_port = "closed" if obs.health == 0 else "open"
        if obs.logged_ready and ready_logged_at is None:
            ready_logged_at = elapsed
        verdict = R.judge(baseline, obs, deadline, ever_healthy,
                          None if ready_logged_at is None else ready_logged_at + gen_timeout)
        pointless = others() if others is not None and verdict.outcome is None else None
        if pointless:
            verdict = R.Verdict(R.TIMED_OUT, verdict.phase, f"still {verdict.phase} after {elapsed:.0f} s; stopped waiting: "
                                                           f"{pointless}")
        if verdict.phase != last_phase or verdict.outcome:
            progress(f"{unit}: {verdict.phase} ({elapsed:.0f} s)")
            last_phase = verdict.phase
        if verdict.outcome == R.READY:
            ever_healthy = True
            if settle:
                # Ready must last: a server that dies right after its first answer is not ready.
                # The host looked again `settle` s after the first answer, in the same round trip.
                again = settled
                if again is None:  # the answer was cut short: look again from here
                    time.sleep(settle)
                    again, info_read, _ = snapshot(t, unit, address, port, gen_timeout, since, time.monotonic() - start)
                verdict = R.judge(baseline, again, float("inf"), True)
                if verdict.outcome != R.READY:
                    verdict = R.Verdict(R.UNHEALTHY if verdict.outcome is None else verdict.outcome, "generating",
                                        verdict.reason or f"answered once, then /health_generate {again.health}")
        if verdict.outcome:
            if verdict.outcome == R.READY and info_read is None:
                info_read = server_info(t, address, port)
            return R.build_report(verdict, unit=unit, url=url, declared=declared, checked_at=now_iso(), info_read=info_read,
                                  seconds_to_ready=round(time.monotonic() - start, 1))
        pause = R.next_poll(pause, deadlines.poll_initial_seconds, deadlines.poll_max_seconds)
