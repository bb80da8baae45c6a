"""The product's one view of the rehearsal host (components/remote/rehearsal_adapter.py): a
running host's record on this machine read as a connection, a stopped or half-written one as
none. Records in a temporary directory; no host is booted."""
from __future__ import annotations

import json

import pytest

from components.remote import rehearsal_adapter

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKeyOfTheRehearsalHost"


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setattr(rehearsal_adapter, "RUN", str(tmp_path / "run"))
    (tmp_path / "login").write_text("LOGIN-KEY")

    def record(name: str, **info) -> None:
        (tmp_path / "run" / name).mkdir(parents=True)
        (tmp_path / "run" / name / "host.json").write_text(json.dumps(info))
    record("up1", state="running", address="10.213.1.2", port=22, user="root", private_key=str(tmp_path / "login"),
           host_public_key=KEY)
    record("down1", state="stopped", address="10.213.2.2", private_key=str(tmp_path / "login"), host_public_key=KEY)
    record("nokey", state="running", address="10.213.3.2", private_key=str(tmp_path / "gone"), host_public_key=KEY)
    (tmp_path / "run" / "torn").mkdir()
    (tmp_path / "run" / "torn" / "host.json").write_text("{\"state\": \"runn")
    return tmp_path


def test_only_running_hosts_have_an_address(records):
    assert rehearsal_adapter.addresses() == {"up1": "10.213.1.2", "nokey": "10.213.3.2"}
    assert rehearsal_adapter.host_record("down1") is None and rehearsal_adapter.host_record("torn") is None
    assert rehearsal_adapter.host_record("never") is None


def test_a_running_host_is_a_connection_and_a_machine(records):
    assert rehearsal_adapter.connection("up1") == {"host": "10.213.1.2", "port": 22, "user": "root",
                                                   "privateKey": "LOGIN-KEY", "hostKey": KEY}
    assert rehearsal_adapter.machine("up1") == {"host": "10.213.1.2", "hostKey": KEY}
    # Its login key unreadable: no connection, yet where it runs is still known.
    assert rehearsal_adapter.connection("nokey") is None
    assert rehearsal_adapter.machine("nokey") == {"host": "10.213.3.2", "hostKey": KEY}
    assert rehearsal_adapter.connection("down1") is None and rehearsal_adapter.machine("down1") is None


def test_a_labelled_connection_is_taken_as_the_host_says_now(records):
    stored = {"host": "10.213.9.9", "port": 22, "user": "root", "privateKey": "OLD", "hostKey": "ssh-ed25519 OLD",
              "rehearsal": "up1", "entry": "gpu-serving:host", "connectTimeout": 15}
    now = rehearsal_adapter.connection_now(stored)
    assert now == {**stored, "host": "10.213.1.2", "privateKey": "LOGIN-KEY", "hostKey": KEY}
    assert rehearsal_adapter.connection_now({**stored, "rehearsal": "down1"}) == {**stored, "rehearsal": "down1"}
    real = {k: v for k, v in stored.items() if k != "rehearsal"}
    assert rehearsal_adapter.connection_now(real) is real


def test_the_cuda_repository_keeps_its_host_paths():
    """Written into the hosts' apt source and the CudaToolkit state: the bytes do not change."""
    assert rehearsal_adapter.cuda_source().line == ("deb [signed-by=/usr/share/keyrings/gpu-serving-rehearsal-cuda.gpg] "
                                                   "file:/var/lib/gpu-serving/apt/cuda/ /")
    assert rehearsal_adapter.CUDA_REPO_DIR == "/var/lib/gpu-serving/apt/cuda"


def test_the_sentences_name_the_command_and_the_setting():
    assert rehearsal_adapter.not_running("w2", "hosts[w2]") == (
        "the rehearsal host 'w2' is not running: start it with `python -m rehearsal up w2` (or set hosts[w2].address)")
    assert rehearsal_adapter.key_from("pt1") == "the rehearsal host 'pt1' (the key it printed, in its host.json)"
