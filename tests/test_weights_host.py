"""The host-side scripts of components/core/weights_host.py, run for real (python3, as on a host)
on stand-in checkpoints in the real layout (rehearsal/checkpoint.py), with the operator's
accidents done to them by hand: a shard deleted, a shard cut short, one byte flipped, a
directory that is not there. The pure verdicts (core/weights.py) judge what the scripts report.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from components.core import weights as W
from components.core import weights_host as WH
from rehearsal import checkpoint

SHARDS = [checkpoint.shard_name(k, 3) for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("source") / "kimi-k2.6"
    checkpoint.write(d, shards=3, shard_bytes=2_000_000, seed=3)
    return d


@pytest.fixture
def copy(source, tmp_path) -> Path:
    d = tmp_path / "kimi-k2.6"
    d.mkdir()
    for f in source.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d


def run(request: dict) -> subprocess.CompletedProcess:
    """A request of weights_host as the provider would send it, run here with python3."""
    assert request["argv"][:2] == ["python3", "-c"]
    return subprocess.run(request["argv"], capture_output=True, text=True, timeout=request["timeout"])


def read(directory: Path) -> W.HostRead:
    proc = run(WH.read_checkpoint(str(directory)))
    assert proc.returncode == 0, proc.stderr
    return W.parse_read(proc.stdout)


def verify(directory: Path, paths, processes=2, every=0.05):
    proc = run(WH.verify_checkpoint(str(directory), list(paths), processes=processes, every=every))
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc, answers


@pytest.fixture(scope="module")
def manifest(source) -> W.Manifest:
    proc = run(WH.verify_checkpoint(str(source), sorted(p.name for p in source.iterdir()), processes=2))
    assert proc.returncode == 0, proc.stderr
    return W.manifest_from_listing(f"host:cache1:{source}", (json.loads(line) for line in proc.stdout.splitlines()))


def test_a_complete_copy_has_no_problem_with_or_without_a_manifest(copy, manifest, source):
    r = read(copy)
    assert r.exists and set(r.files) == {f.path for f in manifest.files}
    assert r.index_shards == tuple(SHARDS) and all(r.headers[s] == r.files[s].size for s in SHARDS)
    assert r.free_bytes and r.free_bytes > 0
    assert W.check_copy(r) == [] and W.check_copy(r, manifest) == []
    assert W.repair(manifest, []).files == ()
    total = sum(p.stat().st_size for p in source.iterdir())
    assert manifest.total_bytes == total and all(f.sha256 for f in manifest.files)
    assert manifest.summary() == f"{len(manifest.files)} files, {W.gb(total)}, from host:cache1:{source}"


def test_a_shard_deleted_by_hand_is_named_and_alone_repaired(copy, manifest):
    (copy / SHARDS[1]).unlink()
    problems = W.check_copy(read(copy), manifest)
    assert [(p.path, p.kind) for p in problems] == [(SHARDS[1], W.MISSING)]
    assert W.drift_lines("gpu1", problems) == [f"gpu1-model-weights: {SHARDS[1]} is missing"]
    fix = W.repair(manifest, problems)
    assert [f.path for f in fix.files] == [SHARDS[1]] and fix.bytes == manifest.by_path[SHARDS[1]].size
    # Without a manifest the index says which shard is gone.
    assert [(p.path, p.kind, p.detail) for p in W.check_copy(read(copy))] == [
        (SHARDS[1], W.MISSING, f"named in {W.INDEX}")]


def test_a_shard_cut_short_is_named_by_its_own_header(copy, manifest):
    path = copy / SHARDS[2]
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    no_manifest = W.check_copy(read(copy))
    assert [(p.path, p.kind, p.expected, p.actual) for p in no_manifest] == [(SHARDS[2], W.RESIZED, size, size // 2)]
    assert "header declares the larger size" in no_manifest[0].words()
    assert [p.kind for p in W.check_copy(read(copy), manifest)] == [W.RESIZED]
    # Cut inside its header: unreadable, as safetensors would say.
    with open(path, "r+b") as f:
        f.truncate(100)
    assert [(p.kind, p.detail) for p in W.check_copy(read(copy))] == [(W.UNREADABLE, "invalid header length")]


def test_one_byte_flipped_passes_the_cheap_check_and_fails_the_full_verify(copy, manifest):
    path = copy / SHARDS[0]
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the size and mtime stay
    r = read(copy)
    assert W.check_copy(r, manifest) == []
    proc, answers = verify(copy, [f.path for f in manifest.files])
    assert proc.returncode == 0  # every file was read; the verdict is the manifest's
    problems = W.verify_problems(manifest, answers)
    assert [(p.path, p.kind) for p in problems] == [(SHARDS[0], W.CORRUPT)]
    assert "is corrupt" in problems[0].words()
    assert [f.path for f in W.repair(manifest, problems).files] == [SHARDS[0]]


def test_a_file_rewritten_since_it_was_verified_is_named_changed(copy, manifest):
    r = read(copy)
    verified = dict(r.files)
    path = copy / SHARDS[0]
    path.write_bytes(path.read_bytes())  # same bytes, new mtime (and a new inode on some filesystems)
    os.utime(path, ns=(1, 1))
    problems = W.check_copy(read(copy), manifest, verified)
    assert [(p.path, p.kind) for p in problems] == [(SHARDS[0], W.CHANGED)]
    assert W.repair(manifest, problems).files == ()  # verify --full decides, not the mtime


def test_a_directory_that_is_not_there(tmp_path, manifest):
    r = read(tmp_path / "models" / "kimi-k2.6")
    assert not r.exists and r.free_bytes > 0  # the free space of the nearest existing parent
    problems = W.check_copy(r, manifest)
    assert [p.kind for p in problems] == [W.NO_DIRECTORY]
    assert W.repair(manifest, problems).files == manifest.files


def test_the_verifier_reports_progress_and_names_an_unreadable_file(copy, manifest):
    (copy / "tokenizer.json").unlink()
    proc, answers = verify(copy, [f.path for f in manifest.files], processes=3, every=0)
    assert proc.returncode == 1
    gone = next(a for a in answers if a.get("path") == "tokenizer.json")
    assert "No such file" in gone["error"] and "sha256" not in gone
    done = answers[-1]
    assert done["done"] and done["files"] == len(manifest.files) and done["processes"] == 3
    progress = [WH.parse_progress(line) for line in proc.stderr.splitlines()]
    assert progress and all(progress), proc.stderr
    assert progress[-1]["files"] == progress[-1]["of"] == len(manifest.files)
    problems = W.verify_problems(manifest, answers)
    assert [(p.path, p.kind) for p in problems] == [("tokenizer.json", W.MISSING)]


def test_progress_lines_parse_and_others_do_not():
    assert WH.parse_progress("verify: 3/64 files, 27.50/590.00 GB, 5.96 GB/s, 94s left") == {
        "files": 3, "of": 64, "gb": 27.5, "total_gb": 590.0, "gb_s": 5.96, "seconds_left": 94}
    assert WH.parse_progress("verify: 3/64 files") is None and WH.parse_progress("Traceback") is None


def test_the_requests_are_constant_scripts_with_the_values_as_arguments():
    for req in (WH.read_checkpoint("/models/a b"), WH.verify_checkpoint("/m", ["x;y", "$(id)"])):
        assert req["op"] == "run" and req["argv"][1] == "-c" and req["argv"][2] in (WH.READ_SCRIPT, WH.VERIFY_SCRIPT)
        assert req["timeout"] > 0
