"""Where a timed run's CPU goes, by command: the kernel's process accounting (acct(2)) during the
run. Every process that ends while it is on leaves one record (its command name, user and system
time), in this machine's PID namespace and in the rehearsal hosts' (the kernel writes a process's
record to the accounting of its own namespace and of every one above it). What lives on (systemd,
sshd's listener, journald, the warm process, a server still serving) has no record: the run's
machine CPU less the records' sum is that part.

A record's command is the name the process had when it ended: our Python processes can show under
a name a gRPC thread gave them (`event_engine`, `lifeguard`, `grpc_global_tim`).

`bench/run --account` turns it on; each sample then carries its `accounted` table. The kernel
has one accounting file per PID namespace: two runs with it on at once would take it from each
other.
"""
from __future__ import annotations

import ctypes
import os
import struct
import tempfile
from collections import defaultdict
from pathlib import Path

# struct acct_v3 (linux/acct.h): 64 bytes; ac_utime and ac_stime are comp_t at 32 and 34,
# ac_comm 16 bytes at 48; ac_version's low bits are 3.
RECORD = 64
AHZ = 100  # comp_t ticks per second (the kernel's AHZ)


def comp_t(value: int) -> int:
    """A comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 0x7))


def parse(data: bytes) -> dict[str, dict]:
    """{command: {"count": processes, "cpu": CPU s}} of the acct_v3 records in `data`."""
    out: dict[str, dict] = defaultdict(lambda: {"count": 0, "cpu": 0.0})
    for i in range(0, len(data) - RECORD + 1, RECORD):
        rec = data[i:i + RECORD]
        if rec[1] & 0x0F != 3:
            raise ValueError(f"record {i // RECORD}: acct version {rec[1] & 0x0F}, expected 3")
        utime, stime = struct.unpack_from("<HH", rec, 32)
        comm = rec[48:64].split(b"\0", 1)[0].decode(errors="replace") or "?"
        out[comm]["count"] += 1
        out[comm]["cpu"] += (comp_t(utime) + comp_t(stime)) / AHZ
    return dict(out)


class Accounting:
    """Process accounting on for the `with` block; `.table` is `parse` of what it recorded."""

    def __init__(self):
        self.table: dict[str, dict] = {}
        self._libc = ctypes.CDLL(None, use_errno=True)

    def _acct(self, path) -> None:
        if self._libc.acct(path) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"acct({path!r}): {os.strerror(err)}")

    def __enter__(self) -> "Accounting":
        fd, name = tempfile.mkstemp(prefix="gs-acct-")
        os.close(fd)
        self.path = Path(name)
        try:
            self._acct(str(self.path).encode())
        except OSError:
            self.path.unlink(missing_ok=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._acct(None)
            self.table = parse(self.path.read_bytes())
        finally:
            self.path.unlink(missing_ok=True)


def top(table: dict[str, dict], n: int = 12) -> list[tuple[str, int, float]]:
    """The `n` commands that used most CPU: (command, processes, CPU s)."""
    rows = sorted(((c, v["count"], round(v["cpu"], 3)) for c, v in table.items()), key=lambda r: -r[2])
    return rows[:n]
