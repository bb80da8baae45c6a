"""The switch decision: from the gpu-serving units the host has, which to stop, which to disable,
and whether to start the target. Pure (state in, steps out; cases in tests/data/switch/).

Exclusivity (one strategy on the GPUs and the port) is decided here, at switch time, from what
the host has, not from the strategy files of the project: a unit's text never names the other
strategies, so adding or removing a layout file changes nothing that serves. Every unit of ours
uses all the host's GPUs, so every other serving unit on the host is stopped, whatever its model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .facts import split_sections
from .reads import SERVICE_PROPS
from .unit import MARKER_KEY, UNIT_DIR

# Units written before the marker key carry only this header; both are recognised.
MANAGED_HEADER = "# Managed by gpu-serving (stack "

# $1: the target unit. The unit files of /etc/systemd/system that gpu-serving wrote (the marker
# key, or the header of older units), the target first, then `systemctl show` of them all in
# that order (one block each; Id is empty for a unit systemd does not know).
MANAGED_UNITS_SCRIPT = (
    f"cd {UNIT_DIR} 2>/dev/null || exit 0\n"
    f"others=$(grep -l -s -e '^{MARKER_KEY}=' -e '^{MANAGED_HEADER.replace('(', '[(]')}' -- *.service"
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


@dataclass
class SwitchSteps:
    """What a switch does, in this order: stop `stop` (and wait), start the target (`start`:
    "start" | "restart" | None), then enable it when `enable` and disable `disable`.
    `rollback_to`: the unit to start again when the target fails (None: nothing served)."""
    stop: list[str] = field(default_factory=list)
    start: Optional[str] = None
    enable: bool = False
    disable: list[str] = field(default_factory=list)
    rollback_to: Optional[str] = None

    def as_dict(self) -> dict:
        return {"stop": self.stop, "start": self.start, "enable": self.enable, "disable": self.disable,
                "rollback_to": self.rollback_to}


def decide(unit: str, units: dict[str, dict[str, str]], *, restart: bool, active: bool = True,
           enabled: bool = True) -> SwitchSteps:
    """The steps that make `unit` the one strategy serving (or, with `active` false, stopped).

    `units`: the managed units of the host and their state (`parse_managed_units`); `restart`:
    the declared configuration changed since the target last started."""
    own = units.get(unit, {})
    others = [u for u in units if u != unit]
    # The active one first: the strategy that really served is the one to come back.
    running = sorted((u for u in others if units[u].get("ActiveState") in RUNNING),
                     key=lambda u: units[u].get("ActiveState") != "active")
    enabled_others = [u for u in others if units[u].get("UnitFileState") == "enabled"]
    # A unit waiting to be restarted by systemd after a crash is not serving: it is started again.
    crash_looping = own.get("SubState") == "auto-restart"
    own_running = own.get("ActiveState") in ("active", "activating", "reloading") and not crash_looping
    if not active:
        return SwitchSteps(stop=[unit], enable=enabled and own.get("UnitFileState") != "enabled")
    enable = enabled and own.get("UnitFileState") != "enabled"
    disable = enabled_others if enabled else []
    if own_running and not restart:
        # Serving already: only another strategy that runs beside it (started by hand) goes.
        return SwitchSteps(stop=running, enable=enable, disable=disable)
    # A failed restart of the serving unit itself falls back to its files as they were.
    rollback_to = running[0] if running else (unit if own_running else None)
    return SwitchSteps(stop=running, start="restart" if own_running or crash_looping else "start", enable=enable,
                       disable=disable, rollback_to=rollback_to)
