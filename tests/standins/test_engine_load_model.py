"""The rehearsal engine's start-time model (loading.py): page-cache residency by mincore, the
shards really read, the kernel cache shortening graph capture; and the phases a recorder reads
from its lines (components/core/start_phases.py)."""
from __future__ import annotations

import calendar
import os
import re
import shutil
import sys
import time

from components.core import start_phases as P
from tests.standins.helpers import ENGINE_SRC, MODELS

sys.path.insert(0, str(ENGINE_SRC))
from sglang._rehearsal.loading import resident_bytes  # noqa: E402

MiB = 1 << 20


def cold(path):
    """Out of the page cache: written back, then dropped (this file only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def model_with_shard(root, size_mib: int):
    d = root / "ckpt"
    shutil.copytree(MODELS / "kimi-k2.6", d)
    shard = d / "model-00001-of-00001.safetensors"
    # A whole safetensors file (the engine checks each shard's header against its size).
    n = size_mib * MiB
    header = b'{"w": {"dtype": "U8", "shape": [%d], "data_offsets": [0, %d]}}' % (n, n)
    header += b" " * (-len(header) % 8)
    with open(shard, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + os.urandom(n))
    return d, shard


def test_resident_bytes_follow_the_page_cache(tmp_path):
    _, shard = model_with_shard(tmp_path, 8)
    cold(shard)
    assert resident_bytes(str(shard)) < MiB
    with open(shard, "rb") as f:
        while f.read(MiB):
            pass
    assert resident_bytes(str(shard)) > 0.99 * os.path.getsize(shard)


def plan_line(engine) -> str:
    return next(line for line in engine.log.splitlines() if "rehearsal: load model:" in line)


def test_a_cold_start_then_a_warm_one(launch, engine_env, tmp_path):
    model, shard = model_with_shard(tmp_path, 32)
    cold(shard)
    env = engine_env(REHEARSAL_LOAD_SECONDS="", REHEARSAL_DISK_MIB_S="40", REHEARSAL_PAGE_CACHE_MIB_S="4000",
                     REHEARSAL_INIT_SECONDS="0.2", REHEARSAL_GRAPH_SECONDS="1", REHEARSAL_GRAPH_WARM_SECONDS="0.1",
                     TRITON_CACHE_DIR=str(tmp_path / "triton"))
    first = launch("--tp-size", "8", model=str(model), env=env)
    first.wait_ready(30)
    line = plan_line(first)
    # 32 MiB not in the page cache at 40 MiB/s: 0.80 s (the model's figure, not a measured time).
    assert re.search(r"0\.03 GiB checkpoint, 0\.00 GiB in the page cache.*-> load 0\.8\d s", line), line
    assert "graph capture 1.00 s (cold: this layout is not in the kernel cache" in line
    assert resident_bytes(str(shard)) > 0.9 * os.path.getsize(shard)  # the start read it: now warm
    assert list((tmp_path / "triton").glob("sglang-rehearsal-kernels-*.json"))
    assert first.terminate() == 0

    second = launch("--tp-size", "8", model=str(model), env=env)
    second.wait_ready(30)
    line = plan_line(second)
    assert "0.03 GiB in the page cache" in line and "-> load 0.01 s" in line, line
    assert "graph capture 0.10 s (warm: this layout is in the kernel cache" in line
    second.terminate()

    # Another layout's kernels do not help.
    third = launch("--pp-size", "8", model=str(model), env=env)
    third.wait_ready(30)
    assert "(cold: this layout is not in the kernel cache" in plan_line(third)
    third.terminate()

    # A recorder reads the phases from the engine's own lines (SGLang's shapes).
    entries = []
    for text in second.log.splitlines():
        m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] (.*)", text)
        if m:
            entries.append((calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")), m.group(2)))
    record = P.phases(entries, host="h", stack="tp8", layout="tp8")
    assert set(record.phases) == set(P.PHASES) and record.total is not None
    # The load the recorder keeps is the engine's own figure ("Load weight end. elapsed=").
    reported = [float(m) for m in re.findall(r"Load weight end\. elapsed=([0-9.]+) s", second.log)]
    assert reported and record.load_reported == max(reported)


def test_without_the_model_the_timings_stay_as_they_were(launch, engine_env):
    # REHEARSAL_LOAD_SECONDS=0 and no disk rate: the model is off, so its init, page-cache and
    # graph-capture figures, set here to take an hour each, are not waited: the engine is ready
    # within wait_ready's minute (an outcome, not a measured time; the hour is 60 times that).
    e = launch("--tp-size", "8", env=engine_env(REHEARSAL_INIT_SECONDS="3600", REHEARSAL_GRAPH_SECONDS="3600",
                                                REHEARSAL_PAGE_CACHE_MIB_S="0.001"))
    e.wait_ready(60)
    assert "rehearsal: load model:" not in e.log
    e.terminate()
