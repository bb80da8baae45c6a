"""What serves on a host, as the host says it: the gpu-serving units it has, which one runs, for
which stack, since when, with what layout. Pure (the host's answer in, words out; cases in
tests/data/status/).

One read (`SERVING_SCRIPT`) answers three questions, so they cannot disagree:
- a switch preview: what serves now and will stop, and how its flags and environment differ from
  the declaration that replaces it (`switch_block`);
- a stack's drift check when another strategy took the host: `superseded: <unit> (stack <name>)
  serves since <time>`, not a line that looks like a hand edit (`superseded_by`);
- ``python -m components status``: the host's truth in one screen (`render_status`).
"""
from __future__ import annotations

import base64
import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

from .changes import environment_changes, flag_changes
from .facts import SHOW_OPTIONS
from .layout_words import layout_text
from .readiness import flag_groups
from .unit import MANAGED_UNITS_GREP, MARKER_KEY, ROUTED_KEY, UNIT_DIR, own_drop_ins

SUPERSEDED = "superseded: "

# $1: "environ" to read the running processes' environments too (a provider comparing them with
# a declaration; never the status command, which prints nothing of them). One block per unit of
# /etc/systemd/system that gpu-serving wrote (the marker key, or the header of older units): its
# stack, its `systemctl show` state, the main process's argv (and environment), NUL-separated, so
# base64. `@@now` is the host's uptime clock, which ActiveEnterTimestampMonotonic counts on.
SERVING_SCRIPT = r"""
cd """ + UNIT_DIR + r""" 2>/dev/null || exit 0
echo "@@now $(cut -d' ' -f1 /proc/uptime)"
for f in $(""" + MANAGED_UNITS_GREP + r"""); do
  echo "@@unit $f"
  stack=$(sed -n 's/^""" + MARKER_KEY + r"""=//p' "./$f" | head -n 1)
  [ -n "$stack" ] || stack=$(sed -n 's/^# Managed by gpu-serving (stack \([^)]*\)).*/\1/p' "./$f" | head -n 1)
  echo "Stack=$stack"
  echo "RoutedBy=$(sed -n 's/^""" + ROUTED_KEY + r"""=//p' "./$f" | head -n 1)"
  show=$(systemctl show """ + SHOW_OPTIONS + r""" -- "$f")
  printf '%s\n' "$show"
  pid=$(printf '%s\n' "$show" | sed -n 's/^MainPID=//p')
  if [ "${pid:-0}" -gt 0 ] 2>/dev/null; then
    echo "Cmdline=$(base64 -w0 "/proc/$pid/cmdline" 2>/dev/null)"
    if [ "$1" = environ ]; then echo "Environ=$(base64 -w0 "/proc/$pid/environ" 2>/dev/null)"; fi
  fi
done
if [ "$1" = environ ]; then echo "@@manager"; systemctl show-environment 2>/dev/null; fi
exit 0
"""

# The states in which a unit holds the GPUs and the port (switch.RUNNING, without "deactivating":
# a unit on its way down serves nothing more).
SERVING_STATES = ("active", "activating", "reloading")

# Flags that make up the layout, in the order they are shown.
LAYOUT_FLAGS = (("--tp-size", "tp"), ("--pp-size", "pp"), ("--ep-size", "ep"), ("--dp-size", "dp"))


@dataclass
class HostUnit:
    """One gpu-serving unit on the host and what its main process runs."""
    name: str
    stack: str
    active_state: str
    sub_state: str
    enabled: bool
    main_pid: int
    since: str  # systemd's ActiveEnterTimestamp, as the host prints it
    uptime_seconds: Optional[float]
    argv: list[str] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    drop_ins: list[str] = field(default_factory=list)  # its own (`systemctl edit`): hand edits
    routed_by: str = ""  # a fleet member's: the router that sends it requests (unit.ROUTED_KEY)

    @property
    def serving(self) -> bool:
        return self.active_state in SERVING_STATES and self.sub_state != "auto-restart"

    @property
    def layout(self) -> dict[str, Any]:
        return layout_of_argv(self.argv)

    @property
    def node_rank(self) -> tuple[int, int]:
        """(its rank, the number of nodes) in a multi-node layout; (0, 1) on one node."""
        flags = dict(flag_groups(self.argv))
        rank, nnodes = flags.get("--node-rank", "0"), flags.get("--nnodes", "1")
        return (int(rank) if rank.isdigit() else 0), (int(nnodes) if nnodes.isdigit() else 1)

    def as_dict(self) -> dict[str, Any]:
        return {"unit": self.name, "stack": self.stack, "active_state": self.active_state, "sub_state": self.sub_state,
                "enabled": self.enabled, "main_pid": self.main_pid, "since": self.since,
                "uptime_seconds": self.uptime_seconds, "layout": self.layout if self.argv else None}


@dataclass
class HostServing:
    units: list[HostUnit]
    manager: dict[str, str] = field(default_factory=dict)

    @property
    def serving(self) -> list[HostUnit]:
        """The units that run now, the longest running first."""
        return sorted((u for u in self.units if u.serving), key=lambda u: -(u.uptime_seconds or 0))

    def unit(self, name: str) -> Optional[HostUnit]:
        return next((u for u in self.units if u.name == name), None)


def _nul_split(text: str) -> list[str]:
    try:
        data = base64.b64decode(text.strip(), validate=False)
    except ValueError:
        return []
    return [p.decode(errors="replace") for p in data.split(b"\0") if p]


def parse_serving(stdout: str) -> HostServing:
    """SERVING_SCRIPT's answer."""
    now: Optional[float] = None
    blocks: list[dict[str, str]] = []
    manager: dict[str, str] = {}
    current: Optional[dict[str, str]] = None
    for line in stdout.splitlines():
        if line.startswith("@@now "):
            try:
                now = float(line.split()[1])
            except (IndexError, ValueError):
                now = None
            current = None
        elif line.startswith("@@unit "):
            current = {"@name": line[len("@@unit "):].strip()}
            blocks.append(current)
        elif line.strip() == "@@manager":
            current = manager
        elif current is not None and "=" in line:
            key, _, value = line.partition("=")
            current[key] = value
    units = []
    for b in blocks:
        try:
            pid = int(b.get("MainPID", "0") or 0)
        except ValueError:
            pid = 0
        uptime = None
        try:
            entered = int(b.get("ActiveEnterTimestampMonotonic", "0") or 0)
            if now is not None and entered > 0:
                uptime = max(0.0, round(now - entered / 1e6, 1))
        except ValueError:
            pass
        environ = dict(item.partition("=")[::2] for item in _nul_split(b.get("Environ", "")))
        units.append(HostUnit(name=b["@name"], stack=b.get("Stack", ""), active_state=b.get("ActiveState", "unknown"),
                              sub_state=b.get("SubState", ""), enabled=b.get("UnitFileState") == "enabled",
                              main_pid=pid, since=b.get("ActiveEnterTimestamp", ""), uptime_seconds=uptime,
                              argv=_nul_split(b.get("Cmdline", "")) if pid else [], environ=environ if pid else {},
                              drop_ins=own_drop_ins(b["@name"], b.get("DropInPaths", "")), routed_by=b.get("RoutedBy", "")))
    return HostServing(units, manager)


def layout_of_argv(argv: list[str]) -> dict[str, Any]:
    flags = dict(flag_groups(argv))
    out: dict[str, Any] = {}
    for flag, key in LAYOUT_FLAGS:
        value = flags.get(flag, "1")
        out[f"{key}_size"] = int(value) if value.isdigit() else value
    out["enable_dp_attention"] = "--enable-dp-attention" in flags
    if "--port" in flags:
        out["port"] = int(flags["--port"]) if flags["--port"].isdigit() else flags["--port"]
    if "--host" in flags:
        out["host"] = flags["--host"]
    return out


def describe_layout(layout: Optional[dict[str, Any]]) -> str:
    if not layout:
        return "layout unknown (no process)"
    return layout_text(layout)


def describe_uptime(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _stack_of(u: HostUnit) -> str:
    return f"stack {u.stack}" if u.stack else "stack unknown"


def superseded_by(unit: str, host: HostServing) -> Optional[str]:
    """When `unit` does not run and another gpu-serving unit serves: the words a drift check shows
    (`superseded: <unit> (stack <name>) serves since <time>`), so a switch made by another stack
    reads as a switch, never as a hand edit. None when `unit` runs or nothing else serves."""
    own = host.unit(unit)
    if own is not None and own.serving:
        return None
    others = [u for u in host.serving if u.name != unit]
    if not others:
        return None
    u = others[0]
    return f"{SUPERSEDED}{u.name} ({_stack_of(u)}) serves since {u.since or 'an unknown time'}"


BOOT_DISAGREES = "enabled/active disagree with what serves: a reboot would start "


def boot_disagreement(host: HostServing) -> Optional[str]:
    """What a reboot would start, when it is not what serves now (an interrupted switch leaves the
    new unit running but not enabled, the old one stopped but enabled; a hand `systemctl enable`
    of a second strategy): `enabled/active disagree with what serves: a reboot would start <unit>
    ...`. None when exactly the unit that serves is enabled, or nothing serves."""
    serving = host.serving
    if not serving:
        return None
    now = serving[0]
    enabled = [u for u in host.units if u.enabled]
    if [u.name for u in enabled] == [now.name]:
        return None
    if not enabled:
        starts = "nothing"
    else:
        starts = " and ".join(f"{u.name} ({_stack_of(u)})" for u in enabled)
        if len(enabled) > 1:
            starts += " together (either could end up serving)"
    fix = f"`pulumi up --stack {now.stack}` enables it and disables the others" if now.stack else \
        "an up of the stack that serves enables it and disables the others"
    return (f"{BOOT_DISAGREES}{starts}, while {now.name} ({_stack_of(now)}) serves"
            + (", not enabled" if not now.enabled else "") + f": {fix}")


def destroy_warning(*, unit: str, stack: str, where: str, outputs: Optional[dict[str, Any]],
                    declared: Optional[str] = None, removed: bool = False) -> Optional[str]:
    """What a destroy's preview says when the stack's unit serves (its `active` output, as the
    refresh before the preview read it): nothing will serve on that host afterwards. None when
    it does not serve (a superseded or stopped stack: its destroy takes nothing away).
    `declared`: the machine the stack names now, when it is not `where` (the stack was pointed at
    another machine: its unit moves there, and this is the half that stops it here). `removed`:
    the stack no longer lists that host (its gpu-serving:hosts entry was removed)."""
    if not isinstance(outputs, dict) or outputs.get("active") is not True or is_superseded(outputs.get("runningServer")):
        return None
    if removed:
        return (f"{where} is no longer in gpu-serving:hosts: stack {stack}'s {unit}, which serves there now (as this "
                f"run's refresh read it), is stopped and removed; nothing of stack {stack} will serve there afterwards.")
    if declared:
        return (f"stack {stack} now names {declared}: {unit} is stopped and removed on {where}, where it serves "
                f"now (as this run's refresh read it); nothing of stack {stack} will serve on {where} afterwards.")
    return (f"destroying stack {stack} stops {unit}, which serves on {where} now (as this run's refresh read it): "
            f"nothing will serve on {where} afterwards. To keep serving, deploy another strategy stack first "
            "(`pulumi up --stack <strategy>`: the switch stops this one).")


def is_superseded(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(SUPERSEDED)


def switch_block(*, label: str, target_unit: str, target_stack: str, declared_argv: list[str],
                 declared_environment: dict[str, str], secret_keys: list[str], host: HostServing,
                 ignore_variables: frozenset[str] = frozenset(), max_lines: int = 40) -> list[str]:
    """The lines a switch preview prints, read from the host: what serves now, that it will stop,
    and each flag and variable that differs between what it runs and what replaces it. Empty when
    `target_unit` already serves alone, or nothing serves. No secret value is ever shown: secret
    variables are left out, and a variable the new declaration does not set is named only."""
    others = [u for u in host.serving if u.name != target_unit]
    if not others:
        return []
    new_layout = layout_of_argv(declared_argv)
    lines = []
    for u in others:
        lines.append(f"{label}: {u.name} ({_stack_of(u)}) serves now, since {u.since or '?'} "
                     f"(up {describe_uptime(u.uptime_seconds)}), {describe_layout(u.layout if u.argv else None)}")
        lines.append(f"{label}: it will stop; {target_unit} (stack {target_stack}) starts, {describe_layout(new_layout)}")
    u = others[0]
    if u.argv:
        flag_lines = flag_changes(u.argv, [str(a) for a in declared_argv])
        lines.append(f"  flags ({u.stack or u.name} -> {target_stack}):" + (" identical" if not flag_lines else ""))
        lines += [f"    {x}" for x in flag_lines]
    if u.environ:
        hidden = set(secret_keys) | set(ignore_variables)
        running = {k: v for k, v in u.environ.items()
                   if k in declared_environment or (host.manager.get(k) != v and k not in ignore_variables)}
        # A variable the running server has and the new declaration lacks may be a secret of the
        # old one: named, never shown.
        shown = {k: v for k, v in running.items() if k in declared_environment}
        env_lines = environment_changes(shown, declared_environment, hidden=frozenset(hidden))
        env_lines += [f"{k}: set now -> (not set)" for k in sorted(set(running) - set(declared_environment) - hidden)]
        lines.append("  environment:" + (" identical" if not env_lines else ""))
        lines += [f"    {x}" for x in env_lines]
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [f"  ... {len(lines) - max_lines + 1} more lines: "
                                          f"python -m components plan --stack {target_stack} --against {u.stack or '<stack>'}"]
    return lines


# --- python -m components status --------------------------------------------------------------

def file_drift(declared: str, on_host: Optional[str], *, hide_values: bool = False, max_lines: int = 4) -> Optional[str]:
    """None when the host's file is the declared one; otherwise a short description (changed
    lines, never values of a file that may hold secrets)."""
    if on_host is None:
        return "missing on the host"
    if declared == on_host:
        return None
    changed = [line for line in difflib.unified_diff(declared.splitlines(), on_host.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    if hide_values:
        keys = sorted({line[1:].partition("=")[0] for line in changed})
        return f"differs ({len(changed)} line(s); variables {', '.join(keys)})"
    shown = changed[:max_lines] + ([f"... {len(changed) - max_lines} more"] if len(changed) > max_lines else [])
    return "differs: " + "; ".join(shown)


def strip_secret_lines(text: str, secret_keys: list[str]) -> str:
    """The environment file without the secret variables' lines (appended after the plain part)."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not any(line.startswith(f"{k}=") for k in secret_keys))


def fitness_lines(f: Optional[dict[str, Any]]) -> list[str]:
    """The host's fitness (fitness_read.FitnessNow.as_dict): its drift from the benchmark baseline
    (the drift check's own line), what is degraded now, what could not be read."""
    if not f:
        return []
    out = [f"  fitness   {f['drift']}" if f.get("drift") else
           f"  fitness   as {f['baseline']} measured it" if f.get("baseline") else
           "  fitness   no benchmark baseline on this host (`python -m components bench` records one)"]
    out += [f"  degraded  {d}" for d in f.get("degraded") or []]
    out += [f"  warning   fitness: {p}" for p in f.get("problems") or []]
    return out


def render_status(doc: dict[str, Any]) -> str:
    """One screen per host: what serves, its readiness now, and each stack's files."""
    out = []
    for h in doc["hosts"]:
        out.append(f"host {h['host']}" + (f" (hosts[{h['entry']}])" if h.get("entry") else ""))
        if h.get("error"):
            out.append(f"  error: {h['error']}")
            continue
        serving = h.get("serving")
        if h.get("down"):
            out.append(f"  down      {h['down']}")
        elif not serving:
            out.append("  serving   nothing: no gpu-serving unit runs")
        else:
            out.append(f"  serving   {serving['unit']} (stack {serving['stack'] or 'unknown'}), "
                       f"{describe_layout(serving['layout'])}")
            out.append(f"  since     {serving['since']} (up {describe_uptime(serving['uptime_seconds'])}), "
                       f"pid {serving['main_pid']}")
            r = h.get("readiness") or {}
            text = r.get("status", "?")
            if r.get("reason"):
                text += f": {r['reason']}"
            out.append(f"  readiness {text} (now, {r.get('probe', '/health_generate')} from the host)")
        router = h.get("router")
        if router:
            out.append(f"  router    {router['text']}")
        for other in h.get("also_running", []):
            out.append(f"  warning   also running: {other['unit']} (stack {other['stack']})")
        if h.get("boot"):
            out.append(f"  warning   {h['boot']}")
        out += fitness_lines(h.get("fitness"))
        for s in h["stacks"]:
            mark = "*" if serving and s["unit"] == serving["unit"] else " "
            state = s.get("state", "not on this host")
            drift = s.get("drift") or []
            files = "" if s.get("state") == "not on this host" else (
                "; files as declared" if not drift else "; DRIFT: " + " | ".join(drift))
            out.append(f"  {mark} {s['stack']:<10} {s['unit']}  {state}{files}")
    summary = doc.get("summary")
    if summary:
        out.append(summary)
    return "\n".join(out)
