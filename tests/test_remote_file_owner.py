"""The owner of a file gpu-serving writes (the unit, the environment file with its secrets): a
file given to another user by hand is drift, shown and put back by the next up. RemoteFileProvider
over a fake host (every read and write recorded)."""
from __future__ import annotations

import contextlib
import hashlib

import pytest

from components.core import reads
from components.remote import host_lock, providers, ssh

PATH = "/etc/gpu-serving/kimi-k2.6.env"
CONTENT = "NCCL_ALGO=Ring\n"
CONNECTION = {"host": "192.0.2.7", "port": 22, "user": "root", "privateKey": "k", "hostKey": "ssh-ed25519 AAAA"}


class Host:
    def __init__(self, owner: str, mode: int = 0o600, user: str = "root"):
        self.data, self.mode, self.owner = CONTENT.encode(), mode, owner
        self.writes: list[tuple[str, bytes, int]] = []
        self.connection = {**CONNECTION, "user": user}

    def fetch(self, t, request):
        return {"read_file": self.data, "stat_mode": self.mode, "stat_owner": self.owner}[request["op"]]

    def write_file(self, t, path, content, mode):
        self.writes.append((path, content, mode))
        self.data, self.mode, self.owner = content, mode, "0:0"  # renamed over it: root's


@pytest.fixture
def host(monkeypatch):
    def make(owner: str, **kw) -> Host:
        h = Host(owner, **kw)
        monkeypatch.setattr(ssh, "fetch", h.fetch)
        monkeypatch.setattr(ssh, "read_file", lambda t, p: h.data)
        monkeypatch.setattr(ssh, "stat_mode", lambda t, p: h.mode)
        monkeypatch.setattr(ssh, "stat_owner", lambda t, p: h.owner)
        monkeypatch.setattr(ssh, "write_file", h.write_file)
        monkeypatch.setattr(ssh, "one_connection", lambda t, during: contextlib.nullcontext())
        monkeypatch.setattr(host_lock, "acquire", lambda t, wait=0: None)
        return h
    return make


def _props(h: Host) -> dict:
    return {"connection": h.connection, "path": PATH, "content": CONTENT, "mode": "0600", "secretEnvironment": {}}


def test_a_file_given_to_another_user_is_drift_and_the_up_gives_it_back_to_root(host):
    h = host("1000:1000")
    provider = providers.RemoteFileProvider()
    result = provider.read(f"192.0.2.7:{PATH}", _props(h))
    assert result.outs["owner"] == "1000:1000" and result.inputs["owner"] == "1000:1000"
    assert provider.diff("id", result.outs, _props(h)).changes is True  # content and mode as declared: the owner alone
    provider.update("id", result.outs, _props(h))
    assert h.writes == [(PATH, CONTENT.encode(), 0o600)] and h.owner == "0:0"
    again = provider.read(f"192.0.2.7:{PATH}", result.outs)
    assert "owner" not in again.outs and "owner" not in again.inputs
    assert provider.diff("id", again.outs, _props(h)).changes is False


def test_roots_file_reads_as_before_and_is_not_written_again(host):
    h = host("0:0")
    provider = providers.RemoteFileProvider()
    result = provider.read("id", _props(h))
    assert "owner" not in result.outs
    assert result.outs["sha256"] == hashlib.sha256(CONTENT.encode()).hexdigest()
    provider.update("id", result.outs, _props(h))
    assert h.writes == []


def test_over_a_login_other_than_root_the_owner_is_that_logins_and_never_drift(host):
    h = host("1000:1000", user="deploy")
    provider = providers.RemoteFileProvider()
    assert "owner" not in provider.read("id", _props(h)).outs


def test_the_owner_is_read_with_the_file_and_prefetched_with_it():
    assert [r["op"] for r in reads.remote_file({"path": PATH})] == ["read_file", "stat_mode", "stat_owner"]
    assert set(ssh.FILE_OPS) == {"read_file", "stat_mode", "stat_owner"}


def test_the_files_hash_is_an_output_of_the_read_never_an_input(host):
    """The program declares `sha256` as None (an output); a read that gave it back as an input
    made every later refresh of an untouched file show `[diff: -sha256]`."""
    h = host("0:0")
    provider = providers.RemoteFileProvider()
    written = provider.create(_props(h)).outs
    assert written["sha256"] == hashlib.sha256(CONTENT.encode()).hexdigest()
    result = provider.read("id", written)
    assert result.outs["sha256"] == written["sha256"]
    assert "sha256" not in result.inputs
    assert result.inputs == {k: v for k, v in _props(h).items()}
