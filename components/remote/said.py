"""What every host of a fleet would print the same, printed in full once: the first host's line
carries the text, the others name it (one provider process serves every resource of a run, so it
knows what it has printed). A 3-host preview printed the same 45-line unit file three times, and
the engine repeats each line in its summary (issue 36.12: per host, a run should print no more
than one host's run does). The one-host form is untouched: it has no entry to name."""
from __future__ import annotations

import threading
from typing import Optional

_first: dict[tuple, str] = {}
_lock = threading.Lock()


def first_said_by(key: tuple, who: str) -> Optional[str]:
    """None when `who` is the first to say `key` in this process (or the one-host form, `who`
    empty): the caller prints it whole. Otherwise the entry that said it first."""
    if not who:
        return None
    with _lock:
        first = _first.setdefault(key, who)
    return None if first == who else first


def new_file(who: str, path: str, content: str) -> str:
    """A new file's text, whole (the engine's display shortens a new multi-line value), or, for a
    fleet host whose file reads the same as one printed before, a line naming that host."""
    first = first_said_by(("new file", path, content), who)
    if first is None:
        return f"{who}{path} as it will be written:\n{content}".rstrip("\n")
    return f"{who}{path} as it will be written: the same text as {first.removesuffix(': ')}'s above"
