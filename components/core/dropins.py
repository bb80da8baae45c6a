"""What systemd applies to a serving unit beyond its file: every drop-in (`DropInPaths`) and the
environment that results. Pure (the host's answer in, drift lines out; cases in
tests/data/dropins/); the drift check (ServiceProvider) and `python -m components status` read
the same answer (reads.SERVICE_SCRIPT) and say the same lines.

Three kinds of drop-in:
- the unit's own (`<unit>.d` under /etc or /run: `systemctl edit`): hand edits, which an up
  removes (unit.own_drop_ins; reported as `dropIns`, not here);
- any other drop-in for this unit alone, or for units named like it (`<unit>.d` or a
  `<prefix>-.service.d` directory anywhere systemd reads: /usr/lib, /lib, /usr/local/lib, ...):
  a package's or a configuration tool's, which an up leaves (it is not gpu-serving's to delete):
  each is drift with every setting it makes;
- a drop-in for every service (`service.d`): the operating system's; drift only for what it does
  to the environment.
The environment (systemd's `Environment`, `EnvironmentFiles`, `UnsetEnvironment`,
`PassEnvironment` of the loaded unit) is compared with what the unit file declares, so a variable
a drop-in adds or changes is named whichever drop-in it came from.
"""
from __future__ import annotations

import shlex
from typing import Any, Callable, Optional

from .errors import secret_kind
from .rules import credential_name
from .unit import own_drop_ins

# The unit's settings that make up its environment.
ENVIRONMENT_KEYS = ("Environment", "EnvironmentFile", "UnsetEnvironment", "PassEnvironment")
SHOWN_VALUE = 80  # longest value shown in a line


def split_assignments(text: str) -> list[str]:
    """One `Environment=` value (or systemctl show's) as its assignments, systemd's quoting undone."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _value(key: str, value: str, hidden: frozenset[str]) -> str:
    """A variable's value as a drift line may show it: a credential's never."""
    if key in hidden or credential_name(key) or secret_kind(value):
        return "(value not shown)"
    return value if len(value) <= SHOWN_VALUE else value[:SHOWN_VALUE - 3] + "..."


def settings_of(text: str) -> list[tuple[str, str]]:
    """A unit file's or drop-in's settings, in order: (key, value); comments, sections and blank
    lines left out, continued lines joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.append((key.strip(), value.strip()))
    return out


def _environment_of(settings: list[tuple[str, str]]) -> dict[str, str]:
    """The variables `Environment=` lines set, in order (an empty one resets them, as systemd does)."""
    env: dict[str, str] = {}
    for key, value in settings:
        if key != "Environment":
            continue
        if not value:
            env.clear()
        for item in split_assignments(value):
            name, sep, v = item.partition("=")
            if sep:
                env[name] = v
    return env


def _files_of(settings: list[tuple[str, str]]) -> list[str]:
    return [value.lstrip("-") for key, value in settings if key == "EnvironmentFile" and value]


def _for_this_unit(unit: str, path: str) -> bool:
    """A drop-in in `<unit>.d`, or in a `<prefix>-.<type>.d` directory whose prefix names this unit."""
    directory = path.rpartition("/")[0].rpartition("/")[2]
    if not directory.endswith(".d"):
        return False
    name = directory[:-2]
    if name == unit:
        return True
    stem, dot, kind = name.rpartition(".")
    return bool(dot) and stem.endswith("-") and unit.endswith(f".{kind}") and unit.startswith(stem)


def _describe(key: str, value: str, hidden: frozenset[str]) -> str:
    if key == "Environment":
        parts = []
        for item in split_assignments(value):
            name, sep, v = item.partition("=")
            parts.append(f"{name}={_value(name, v, hidden)}" if sep else item)
        return "Environment=" + " ".join(parts)
    return f"{key}={value if len(value) <= SHOWN_VALUE else value[:SHOWN_VALUE - 3] + '...'}"


def foreign_drop_ins(unit: str, drop_in_paths: str, contents: dict[str, str],
                     hidden: frozenset[str] = frozenset()) -> list[str]:
    """One line per drop-in systemd applies to `unit` that is neither its own (an up removes
    those) nor one for every service that leaves its environment alone. `contents`: each drop-in's
    text by path (a missing one: it could not be read). `hidden`: variables whose values are
    never shown (the stack's secrets)."""
    own = set(own_drop_ins(unit, drop_in_paths))
    out = []
    for path in drop_in_paths.split():
        if path in own:
            continue
        settings = settings_of(contents.get(path, ""))
        mine = _for_this_unit(unit, path)
        if not mine:
            settings = [(k, v) for k, v in settings if k in ENVIRONMENT_KEYS]
            if not settings:
                continue
        said = "; ".join(_describe(k, v, hidden) for k, v in settings) if settings else (
            "(nothing readable)" if path not in contents else "(no settings)")
        whose = "for this unit" if mine else "for every service"
        # What it sets first: a preview cuts a long value short.
        out.append(f"{path} sets {said} ({whose}; not written by gpu-serving, an up leaves it: remove it and run "
                   f"`systemctl daemon-reload`, or declare its settings)")
    return out


def parse_show_environment(text: str) -> tuple[dict[str, str], list[str], list[str]]:
    """`systemctl show -p Environment -p EnvironmentFiles -p UnsetEnvironment -p PassEnvironment`:
    (the variables, the environment files in order, the names unset or passed through). Only
    EnvironmentFiles repeats its key, one line per file: `path (ignore_errors=no)`."""
    env: dict[str, str] = {}
    files: list[str] = []
    names: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "Environment":
            env = {n: v for n, s, v in (item.partition("=") for item in split_assignments(value)) if s}
        elif key == "EnvironmentFiles" and value.strip():
            files.append(value.rsplit(" (ignore_errors=", 1)[0].strip())
        elif key in ("UnsetEnvironment", "PassEnvironment") and value.strip():
            names += [f"{key}={n}" for n in split_assignments(value)]
    return env, files, names


def environment_drift(unit_file_text: str, show_text: str, drop_in_paths: str, contents: dict[str, str], *,
                      unit: str, declared: Optional[dict[str, str]] = None, hidden: frozenset[str] = frozenset()) -> list[str]:
    """How the environment systemd would start `unit` with differs from what its unit file sets,
    one line per variable or file, naming the drop-in it comes from. `declared`: the stack's whole
    environment (the shared file's variables too): a variable a drop-in sets by `Environment=` that
    the declared environment file also sets is overridden by the file (systemd reads files last),
    so it is not a difference. The unit's own drop-ins (hand edits an up removes) are left to
    `dropIns`."""
    file_settings = settings_of(unit_file_text)
    own_env, own_files = _environment_of(file_settings), _files_of(file_settings)
    env, files, names = parse_show_environment(show_text)
    declared = declared or {}
    own = set(own_drop_ins(unit, drop_in_paths))

    def source(test: Callable[[list[tuple[str, str]]], bool]) -> Optional[str]:
        """The last drop-in (in systemd's order) whose settings pass `test`; None: none of them."""
        found = None
        for path in drop_in_paths.split():
            if test(settings_of(contents.get(path, ""))):
                found = path
        return found

    def where(path: Optional[str]) -> str:
        return f"by {path}" if path else "by a drop-in"

    out = []
    for name in sorted(set(env) | set(own_env)):
        value, want = env.get(name), own_env.get(name)
        if value == want:
            continue
        if name not in own_env and name in declared:
            continue  # declared in the environment file, which systemd reads after Environment=
        path = source(lambda s: name in _environment_of(s) or any(k == "Environment" and not v for k, v in s))
        if path in own:
            continue
        if value is None:
            out.append(f"{name} not set (the unit sets {_value(name, want or '', hidden)}): unset {where(path)}")
        elif want is None:
            out.append(f"{name}={_value(name, value, hidden)} set {where(path)}, not declared")
        else:
            out.append(f"{name}={_value(name, value, hidden)} set {where(path)} (the unit sets {_value(name, want, hidden)})")
    for path in files:
        if path not in own_files:
            origin = source(lambda s: path in _files_of(s))
            if origin not in own:
                out.append(f"EnvironmentFile {path} added {where(origin)}: its variables override the declared ones")
    for path in own_files:
        if path not in files:
            out.append(f"EnvironmentFile {path} (the unit's) no longer read: reset by a drop-in")
    for item in names:
        key, _, name = item.partition("=")
        origin = source(lambda s: any(x == key for x, _ in s))
        if origin not in own:
            out.append(f"{key} {name} set {where(origin)}")
    return out


def read_changes(unit: str, drop_in_paths: str, sections: dict[str, str], *, declared: Optional[dict[str, str]] = None,
                 hidden: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """reads.SERVICE_SCRIPT's answer for `unit` (its `systemctl show` DropInPaths and the sections
    after it): (`foreign_drop_ins`, `environment_drift`)."""
    contents = {key[len("drop-in "):]: text for key, text in sections.items() if key.startswith("drop-in ")}
    foreign = foreign_drop_ins(unit, drop_in_paths, contents, hidden)
    shown = sections.get("unit-environment", "")
    if not any(line.startswith("Environment=") for line in shown.splitlines()):
        return foreign, []  # systemd did not answer: nothing to compare with
    return foreign, environment_drift(sections.get("unit-file-environment", ""), shown, drop_in_paths, contents,
                                      unit=unit, declared=declared, hidden=hidden)


# What an up says of a drop-in it leaves (before the line that names it).
STAYS = "a drop-in gpu-serving did not write stays (drift until it is removed): "


def live_fields(props: dict[str, Any], drop_in_paths: str, sections: dict[str, str],
                redact: Callable[[str], str]) -> dict[str, list[str]]:
    """The service resource's read-only outputs from `read_changes` (a key only when it has lines):
    `foreignDropIns`, `effectiveEnvironment`. `props`: the service's (its unit, declared
    environment and secret variables); `redact`: takes the stack's secret values out of a line."""
    foreign, environment = read_changes(props["unit"], drop_in_paths, sections, declared=props.get("environment") or {},
                                        hidden=frozenset((props.get("secretEnvironment") or {}).keys()))
    return {key: [redact(line) for line in lines]
            for key, lines in (("foreignDropIns", foreign), ("effectiveEnvironment", environment)) if lines}
