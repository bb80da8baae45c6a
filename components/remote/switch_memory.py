"""What one run's switches remember in the provider process. The engine serves every dynamic
resource of a run from one provider process (readcache.py relies on it too), so a resource can
leave something for a later one of the same run:

- the files this run replaced on each host, as they were before, for the switch that follows the
  file writes to put back, byte for byte, when it fails;
- the report of a switch's own readiness check, for the readiness resource's refresh right after.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from . import ssh

# target key -> path -> (bytes or None when new, mode).
_REPLACED: dict[tuple, dict[str, tuple[Optional[bytes], Optional[int]]]] = {}
_REPLACED_LOCK = threading.Lock()


def remember_replaced(t: ssh.Target, path: str, data: Optional[bytes], mode: Optional[int]) -> None:
    with _REPLACED_LOCK:
        # The first write of the run holds what was there before it.
        _REPLACED.setdefault(t.key, {}).setdefault(path, (data, mode))


def take_replaced(t: ssh.Target) -> dict[str, tuple[Optional[bytes], Optional[int]]]:
    with _REPLACED_LOCK:
        return _REPLACED.pop(t.key, {})


# The report of a switch's own readiness check, by host and unit: the readiness resource is
# refreshed when the program registers it, which during `up` is right after the service it
# depends on, so a switch's `up` would otherwise look again (one more command on the host, after
# the server already answered twice) at what the switch checked a moment before.
_JUST_CHECKED: dict[tuple, tuple[float, dict]] = {}
_JUST_CHECKED_LOCK = threading.Lock()
# How long a switch's check stands in for a refresh's look; past it, the refresh looks again.
JUST_CHECKED_SECONDS = 10.0


def remember_check(t: ssh.Target, unit: str, report: dict) -> None:
    with _JUST_CHECKED_LOCK:
        _JUST_CHECKED[(t.key, unit)] = (time.monotonic(), dict(report))


def just_checked(t: ssh.Target, unit: str) -> Optional[dict]:
    """The report of a check this process made of `unit` in the last JUST_CHECKED_SECONDS, once."""
    with _JUST_CHECKED_LOCK:
        when, report = _JUST_CHECKED.pop((t.key, unit), (None, None))
    return report if when is not None and report is not None and time.monotonic() - when <= JUST_CHECKED_SECONDS else None


def checks_kept(unit: str) -> list[dict]:
    """The reports kept for `unit` (any host), for tests."""
    with _JUST_CHECKED_LOCK:
        return [report for (_, u), (_, report) in _JUST_CHECKED.items() if u == unit]


def forget_checks() -> None:
    with _JUST_CHECKED_LOCK:
        _JUST_CHECKED.clear()
