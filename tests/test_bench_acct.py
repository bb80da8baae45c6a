"""bench/acct.py: CPU by command from the kernel's process accounting. The parser on records
built here by the kernel's layout (acct_v3), and once with the kernel's own accounting on."""
from __future__ import annotations

import struct
import subprocess

import pytest

from bench import acct


def record(comm: bytes, utime: int, stime: int, version: int = 3) -> bytes:
    rec = bytearray(acct.RECORD)
    rec[1] = version
    struct.pack_into("<HH", rec, 32, utime, stime)
    rec[48:48 + len(comm)] = comm
    return bytes(rec)


def test_comp_t_is_mantissa_times_eight_to_the_exponent():
    assert acct.comp_t(0) == 0
    assert acct.comp_t(1234) == 1234
    assert acct.comp_t((2 << 13) | 100) == 100 * 64
    assert acct.comp_t(0xFFFF) == 0x1FFF * 8 ** 7


def test_records_are_summed_by_command():
    data = record(b"curl", 3, 1) + record(b"python3", 250, 50) + record(b"curl", 2, 0) + record(b"x" * 16, 0, 1)
    table = acct.parse(data)
    assert table["curl"] == {"count": 2, "cpu": pytest.approx(0.06)}
    assert table["python3"] == {"count": 1, "cpu": pytest.approx(3.0)}
    assert table["x" * 16]["count"] == 1  # a 16-byte name has no NUL
    assert acct.top(table, 2) == [("python3", 1, 3.0), ("curl", 2, 0.06)]


def test_a_record_of_another_version_is_refused():
    with pytest.raises(ValueError, match="version 2"):
        acct.parse(record(b"sh", 1, 1, version=2))


def test_the_kernel_records_a_process_that_ends_while_it_is_on():
    # acct(2) needs root (CAP_SYS_PACCT), as the rehearsal hosts do.
    with acct.Accounting() as a:
        subprocess.run(["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"], check=True)
    assert a.table["sh"]["count"] >= 1
    assert a.table["sh"]["cpu"] > 0
    assert not a.path.exists()
