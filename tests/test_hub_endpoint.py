"""Issue 38, point 1 (hub:) groundwork: the tests' own Hub-compatible endpoint (rehearsal/hub.py)
serves a stand-in checkpoint to the real huggingface_hub client (the pinned 2.4.0), on loopback.

What a `hub:` source will rely on, shown with the real client: a pinned commit downloads every
file byte for byte; the manifest from the Hub's file metadata (sizes, LFS SHA-256) is the one the
verifier computes at the source; the token is checked (a wrong one downloads nothing and is
never echoed); a branch that is not the commit is refused as the Hub refuses it; a second run
fetches only the files that are missing, and a corrupt file is fetched again once removed (the
client trusts a file its local metadata says it downloaded: repair must delete it first).
"""
from __future__ import annotations

import json
import subprocess

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

from components.core import weights as W
from components.core import weights_host as WH
from rehearsal import checkpoint
from rehearsal.hub import StandinHub

REPO = "moonshotai/Kimi-K2-Stand-In"
# Shaped like a Hugging Face token (its form is what the redaction checks look for).
TOKEN = "hf_" + "StandInToken0123456789abcdEFGH"
SHARDS = [checkpoint.shard_name(k, 3) for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub-source") / "kimi-k2.6"
    checkpoint.write(d, shards=3, shard_bytes=2_000_000, seed=21)
    return d


@pytest.fixture
def hub(source):
    with StandinHub(token=TOKEN) as h:
        h.commit = h.add(REPO, source)
        yield h


def download(hub, dest, **kw):
    args = {"revision": hub.commit, "endpoint": hub.endpoint, "token": TOKEN, "local_dir": dest, **kw}
    return snapshot_download(REPO, **args)


def source_manifest(source) -> W.Manifest:
    """What the verifier computes at the source (VERIFY_SCRIPT, run with python3 as on a host)."""
    req = WH.verify_checkpoint(str(source), sorted(p.name for p in source.iterdir()), processes=2)
    proc = subprocess.run(req["argv"], capture_output=True, text=True, timeout=req["timeout"])
    assert proc.returncode == 0, proc.stderr
    return W.manifest_from_listing("source", (json.loads(line) for line in proc.stdout.splitlines()))


def test_a_pinned_commit_downloads_every_file_and_the_hubs_manifest_is_the_sources(hub, source, tmp_path):
    out = download(hub, tmp_path / "kimi-k2.6")
    assert out == str(tmp_path / "kimi-k2.6")
    for f in source.iterdir():
        assert (tmp_path / "kimi-k2.6" / f.name).read_bytes() == f.read_bytes(), f.name
    # Every LFS byte went through the CDN origin once, and nothing else did.
    assert hub.served == {(REPO, s): (source / s).stat().st_size for s in SHARDS}
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    source_words = f"hub:{REPO}@{hub.commit}"
    from_tree = W.manifest_from_hub(source_words, [
        {"type": "file", "path": e.path, "size": e.size, "oid": e.blob_id,
         "lfs": {"oid": e.lfs.sha256, "size": e.lfs.size} if e.lfs else None}
        for e in api.list_repo_tree(REPO, revision=hub.commit, recursive=True)])
    info = api.model_info(REPO, revision=hub.commit, files_metadata=True)
    assert info.sha == hub.commit
    from_info = W.manifest_from_hub(source_words, [
        {"rfilename": s.rfilename, "size": s.size, "lfs": {"sha256": s.lfs.sha256, "size": s.lfs.size} if s.lfs else None}
        for s in info.siblings])
    assert from_tree == from_info
    at_source = source_manifest(source)
    # Same files and sizes; the Hub's SHA-256 for each LFS file is the verifier's; the small files
    # kept in git get theirs from the first verify.
    assert [(f.path, f.size) for f in from_tree.files] == [(f.path, f.size) for f in at_source.files]
    assert {f.path for f in from_tree.files if f.sha256} == set(SHARDS)
    assert from_tree.with_hashes({f.path: f.sha256 for f in at_source.files}).files == at_source.files
    # The downloaded copy passes the cheap check against that manifest (the client's own
    # .cache/huggingface/ metadata in the directory is not part of the checkpoint).
    read = subprocess.run(WH.read_checkpoint(str(tmp_path / "kimi-k2.6"))["argv"], capture_output=True, text=True)
    assert W.check_copy(W.parse_read(read.stdout), from_tree) == []


def test_a_wrong_token_downloads_nothing_and_is_never_echoed(hub, tmp_path):
    wrong = "hf_" + "WrongToken0123456789abcdefGHIJ"
    with pytest.raises(RepositoryNotFoundError) as info:
        download(hub, tmp_path / "d", token=wrong)
    assert wrong not in str(info.value) and TOKEN not in str(info.value)
    assert not any((tmp_path / "d").glob("*.safetensors")) and not hub.served
    assert ("GET", f"/api/models/{REPO}/tree/{hub.commit}", 401) in hub.calls
    with pytest.raises(RepositoryNotFoundError):
        download(hub, tmp_path / "e", token=False)


def test_a_revision_that_is_not_the_commit_is_refused(hub, tmp_path):
    with pytest.raises(RevisionNotFoundError):
        download(hub, tmp_path / "d", revision="0" * 40)
    assert not hub.served


def test_a_second_run_fetches_only_what_is_missing_and_a_removed_corrupt_file(hub, source, tmp_path):
    dest = tmp_path / "kimi-k2.6"
    download(hub, dest)
    hub.served.clear()
    (dest / SHARDS[1]).unlink()                       # deleted by hand
    download(hub, dest)
    assert hub.served == {(REPO, SHARDS[1]): (source / SHARDS[1]).stat().st_size}
    # One byte flipped: the client trusts its local metadata and keeps the file...
    data = bytearray((dest / SHARDS[0]).read_bytes())
    data[-10] ^= 0xFF
    (dest / SHARDS[0]).write_bytes(bytes(data))
    hub.served.clear()
    download(hub, dest)
    assert not hub.served and (dest / SHARDS[0]).read_bytes() != (source / SHARDS[0]).read_bytes()
    # ... so a repair removes the file (what `weights verify --full` named) and runs it again.
    (dest / SHARDS[0]).unlink()
    download(hub, dest)
    assert hub.served == {(REPO, SHARDS[0]): (source / SHARDS[0]).stat().st_size}
    assert (dest / SHARDS[0]).read_bytes() == (source / SHARDS[0]).read_bytes()


def test_the_cdn_refuses_an_unsigned_or_altered_url_and_resumes_a_range(hub, source):
    import urllib.error
    import urllib.request
    signed = hub.sign(REPO, SHARDS[2])
    size = (source / SHARDS[2]).stat().st_size
    req = urllib.request.Request(signed, headers={"Range": f"bytes={size - 100}-"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"] == f"bytes {size - 100}-{size - 1}/{size}"
        assert resp.read() == (source / SHARDS[2]).read_bytes()[-100:]
    for bad in (signed.split("?")[0], signed.replace(SHARDS[2], SHARDS[1])):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(bad, timeout=10)
        assert info.value.code == 403
