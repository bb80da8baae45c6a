"""What a serving unit is doing on its host, read back: its systemd state, what its main process
runs (compared with the declaration), its drop-ins and the environment systemd would start it
with. One read (reads.SERVICE_SCRIPT) serves a refresh, the last step of a switch and a check."""
from __future__ import annotations

import base64
from typing import Any, Mapping, Optional

from ..core import dropins, reads
from ..core import readiness as R
from ..core import status as S
from ..core.facts import parse_systemctl_show, split_sections
from ..core import unit as unit_files
from ..core.specs import ServiceSpec
from . import ssh

# Outputs a read adds only when there is something to say (a state without them reads as before):
# each read says them anew.
READ_ONLY_WHEN_SO = ("dropIns", "othersEnabled", "owner", "foreignDropIns", "effectiveEnvironment")


# The outputs a switch adds (never inputs: a read hands the engine the inputs without them).
SWITCH_OUTPUTS = ("previous", "readinessReport", "switchFailure")


def without_last_reading(props: Mapping[str, Any]) -> dict:
    return {k: v for k, v in props.items() if k not in READ_ONLY_WHEN_SO}


def declared_inputs(state: Mapping[str, Any]) -> dict:
    """A service's stored state without what its switches add: the inputs a read gives back."""
    return {k: v for k, v in state.items() if k not in SWITCH_OUTPUTS}


def states(stdout: str, units: list[str]) -> dict[str, dict[str, str]]:
    """`systemctl show` blocks by unit (in argument order; Id may be empty for unknown units)."""
    shown = parse_systemctl_show(stdout)
    blocks = list(shown.values())
    return {u: (shown.get(u) or (blocks[i] if i < len(blocks) else {})) for i, u in enumerate(units)}


def show(t: ssh.Target, units: list[str]) -> dict[str, dict[str, str]]:
    return states(ssh.fetch(t, reads.unit_states(units)).stdout, units)


def serving(t: ssh.Target, unit: str) -> bool:
    """The unit runs now (not crash-looping)."""
    state = show(t, [unit])[unit]
    return state.get("ActiveState") == "active" and state.get("SubState") != "auto-restart"


def split_read(stdout: str) -> tuple[str, dict[str, str]]:
    """SERVICE_SCRIPT's answer: the `systemctl show` block, and the process sections."""
    head, marker, rest = stdout.partition("\n@@cmdline\n")
    return head, (split_sections("@@cmdline\n" + rest) if marker else {})


def running(spec: ServiceSpec, state: dict[str, str], sections: dict[str, str]) -> str:
    """`runningServer`: AS_DECLARED, NOT_RUNNING, or what the main process runs otherwise
    (R.running_reason). Secret values are compared here and never leave this function."""
    if state.get("ActiveState") not in ("active", "reloading") or not sections.get("cmdline", "").strip():
        return R.NOT_RUNNING
    if not spec.compares_process:
        return R.AS_DECLARED  # a state written before the process was compared: nothing to compare with
    try:
        argv = R.split_nul(base64.b64decode(sections.get("cmdline", "").strip()))
        environ = R.split_nul(base64.b64decode(sections.get("environ", "").strip()))
    except ValueError:
        return R.NOT_RUNNING  # the process ended while it was read
    running_env = dict(item.partition("=")[::2] for item in environ)
    manager = dict(line.partition("=")[::2] for line in sections.get("manager", "").splitlines() if "=" in line)
    same = {key: running_env.get(key) == value for key, value in dict(spec.secret_environment).items()}
    differences = R.compare_running(spec.argv, dict(spec.environment), same, argv, running_env, manager)
    return R.running_reason(differences) if differences else R.AS_DECLARED


def outputs(spec: ServiceSpec, live: str) -> dict[str, Any]:
    """A switch's outputs about the unit from `live` (SERVICE_SCRIPT's answer after its last step)."""
    head, sections = split_read(live)
    state = states(head, [spec.unit])[spec.unit]
    return {"active": state.get("ActiveState") == "active" if spec.active else False,
            "enabled": state.get("UnitFileState") == "enabled",
            "runningServer": running(spec, state, sections) if spec.active and state.get("LoadState") != "not-found"
            else R.NOT_RUNNING}


def read_live(t: ssh.Target, spec: ServiceSpec, props: Mapping[str, Any]) -> Optional[dict]:
    """The unit now: active, enabled, what it runs, and its drift fields; None: not there."""
    request, = reads.service(dict(props))
    head, sections = split_read(ssh.fetch(t, request).stdout)
    state = states(head, [spec.unit])[spec.unit]
    if state.get("LoadState") == "not-found":
        if state.get("ActiveState") not in S.SERVING_STATES:
            return None
        # Its file deleted by hand (and systemd reloaded) while it runs: systemd keeps it
        # running, and the unit file's resource shows the deletion and writes the file back,
        # which is the whole repair. Read as gone, the preview would promise a start of a
        # model that the update then leaves serving. Without its file systemd cannot say
        # whether it is enabled: the last reading stands.
        return {"active": state.get("ActiveState") == "active", "enabled": spec.enabled,
                "runningServer": running(spec, state, sections)}
    live: dict[str, Any] = {"active": state.get("ActiveState") == "active", "enabled": state.get("UnitFileState") == "enabled",
                            "runningServer": running(spec, state, sections)}
    # Drop-ins of the unit (`systemctl edit`): hand edits, drift until an up removes them. The
    # key only when there are some, so a state without any reads as before.
    drop_ins = unit_files.own_drop_ins(spec.unit, state.get("DropInPaths", ""))
    if drop_ins:
        live["dropIns"] = drop_ins
    # Every other drop-in systemd applies (a package's under /usr/lib) and the environment it
    # would start with: drift an up does not remove (dropins.py).
    live.update(dropins.live_fields(dict(props), state.get("DropInPaths", ""), sections, lambda x: ssh.redact(x, spec.secrets)))
    # Another strategy enabled by hand beside the one that serves: a reboot would start both
    # and either could end up serving. Said by the serving unit only (the others' stacks are
    # superseded anyway); its up disables them, as a switch does.
    others = sorted(line.strip() for line in sections.get("others-enabled", "").splitlines() if line.strip())
    if others and live["active"] and spec.enabled:
        live["othersEnabled"] = others
    return live


def superseded(t: ssh.Target, unit: str) -> Optional[str]:
    """`superseded: <unit> (stack <name>) serves since <time>` when another gpu-serving unit
    serves in this one's place: a switch by another stack, not an edit of this one."""
    try:
        # With the environments: the very read the switch preview makes (check), so one
        # answer serves both, and the readiness read's (ssh.run's `reuse`).
        return S.superseded_by(unit, S.parse_serving(ssh.fetch(t, reads.serving(with_environ=True)).stdout))
    except ssh.RemoteError:
        return None  # "not running" stays true; the drift shows either way
