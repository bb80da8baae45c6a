"""How two declarations of a server differ, in the words every preview uses (the switch block in
status.py, the restart line in restart.py): `--ep-size 1 -> 8`, `NCCL_ALGO: Ring -> Tree`. Pure."""
from __future__ import annotations

import shlex
from typing import Any

from .readiness import flag_groups


def argv_of(exec_start: Any) -> list[str]:
    """The service's `execStart` as an argv: one shell-quoted line, or a list in older states."""
    if isinstance(exec_start, str):
        return shlex.split(exec_start)
    return [str(a) for a in exec_start or []]


def flag_changes(before: list[str], after: list[str]) -> list[str]:
    """Each flag that differs between two argvs, in the words of the switch block:
    `--ep-size 1 -> 8`, `(new) --enable-x`, `--max-running-requests 64 -> (dropped)`."""
    old, new = dict(flag_groups([str(a) for a in before])), dict(flag_groups([str(a) for a in after]))
    out = []
    for flag in list(old) + [f for f in new if f not in old]:
        if flag not in new:
            out.append(f"{flag} {old[flag]}".rstrip() + " -> (dropped)")
        elif flag not in old:
            out.append(f"(new) {flag} {new[flag]}".rstrip())
        elif old[flag] != new[flag]:
            out.append(f"{flag} {old[flag]} -> {new[flag]}")
    return out


def environment_changes(before: dict[str, str], after: dict[str, str], *, hidden: frozenset[str] = frozenset()) -> list[str]:
    """Each variable that differs (`NCCL_ALGO: Ring -> Tree`); `hidden` ones are left out."""
    out = []
    for key in sorted(set(before) | set(after)):
        if key in hidden:
            continue
        if key not in after:
            out.append(f"{key}: {before[key]} -> (not set)")
        elif key not in before:
            out.append(f"{key}: (not set) -> {after[key]}")
        elif before[key] != after[key]:
            out.append(f"{key}: {before[key]} -> {after[key]}")
    return out
