"""Issue 38, point 5: the stand-in checkpoint is in the real layout (the real safetensors reader
opens every shard of it), made the same from the same seed, and the rehearsal engine checks it
at load as SGLang's loader meets it: a shard the index names but the directory lacks, a shard
cut short (the same words the real reader uses for the same file), no weights at all; each
fails during the load (after "Load weight begin", the port never opened), and a complete one
loads and serves. Engines run for real on loopback."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from rehearsal import checkpoint
from tests.standins.helpers import port_open, run_engine

SHARDS = [checkpoint.shard_name(k, 4) for k in (1, 2, 3, 4)]


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("standin") / "kimi-k2.6"
    checkpoint.write(d, shards=4, shard_bytes=1_500_000, seed=11)
    return d


@pytest.fixture
def model(standin, tmp_path) -> Path:
    d = tmp_path / "kimi-k2.6"
    shutil.copytree(standin, d)
    return d


def digests(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_the_real_safetensors_reader_opens_every_shard_as_the_index_says(standin):
    index = json.loads((standin / checkpoint.INDEX).read_text())
    config = json.loads((standin / "config.json").read_text())
    assert config == json.loads((checkpoint.MODELS_DIR / "kimi-k2.6" / "config.json").read_text())
    seen = {}
    for shard in SHARDS:
        with safe_open(str(standin / shard), framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():
                seen[name] = shard
                sl = f.get_slice(name)
                assert sl.get_dtype() == "BF16" and sl.get_shape()[-1] == config["hidden_size"]
    assert seen == index["weight_map"]
    # Every layer of the model is in the checkpoint; total_size is the data of every tensor.
    assert {f"model.layers.{i}.self_attn.o_proj.weight" for i in range(config["num_hidden_layers"])} <= set(seen)
    header_bytes = sum(8 + int.from_bytes((standin / s).read_bytes()[:8], "little") for s in SHARDS)
    assert index["metadata"]["total_size"] == sum((standin / s).stat().st_size for s in SHARDS) - header_bytes


def test_one_seed_makes_the_same_bytes_another_makes_other_weights_of_the_same_sizes(standin, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    checkpoint.write(again, shards=4, shard_bytes=1_500_000, seed=11)
    checkpoint.write(other, shards=4, shard_bytes=1_500_000, seed=12)
    assert digests(again) == digests(standin)
    assert {p.name: p.stat().st_size for p in other.iterdir()} == {p.name: p.stat().st_size for p in standin.iterdir()}
    differ = {n for n, h in digests(other).items() if h != digests(standin)[n]}
    # The weights differ (and the seed recorded beside them); the model's files and the index do not.
    assert differ == set(SHARDS) | {"rehearsal-checkpoint.json"}


def test_shard_sizes_follow_the_size_asked(tmp_path):
    small = checkpoint.write(tmp_path / "s", shards=2, shard_bytes=4 << 20)
    big = checkpoint.write(tmp_path / "b", shards=2, shard_bytes=24 << 20)
    for files, want in ((small, 4 << 20), (big, 24 << 20)):
        for shard in (checkpoint.shard_name(1, 2), checkpoint.shard_name(2, 2)):
            assert abs(files[shard] - want) < 64 << 10, (shard, files[shard], want)  # within a header and a row
    # Every tensor has at least one row: a size below that is refused, saying the floor.
    with pytest.raises(ValueError, match="give at least 2,"):
        checkpoint.write(tmp_path / "t", shards=2, shard_bytes=1 << 20)


def load_fails(engine_env, model: Path) -> str:
    res = run_engine(engine_env(), "--tp-size", "8", "--port", "1", model=str(model))
    assert res.returncode == 1, res.stderr[-2000:]
    log = res.stderr
    # During the load, as in SGLang: after its first line, in the scheduler, the port never bound.
    assert log.index("Load weight begin") < log.index("Scheduler hit an exception")
    assert "HTTP server listening" not in log and "Load weight end" not in log
    assert "Initialization failed" in log
    return log


def test_a_shard_the_index_names_but_the_directory_lacks_fails_the_load(engine_env, model):
    (model / SHARDS[2]).unlink()
    log = load_fails(engine_env, model)
    assert f"FileNotFoundError: Weight files referenced in index but missing: {{'{model / SHARDS[2]}'}}" in log
    assert "1 of the 4 shards" in log


def test_a_shard_cut_short_fails_with_the_real_readers_words(engine_env, model):
    path = model / SHARDS[1]
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    with pytest.raises(Exception) as real:
        safe_open(str(path), framework="numpy")
    log = load_fails(engine_env, model)
    assert f"safetensors._safetensors_rust.SafetensorError: {real.value}" in log
    assert type(real.value).__module__ + "." + type(real.value).__name__ == "safetensors._safetensors_rust.SafetensorError"


@pytest.mark.parametrize("cut", [4, 200])
def test_a_shard_cut_inside_its_header_fails_as_the_real_reader_does(engine_env, model, cut):
    path = model / SHARDS[0]
    with open(path, "r+b") as f:
        f.truncate(cut)
    with pytest.raises(Exception) as real:
        safe_open(str(path), framework="numpy")
    assert f"SafetensorError: {real.value}" in load_fails(engine_env, model)


def test_no_weights_at_all_is_sglangs_cannot_find(engine_env, model):
    for shard in SHARDS:
        (model / shard).unlink()
    (model / checkpoint.INDEX).unlink()
    assert f"RuntimeError: Cannot find any model weights with `{model}`" in load_fails(engine_env, model)


def test_a_complete_stand_in_loads_and_serves(launch, model):
    engine = launch("--tp-size", "8", model=str(model))
    engine.wait_ready()
    assert "Loading safetensors checkpoint shards: 100% Completed | 4/4" in engine.log
    assert port_open(engine.port) and engine.get("/health_generate")[0] == 200


def test_under_the_start_time_model_a_stand_ins_shards_count_as_its_declared_checkpoint(launch, engine_env, model):
    """The stand-in's shards are MBs standing for 590 GiB: the start-time model (loading.py) reads
    them for real and counts the declared checkpoint_bytes, cold then warm by their page-cache
    share, as it did for the stand-ins without shards."""
    import os
    import re
    for shard in SHARDS:
        fd = os.open(model / shard, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    declared = json.loads((model / "rehearsal-checkpoint.json").read_text())
    assert declared["stand_in"] == {"seed": 11, "shards": 4, "shard_bytes": 1_500_000}
    gib = declared["checkpoint_bytes"] / (1 << 30)
    env = engine_env(REHEARSAL_LOAD_SECONDS="", REHEARSAL_DISK_MIB_S=str(declared["checkpoint_bytes"] / (1 << 20) / 2),
                     REHEARSAL_PAGE_CACHE_MIB_S=str(declared["checkpoint_bytes"] / (1 << 20) * 10),
                     REHEARSAL_INIT_SECONDS="0", REHEARSAL_GRAPH_SECONDS="0", REHEARSAL_GRAPH_WARM_SECONDS="0",
                     TRITON_CACHE_DIR=str(model.parent / "triton"))
    lines = []
    for _ in range(2):
        engine = launch("--tp-size", "8", model=str(model), env=env)
        engine.wait_ready(30)
        lines.append(next(line for line in engine.log.splitlines() if "rehearsal: load model:" in line))
        assert engine.terminate() == 0
    cold, warm = lines
    assert f"{gib:.2f} GiB checkpoint, 0.00 GiB in the page cache" in cold and re.search(r"-> load 2\.0\d s", cold), cold
    assert "stand-in shards" in cold and "counted as the declared checkpoint_bytes" in cold
    resident = float(re.search(r"([0-9.]+) GiB in the page cache", warm).group(1))
    assert resident > 0.99 * gib and re.search(r"-> load 0\.1\d s", warm), warm  # all but the last pages
