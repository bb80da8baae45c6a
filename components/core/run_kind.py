"""Which run of a `pulumi` command says what a preview says (issue 36.18). `pulumi up` runs the
program twice, a preview and then the update, and every check and warning ran in both: the unit
text four times, the KV-capacity warning four to six. What a preview says (a warning about the
settings, the unit as it will be written, the switch block, the restart line) is said once a
command: in a preview; in an update only when no preview came before it in the same command
(`--skip-preview`, `-f`, the Automation API's `up`). Pure: the command's arguments in (read from
/proc by components/remote/cli.py), the answer out; cases in tests/data/run-kind/."""
from __future__ import annotations

from typing import Optional

# `pulumi up`'s commands and the flag that skips its preview (cobra: `-f`, or in a group of
# one-letter boolean flags such as `-yf`; `--skip-preview[=true|false]`).
UP_COMMANDS = ("up", "update")
SKIP_PREVIEW = "--skip-preview"
SKIP_PREVIEW_SHORT = "f"
# The one-letter boolean flags of `pulumi up` that may share a group with -f.
BOOLEAN_SHORT = frozenset("yfrdj")


def preview_came_first(args: Optional[list[str]]) -> bool:
    """Whether the update of this command followed a preview of its own: a `pulumi up` that did
    not skip it. False for any other command, and when the command is unknown (None), so that
    an update never stays silent about what nobody previewed."""
    if not args or not any(a in UP_COMMANDS for a in args):
        return False
    skipped = False
    for arg in args:
        if arg == SKIP_PREVIEW or arg == f"{SKIP_PREVIEW}=true":
            skipped = True
        elif arg == f"{SKIP_PREVIEW}=false":
            skipped = False
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1 and set(arg[1:]) <= BOOLEAN_SHORT:
            skipped = skipped or SKIP_PREVIEW_SHORT in arg[1:]
    return not skipped


def says_preview_things(dry_run: bool, args: Optional[list[str]]) -> bool:
    """Whether this program run (or the provider's check in it) says what a preview says: every
    preview; an update only when its command showed no preview before it."""
    return dry_run or not preview_came_first(args)
