"""The `pulumi` command a process of this run serves, read from /proc: the program's runner is a
child of the language host, itself the CLI's child; the dynamic provider is the CLI's child (with
a warm start, the runner that asked the warm process for a copy, GPU_SERVING_LAUNCHED_PID, stands
for the process the engine launched). core/run_kind.py decides from the arguments.

The program knows whether its run is a preview (`pulumi.runtime.is_dry_run()`); the provider's
check is called the same in both runs of a `pulumi up` and is not told. The engine starts one
provider process per run, so the first of a command's provider processes to ask is its
preview's: it leaves a marker named after the CLI process (its PID and start time) in the
user's own directory (handoff.directory), and the update's process finds it."""
from __future__ import annotations

import os
import time
from typing import Optional

from ..core import run_kind
from . import handoff

# How far up the CLI may be: the runner, the language host, the CLI.
MAX_DEPTH = 4
# The markers of commands' first provider processes, and how long one is kept (a command's
# preview and update are minutes apart at most, unless its operator waits at the prompt).
MARKER_PREFIX = "preview-"
MARKER_KEEP_SECONDS = 24 * 3600
_first: dict = {}


def _parent(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may hold spaces and parentheses: the fields follow its last ")".
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _started(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # starttime, in clock ticks since boot
    except (OSError, IndexError):
        return None


def pulumi_cli(pid: Optional[int] = None) -> Optional[tuple[int, list[str]]]:
    """The nearest ancestor running an executable named `pulumi`: its PID and its arguments
    (after the executable); None when there is none, or /proc says nothing."""
    if pid is None:
        try:
            pid = int(os.environ.get("GPU_SERVING_LAUNCHED_PID") or os.getpid())
        except ValueError:
            pid = os.getpid()
    for _ in range(MAX_DEPTH):
        pid = _parent(pid)
        if not pid or pid <= 1:
            return None
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "pulumi":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return pid, [a.decode(errors="replace") for a in f.read().split(b"\0")[1:] if a]
        except OSError:
            return None
    return None


def pulumi_command_line(pid: Optional[int] = None) -> Optional[list[str]]:
    """The arguments of the `pulumi` command this process serves (pulumi_cli), or None."""
    found = pulumi_cli(pid)
    return found[1] if found else None


def says_preview_things(dry_run: bool) -> bool:
    """Whether this run of the program says what a preview says (core/run_kind.py): the program
    gives `pulumi.runtime.is_dry_run()`; the command is read from /proc."""
    return run_kind.says_preview_things(dry_run, pulumi_command_line())


def first_run_of_command(cli_pid: int, base: Optional[str] = None) -> bool:
    """Whether this process is the first of its command's runs to ask (see the module's docstring);
    True when that cannot be known (no directory of the user's own: say rather than stay silent)."""
    base = base or handoff.directory()
    if base is None:
        return True
    _sweep(base)
    started = _started(cli_pid)
    if started is None:
        return True
    try:
        os.close(os.open(os.path.join(base, f"{MARKER_PREFIX}{cli_pid}-{started}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True


def _sweep(base: str) -> None:
    now = time.time()
    try:
        names = [n for n in os.listdir(base) if n.startswith(MARKER_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            pid, started = name[len(MARKER_PREFIX):].split("-", 1)
            if now - os.lstat(path).st_mtime > MARKER_KEEP_SECONDS or _started(int(pid)) != started:
                os.remove(path)
        except (OSError, ValueError):
            continue


def provider_says_preview_things() -> bool:
    """The dynamic provider's answer (once a process): every run of a command without a preview
    before its update says it; of a `pulumi up` that previews, only its first run, the preview."""
    if "says" not in _first:
        found = pulumi_cli()
        _first["says"] = (found is None or not run_kind.preview_came_first(found[1])
                          or first_run_of_command(found[0]))
    return _first["says"]
