"""The reads a `pulumi up`'s preview hands to its update (components/remote/handoff.py): what is
kept, who can read it, for how long, and that a change or another run never gets it. No host:
the transport's `_run` and SFTP reads are stood in for; the process-tree checks run on real
processes. The end-to-end figure (one connection and one set of sessions per `up`) is
tests/e2e/test_prefetch_refresh.py."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from components.core import reads
from components.remote import ahead, handoff, readcache, ssh
from tests.test_read_ahead import PREFETCH, PROPS

RUN = (4242, "123456")
SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----\nkey of the login\n-----END OPENSSH PRIVATE KEY-----\n"
ENTRIES = [(("run", "sh -c 'nvidia-smi'"), 100.0, ssh.Result(0, "8 GPUs\n", "")),
           (("read_file", "/etc/gpu-serving/kimi-k2.6.env"), 100.5, b"NCCL_ALGO=Ring\nHF_TOKEN=x\n"),
           (("read_file", "/etc/absent"), 100.5, None),
           (("stat_mode", "/etc/gpu-serving/kimi-k2.6.env"), 100.6, 0o600),
           (("stat_owner", "/etc/gpu-serving/kimi-k2.6.env"), 100.6, "0:0")]


def test_what_is_sealed_comes_back_exactly():
    assert handoff.unseal(SECRET, RUN, handoff.seal(SECRET, RUN, ENTRIES), ssh.Result) == ENTRIES


@pytest.mark.parametrize("secret, run", [(SECRET + "x", RUN), (SECRET, (4242, "123457")), (SECRET, (4243, "123456"))],
                         ids=["another login key", "another start of the CLI", "another CLI"])
def test_only_the_same_login_key_and_run_open_it(secret, run):
    data = handoff.seal(SECRET, RUN, ENTRIES)
    assert b"HF_TOKEN" not in data and b"nvidia" not in data  # sealed, not merely encoded
    with pytest.raises(Exception):
        handoff.unseal(secret, run, data, ssh.Result)


def test_a_damaged_file_is_refused():
    data = bytearray(handoff.seal(SECRET, RUN, ENTRIES))
    data[-1] ^= 1
    with pytest.raises(Exception):
        handoff.unseal(SECRET, RUN, bytes(data), ssh.Result)


# ---- the directory and the files --------------------------------------------------------------

@pytest.fixture
def base(tmp_path, monkeypatch):
    d = tmp_path / "handoff"
    monkeypatch.setenv("GPU_SERVING_HANDOFF_DIR", str(d))
    made = handoff.directory()
    assert made == str(d) and stat.S_IMODE(os.stat(d).st_mode) == 0o700
    return made


@pytest.mark.parametrize("make", ["open to others", "a symlink to ours", "a file"])
def test_a_directory_that_is_not_safely_ours_is_not_used(tmp_path, monkeypatch, make):
    d = tmp_path / "h"
    if make == "open to others":
        d.mkdir(mode=0o755)
        d.chmod(0o755)
    elif make == "a symlink to ours":
        (tmp_path / "real").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "real")
    else:
        d.write_text("x")
    monkeypatch.setenv("GPU_SERVING_HANDOFF_DIR", str(d))
    assert handoff.directory() is None


def test_the_preview_keeps_what_it_was_served_and_the_update_takes_it_once(base):
    rec = handoff.Recorder()
    key = ("10.213.0.2", 22, "root", "ssh-ed25519 AAAA", "k")
    rec.start(key, SECRET, RUN, base)
    for request, started, value in ENTRIES:
        rec.note(key, request, started, value)
    rec.note(("10.0.0.9", 22, "root", "x", "y"), ("run", "true"), 100.0, ssh.Result(0, "", ""))  # not recorded
    files = os.listdir(base)
    assert len(files) == 1 and stat.S_IMODE(os.stat(os.path.join(base, files[0])).st_mode) == 0o600
    assert handoff.take(key, SECRET, RUN, base, now=101.0, make_result=ssh.Result) == ENTRIES
    assert os.listdir(base) == []  # taken once
    assert handoff.take(key, SECRET, RUN, base, now=101.0, make_result=ssh.Result) == []


def test_an_old_result_is_not_handed_over(base):
    rec = handoff.Recorder()
    key = ("h", 22, "root", "hk", "k")
    rec.start(key, SECRET, RUN, base)
    rec.note(key, ("run", "old"), 100.0, ssh.Result(0, "old", ""))
    rec.note(key, ("run", "new"), 100.0 + handoff.MAX_AGE, ssh.Result(0, "new", ""))
    # The operator read the preview for a while before answering: only what is young enough.
    got = handoff.take(key, SECRET, RUN, base, now=100.0 + handoff.MAX_AGE + 1, make_result=ssh.Result)
    assert [r for r, _, _ in got] == [("run", "new")]


def test_a_change_of_the_host_drops_the_handoff_for_every_login_to_it(base):
    rec = handoff.Recorder()
    a, b, other = ("h", 22, "root", "hk", "k1"), ("h", 22, "admin", "hk", "k2"), ("g", 22, "root", "hk", "k1")
    for key in (a, b, other):
        rec.start(key, SECRET, RUN, base)
        rec.note(key, ("run", "x"), 100.0, ssh.Result(0, "x", ""))
    assert len(os.listdir(base)) == 3
    rec.forget_scope(("h", 22))
    assert len(os.listdir(base)) == 1 and not rec.recording(a) and rec.recording(other)
    rec.note(a, ("run", "y"), 101.0, ssh.Result(0, "y", ""))  # after the change: never kept
    assert len(os.listdir(base)) == 1
    assert handoff.take(other, SECRET, RUN, base, now=101.0, make_result=ssh.Result)


def test_files_of_a_gone_cli_and_old_files_are_swept(base):
    mine = (os.getpid(), handoff._started(os.getpid()))
    for run in (mine, (2 ** 22 + 7, "1"), (os.getpid(), "1")):  # live; no such PID; the PID reused
        rec = handoff.Recorder()
        rec.start(("h", 22, "u", "hk", "k"), SECRET, run, base)
        rec.note(("h", 22, "u", "hk", "k"), ("run", "x"), 1.0, ssh.Result(0, "", ""))
    assert len(os.listdir(base)) == 3
    assert handoff.sweep(base) == 2
    assert os.listdir(base) == [handoff._path(base, mine, ("h", 22, "u", "hk", "k")).rsplit("/", 1)[1]]
    assert handoff.sweep(base, now_wall=time.time() + handoff.KEEP_SECONDS + 1) == 1
    assert os.listdir(base) == []


# ---- whose run: the `pulumi` CLI above the provider ---------------------------------------------

CHILD = ("import json, os, sys; sys.path.insert(0, {root!r}); from components.remote import handoff; "
         "print(json.dumps(handoff.cli_run()))")


def _child_of(parent_exe: str, args: list[str], tmp_path) -> object:
    import json
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = ("import subprocess, sys; r = subprocess.run([sys.argv[1], '-c', sys.argv[2]], capture_output=True, text=True);"
              "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)")
    out = subprocess.run([parent_exe, "-c", script, sys.executable, CHILD.format(root=root), *args],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "GPU_SERVING_LAUNCHED_PID": ""})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def pulumi_named_python(tmp_path):
    exe = tmp_path / "pulumi"
    shutil.copy(os.path.realpath(sys.executable), exe)
    return str(exe)


def test_a_provider_under_pulumi_up_knows_its_run(pulumi_named_python, tmp_path):
    cli, started, is_up = _child_of(pulumi_named_python, ["up", "--yes"], tmp_path)
    assert isinstance(cli, int) and started.isdigit() and is_up is True
    assert _child_of(pulumi_named_python, ["preview", "--refresh"], tmp_path)[2] is False


def test_a_provider_not_under_pulumi_keeps_no_handoff(tmp_path):
    assert _child_of(os.path.realpath(sys.executable), ["up"], tmp_path) is None


# ---- the cache holds what was handed over as if prefetched ----------------------------------------

def test_a_handed_over_result_is_served_until_its_own_age_and_never_after_a_change():
    clock = [1000.0]
    cache = readcache.ReadCache(clock=lambda: clock[0])
    assert cache.seed("h", "a", 1, started=995.0, max_age=10.0)
    assert cache.holds("h", "a") and not cache.holds("h", "b")
    assert not cache.seed("h", "a", 2, started=999.0, max_age=10.0)  # one result per request
    assert cache.take_read("h", "a") == (1, 995.0)
    assert cache.seed("h", "b", 2, started=989.0, max_age=10.0)
    assert cache.take("h", "b") is readcache.MISS  # 11 s old
    assert cache.seed("h", "c", 3, started=999.0, max_age=10.0)
    cache.clear("h")  # this process changed the host
    assert cache.take("h", "c") is readcache.MISS
    assert not cache.seed("h", "d", 4, started=999.0, max_age=10.0)  # nor after it
    assert not cache.seed("g", "e", ssh.Result(-1, "", ""), started=999.0, max_age=10.0)  # cut short


@pytest.fixture
def transport(monkeypatch):
    """ssh's reads with the host stood in for: each `_run` and SFTP read is counted."""
    calls = []
    monkeypatch.setattr(ssh, "prefetched", readcache.ReadCache())
    monkeypatch.setattr(handoff, "recorder", handoff.Recorder())
    ssh.prefetched.on_change(handoff.recorder.forget_scope)

    def run(t, command, input, timeout, purpose):
        calls.append(("run", command))
        return 0, f"out of {command}".encode(), b""

    class Sftp:
        def open(self, path, mode):
            calls.append(("read_file", path))
            return io.BytesIO(b"file")

        def stat(self, path):
            calls.append(("stat", path))
            return os.stat_result((0o100644, 0, 0, 1, 0, 0, 4, 0, 0, 0))

    @contextlib.contextmanager
    def sftp(t, what):
        yield Sftp()

    monkeypatch.setattr(ssh, "_run", run)
    monkeypatch.setattr(ssh, "_sftp", sftp)
    monkeypatch.setattr(ssh, "connect_ahead", lambda t: calls.append(("connect",)) or True)
    monkeypatch.setattr(ssh, "prefetch", lambda t, requests: 0)
    return calls


def _requests():
    return reads.host_facts(PROPS) + reads.expand(PREFETCH)


def test_the_update_reads_nothing_the_preview_read(base, transport):
    t = ssh.Target.from_props(PROPS)
    run = (os.getpid(), handoff._started(os.getpid()), True)
    # The preview: its provider keeps what its resources are served.
    ahead.hand_over(PROPS, True, run, base)
    preview = [ssh.fetch(t, r) for r in _requests()]
    made = len(transport)
    assert made == len(_requests())
    # The update: a new provider process (a fresh cache and recorder), the same CLI run.
    ssh.prefetched = readcache.ReadCache()
    handoff.recorder = handoff.Recorder()
    assert ahead.hand_over(PROPS, False, run, base) == len({ssh.request_key(t, r) for r in _requests()})
    assert all(ssh.held(t, r) for r in _requests())
    assert ahead.read_ahead(PROPS) == 0 and ("connect",) not in transport  # nothing left to read
    assert [ssh.fetch(t, r) for r in _requests()] == preview
    assert len(transport) == made  # not one read more
    assert os.listdir(base) == []


def test_an_update_that_changes_the_host_reads_it_again(base, transport):
    t = ssh.Target.from_props(PROPS)
    run = (os.getpid(), handoff._started(os.getpid()), True)
    ahead.hand_over(PROPS, True, run, base)
    facts = reads.host_facts(PROPS)[0]
    ssh.fetch(t, facts)
    ssh.prefetched = readcache.ReadCache()
    handoff.recorder = handoff.Recorder()
    assert ahead.hand_over(PROPS, False, run, base) == 1
    ssh.run(t, ["systemctl", "start", "x"], purpose="starting x")  # a change: what was handed over goes
    before = len(transport)
    ssh.fetch(t, facts)
    assert len(transport) == before + 1


def test_a_preview_that_is_not_an_up_keeps_nothing(base, transport):
    t = ssh.Target.from_props(PROPS)
    ahead.hand_over(PROPS, True, (os.getpid(), handoff._started(os.getpid()), False), base)
    ssh.fetch(t, reads.host_facts(PROPS)[0])
    assert os.listdir(base) == []


def test_another_run_of_the_cli_gets_nothing(base, transport):
    t = ssh.Target.from_props(PROPS)
    ahead.hand_over(PROPS, True, (os.getpid(), handoff._started(os.getpid()), True), base)
    ssh.fetch(t, reads.host_facts(PROPS)[0])
    assert ahead.hand_over(PROPS, False, (os.getpid(), "0", True), base) == 0
