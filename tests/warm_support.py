"""Finding warm processes (gpu-serving-pyrun.py `_gs_warm`) from the outside, by PID: a warm
process's command line names its socket (`--warm-serve PATH KEY MODULE`), and the runs it forks
carry the same command line. Used by the test session's clean-up (tests/conftest.py) and by the
warm-start tests."""
from __future__ import annotations

from pathlib import Path


def warm_processes(sockets: str | Path, forks: bool = False) -> list[int]:
    """PIDs of the live warm processes whose socket is in the directory `sockets`; with `forks`,
    the runs they forked too."""
    mark = str(sockets).rstrip("/").encode()
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # The socket's directory itself, not a prefix: /tmp/gsw-pt12 is not /tmp/gsw-pt123's.
        if b"--warm-serve" in argv and any(a.rpartition(b"/")[0] == mark for a in argv) and stat[0] != "Z":
            found[int(entry.name)] = int(stat[1])
    return list(found) if forks else [pid for pid, parent in found.items() if parent not in found]


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
