"""The switch as a plan: from what the host has (the gpu-serving units and their state, who holds
the serving port) and what the stack declares, the ordered steps that make the declared unit the
one strategy serving, and the steps that undo a failed start. Pure (state in, steps out; cases in
tests/data/switch/); components/remote/providers.py only executes the steps, in order.

Exclusivity (one strategy on the GPUs and the port) is decided here, at switch time, from what
the host has, not from the strategy files of the project: a unit's text never names the other
strategies, so adding or removing a layout file changes nothing that serves. Every unit of ours
uses all the host's GPUs, so every other serving unit on the host is stopped, whatever its model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .facts import split_sections
from .readiness import AS_DECLARED, NOT_RUNNING
from .reads import SERVICE_PROPS
from .status import is_superseded
from .unit import MANAGED_UNITS_GREP, UNIT_DIR, own_drop_ins


# $1: the target unit, $2: the serving port. Who listens on the port (`ss`) and each listener's
# cgroup (`foreign_listener` tells ours from a foreign process), then the unit files of
# /etc/systemd/system that gpu-serving wrote (the marker key, or the header of older units), the
# target first, then `systemctl show` of them all in that order (one block each; Id is empty for
# a unit systemd does not know). One round trip: what the switch reads before it stops anything.
MANAGED_UNITS_SCRIPT = (
    "listeners=$(ss -Hltnp \"sport = :$2\" 2>/dev/null)\n"
    "echo @@listeners; printf '%s\\n' \"$listeners\"\n"
    "for pid in $(printf '%s\\n' \"$listeners\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do\n"
    "  echo \"@@cgroup $pid\"; cat \"/proc/$pid/cgroup\" 2>/dev/null\ndone\n"
    f"cd {UNIT_DIR} 2>/dev/null || exit 0\n"
    f"others=$({MANAGED_UNITS_GREP}"
    " | grep -v -x -F -e \"$1\")\n"
    "echo @@units; printf '%s\\n' \"$1\" $others\n"
    "echo @@show; systemctl show " + " ".join(f"-p {p}" for p in SERVICE_PROPS) + " -- \"$1\" $others\n"
)

# States in which a unit holds, or is about to hold, the GPUs and the port.
RUNNING = ("active", "activating", "reloading", "deactivating")


def parse_managed_units(stdout: str) -> dict[str, dict[str, str]]:
    """MANAGED_UNITS_SCRIPT's answer: unit -> its `systemctl show` properties, target first."""
    s = split_sections(stdout)
    names = [n for n in s.get("units", "").split() if n]
    # By position, not by Id: a unit systemd does not know yet has an empty one.
    blocks = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
              for block in re.split(r"\n[ \t]*\n", s.get("show", "").strip()) if block.strip()]
    return {n: (blocks[i] if i < len(blocks) else {}) for i, n in enumerate(names)}


# What a switch does on the host, one action per step:
# - daemon-reload: systemd reads the unit files again (a unit written or changed since it did);
# - stop <units>: returns when they are down, so the next strategy never finds the GPUs or the
#   port still held;
# - start|restart <unit>: resets the unit's crash-loop counter first (a deliberate start is not a
#   crash loop: StartLimitBurst would refuse the 4th switch within StartLimitIntervalSec), then
#   waits for readiness, a real generation; when it fails, the plan's `on_failure` runs;
# - enable <unit> / disable <units>: the serving strategy, and only it, comes back after a reboot;
# - restore-files: the files this run replaced go back byte for byte (then daemon-reload when any);
# - remove-drop-ins <paths>: the unit's own drop-ins go (kept for restore-files), before the reload.
ACTIONS = ("daemon-reload", "stop", "start", "restart", "enable", "disable", "restore-files", "remove-drop-ins")

# $@: the drop-ins to remove (own_drop_ins); their directory goes too when nothing else is left in it.
REMOVE_DROP_INS_SCRIPT = 'rm -f -- "$@" || exit; for f; do rmdir -- "${f%/*}" 2>/dev/null; done; exit 0'


@dataclass(frozen=True)
class Step:
    action: str
    units: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown switch step {self.action!r}; one of {', '.join(ACTIONS)}")

    def __str__(self) -> str:
        return " ".join((self.action, *self.units))


@dataclass
class SwitchPlan:
    """The steps that make `unit` what the stack declares, in order. `reason`: why these steps (or
    why none); `previous`: the strategy that served and is stopped; `rollback_to`: the unit started
    again when the start fails (None: nothing served before); `on_failure`: the steps that undo a
    failed start; `refused`: the switch must not begin (no step runs), and the message says why."""
    unit: str
    steps: list[Step]
    reason: str
    previous: Optional[str] = None
    rollback_to: Optional[str] = None
    on_failure: list[Step] = field(default_factory=list)
    refused: Optional[str] = None

    @property
    def starts(self) -> Optional[Step]:
        return next((s for s in self.steps if s.action in ("start", "restart")), None)

    @property
    def progress(self) -> Optional[str]:
        """The line the switch shows before it stops or starts anything (None: it does neither)."""
        stops = [u for s in self.steps if s.action == "stop" for u in s.units if u != self.unit]
        if stops:
            return ("starting" if self.starts else "serving") + f" (stops {', '.join(stops)})"
        return "starting" if self.starts else None

    def as_dict(self) -> dict[str, Any]:
        return {"steps": [str(s) for s in self.steps], "reason": self.reason, "previous": self.previous,
                "rollback_to": self.rollback_to, "on_failure": [str(s) for s in self.on_failure],
                "refused": self.refused}


def plan(unit: str, units: dict[str, dict[str, str]], *, restart: bool, active: bool = True, enabled: bool = True,
         port_holder: Optional[str] = None, port: Optional[int] = None, host: str = "the host") -> SwitchPlan:
    """The steps that make `unit` the one strategy serving (or, with `active` false, stopped).

    `units`: the managed units of the host and their state (`parse_managed_units`, `unit` among
    them; {} when systemd does not know it); `restart`: the declared configuration changed since
    the unit last started (`why_restart`); `port_holder`: a process that holds the serving port and
    is not one of these units (`foreign_listener`); `host`: the host's label, for the messages."""
    p = _plan(unit, units, restart=restart, active=active, enabled=enabled, port_holder=port_holder, port=port, host=host)
    drop_ins = next((s.units for s in p.steps if s.action == "remove-drop-ins"), ())
    if drop_ins:
        p.reason += f"; its drop-ins (hand edits of the unit) removed: {', '.join(drop_ins)}"
    return p


def _plan(unit: str, units: dict[str, dict[str, str]], *, restart: bool, active: bool, enabled: bool,
          port_holder: Optional[str], port: Optional[int], host: str) -> SwitchPlan:
    if port_holder:
        return SwitchPlan(unit, [], f"port {port} is held by {port_holder}, not a gpu-serving strategy unit", refused=(
            f"port {port} on {host} is held by {port_holder}, which is not a gpu-serving strategy unit; "
            f"refusing to switch (nothing was stopped). Free the port or set gpu-serving:serving.port."))
    own = units.get(unit, {})
    drop_ins = own_drop_ins(unit, own.get("DropInPaths", ""))
    # The unit file changed since systemd read it, or systemd does not know the unit yet, or its
    # drop-ins go.
    reload = own.get("NeedDaemonReload") == "yes" or own.get("LoadState") in (None, "not-found") or bool(drop_ins)
    steps = ([Step("remove-drop-ins", tuple(drop_ins))] if drop_ins else []) + ([Step("daemon-reload")] if reload else [])
    enable = [Step("enable", (unit,))] if enabled and own.get("UnitFileState") != "enabled" else []
    if not active:
        # Enabled first: a stopped unit declared enabled comes back after a reboot.
        if own.get("ActiveState") == "inactive":
            return SwitchPlan(unit, steps + enable, f"{unit} is declared stopped and does not run: nothing to stop")
        return SwitchPlan(unit, steps + enable + [Step("stop", (unit,))], f"{unit} is declared stopped")
    others = [u for u in units if u != unit]
    # The active one first: the strategy that really served is the one to come back.
    running = sorted((u for u in others if units[u].get("ActiveState") in RUNNING),
                     key=lambda u: units[u].get("ActiveState") != "active")
    previous = next((u for u in running if units[u].get("ActiveState") == "active"), None)
    stop = [Step("stop", tuple(running))] if running else []
    # Enabled only after it serves, the others disabled after that: an interrupted switch never
    # leaves the failed strategy as the one a reboot brings back.
    disable = [u for u in others if units[u].get("UnitFileState") == "enabled"] if enabled else []
    after = enable + ([Step("disable", tuple(disable))] if disable else [])
    # A unit waiting to be restarted by systemd after a crash is not serving: it is started again.
    crash_looping = own.get("SubState") == "auto-restart"
    own_running = own.get("ActiveState") in ("active", "activating", "reloading") and not crash_looping
    if own_running and not restart:
        # Serving already: only another strategy that runs beside it (started by hand) goes.
        steps += stop + after
        if not steps:
            return SwitchPlan(unit, [], f"{unit} serves as declared, no other strategy runs and only it is enabled: "
                                        "nothing to do")
        return SwitchPlan(unit, steps, f"{unit} serves as declared" + (
            f"; {', '.join(running)} ran beside it" if running else "") + (
            "; made the only one enabled" if after else ""), previous=previous)
    verb = "restart" if own_running or crash_looping else "start"
    # A failed restart of the serving unit itself falls back to its files as they were.
    rollback_to = running[0] if running else (unit if own_running else None)
    # The failed unit is stopped before anything else starts (it may hold GPUs) and is not left
    # enabled (unless it is what comes back); the replaced files go back before the previous
    # strategy starts: it must run with what it ran with, not with what made the new one fail.
    on_failure = [Step("stop", (unit,))] + ([Step("disable", (unit,))] if rollback_to != unit else []) \
        + [Step("restore-files")] + ([Step("start", (rollback_to,))] if rollback_to else [])
    if crash_looping:
        reason = f"{unit} is crash-looping (systemd waits to restart it): started again now"
    elif own_running:
        reason = f"{unit} serves, but the declaration changed since it started: restarted"
    else:
        reason = f"{unit} does not run: started" + (f" after {', '.join(running)} stopped" if running else "")
    return SwitchPlan(unit, steps + stop + [Step(verb, (unit,))] + after, reason, previous=previous,
                      rollback_to=rollback_to, on_failure=on_failure)


def parse_listeners(stdout: str) -> tuple[str, dict[str, str]]:
    """MANAGED_UNITS_SCRIPT's listeners: (`ss` lines, pid -> its /proc/<pid>/cgroup)."""
    s = split_sections(stdout)
    return s.get("listeners", ""), {k.split()[1]: v for k, v in s.items() if k.startswith("cgroup ") and len(k.split()) == 2}


def foreign_listener(ss_out: str, cgroups: dict[str, str], ours: list[str]) -> Optional[str]:
    """From `ss -Hltnp sport = :<port>` and each listening pid's /proc/<pid>/cgroup: the first
    process that holds the port and runs in none of our units (`pid N (name)`), or None."""
    for pid in listener_pids(ss_out):
        if not any(u in cgroups.get(pid, "") for u in ours):
            name = re.search(r'users:\(\("([^"]+)"', ss_out)
            return f"pid {pid} ({name.group(1) if name else 'unknown'})"
    return None


def listener_pids(ss_out: str) -> list[str]:
    return sorted(set(re.findall(r"pid=([0-9]+)", ss_out)))


def runs_an_edit(olds: dict[str, Any]) -> bool:
    """The process ran other settings than declared at the last read (a hand edit and restart);
    another strategy serving in its place (superseded) is a switch to make, not an edit."""
    running = olds.get("runningServer", AS_DECLARED)
    return running not in (AS_DECLARED, NOT_RUNNING) and not is_superseded(running)


def switch_planned(olds: Optional[dict[str, Any]], news: dict[str, Any]) -> bool:
    """Whether a create or update of a strategy unit's service starts or restarts it, so that the
    host stops serving its current strategy for a while: the one case in which a fleet's run says
    how its hosts switch (the roll order, or that they all stop at once). `olds`: the stored
    outputs (None for a create), read back by the refresh; `news`: the declared inputs. An update
    that only rewrites settings the server does not run with (the connection, readiness
    deadlines) starts nothing."""
    if news.get("active", True) is False:
        return False  # declared stopped: a stop, not a switch
    if not olds:
        return True
    if olds.get("active", True) is False or olds.get("runningServer", AS_DECLARED) != AS_DECLARED:
        return True   # not serving as declared (another strategy serves, or nothing): the update starts it
    # A state without execStart (an earlier version) is taken as serving what it declares.
    return why_restart(olds, news, lambda: AS_DECLARED) is not None


def why_restart(olds: dict[str, Any], news: dict[str, Any], running_now: Callable[[], str]) -> Optional[str]:
    """Why an update restarts the unit (None: it need not). `running_now`: what the process runs,
    read from the host; asked only for a state written by an earlier version (no execStart), whose
    hash covered the whole unit text and so always differs: the process itself then says whether
    it already runs what is declared, so an upgrade never restarts a model that serves as declared."""
    changed = olds.get("configHash") != news.get("configHash")
    if changed and "execStart" not in olds:
        changed = running_now() != AS_DECLARED
    if changed:
        return "the declared configuration changed"
    if olds.get("declared") != news.get("declared"):
        return "the declared layout changed"
    if runs_an_edit(olds):
        # Rewriting the files alone would leave it running the edit.
        return f"it runs other settings than declared: {olds['runningServer']}"
    return None
