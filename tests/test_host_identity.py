"""Issue 12.7 as pure logic: a host key changed since the last up (components/remote/identity.py).
The same on real hosts: tests/e2e/test_host_key_rotation.py."""
import json

import pytest

from components.remote import identity, rehearsal_adapter, ssh

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHb0Q5aF0N5bq2f3c2uZr0c0nZqGJ3wC9nD8pX3qk8m1"
THIRD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB9m2Yk0bq5c5N0w9j2pQ0m8g3sX1u6f1rN4e7cQ2a3Z"


def conn(key, host="10.0.0.12", **extra):
    return {"host": host, "port": 22.0, "user": "root", "privateKey": "k", "hostKey": key,
            "entry": "hosts[gpu2]", "keyFrom": "hosts[gpu2].hostKey", **extra}


def state(presented=NEW):
    return {"connection": conn(OLD), identity.PRESENTED: presented}


def test_no_record_is_no_check():
    identity.check({"connection": conn(OLD)}, {"connection": conn(THIRD)})


def test_the_declared_key_presented_by_the_host_is_used():
    identity.check(state(), {"connection": conn(NEW + " comment")})


@pytest.mark.parametrize("declared,says", [(OLD, "hosts[gpu2].hostKey is still that old key"),
                                           (THIRD, "hosts[gpu2].hostKey pins a third key, " + ssh.key_fingerprint(THIRD))])
def test_a_key_the_declaration_does_not_pin_stops_naming_entry_keys_and_origin(declared, says):
    with pytest.raises(ssh.RemoteError) as info:
        identity.check(state(), {"connection": conn(declared)})
    text = str(info.value)
    assert text.startswith("host identity check failed for hosts[gpu2] (root@10.0.0.12:22): it presents " + ssh.key_fingerprint(NEW))
    assert f"the key the stack's state recorded at the last `pulumi up` is {ssh.key_fingerprint(OLD)}" in text
    assert says in text and "then set it as hosts[gpu2].hostKey" in text


def test_another_address_is_not_judged_by_the_key_seen_at_the_old_one():
    identity.check(state(), {"connection": conn(THIRD, host="10.0.0.13")})


def test_a_stale_rehearsal_record_says_how_to_restart_it():
    with pytest.raises(ssh.RemoteError, match="python -m rehearsal restart pt1"):
        identity.check(state(), {"connection": conn(OLD, rehearsal="pt1")})


@identity.guarded
class Reader:
    def __init__(self, error=None):
        self.error = error

    def read(self, id, props):
        if self.error:
            raise self.error
        from pulumi.dynamic import ReadResult
        return ReadResult(id_=id, outs=dict(props))

    def check(self, olds, news):
        return "checked"


def test_read_records_the_presented_key_and_a_good_read_clears_it():
    changed = ssh.HostKeyChanged("mismatch", presented=NEW + " root@x", pinned=OLD)
    result = Reader(changed).read("id", {"connection": conn(OLD)})
    assert result.outs[identity.PRESENTED] == NEW and result.inputs[identity.PRESENTED] == NEW
    assert identity.PRESENTED not in Reader().read("id", state()).outs
    with pytest.raises(ssh.RemoteError):  # any other failure stays a failure
        Reader(ssh.RemoteError("cannot reach")).read("id", {"connection": conn(OLD)})


def test_guarded_check_runs_the_identity_check_first():
    assert Reader().check(state(), {"connection": conn(NEW)}) == "checked"
    with pytest.raises(ssh.RemoteError):
        Reader().check(state(), {"connection": conn(OLD)})


def test_a_remembered_failure_keeps_its_kind():
    import copy
    again = copy.copy(ssh.HostKeyChanged("m", presented=NEW, pinned=OLD))
    assert isinstance(again, ssh.HostKeyChanged) and again.presented == NEW


def test_a_rehearsal_connection_is_read_as_its_host_json_says_now(tmp_path, monkeypatch):
    monkeypatch.setattr(rehearsal_adapter, "RUN", str(tmp_path))
    (tmp_path / "pt1").mkdir()
    (tmp_path / "key").write_text("NEW-LOGIN-KEY")
    (tmp_path / "pt1" / "host.json").write_text(json.dumps({
        "state": "running", "address": "10.213.9.2", "port": 22, "user": "root",
        "private_key": str(tmp_path / "key"), "host_public_key": NEW}))
    t = ssh.Target.from_props({"connection": conn(OLD, rehearsal="pt1")})
    assert (t.host, t.host_key, t.private_key) == ("10.213.9.2", NEW, "NEW-LOGIN-KEY")
    gone = ssh.Target.from_props({"connection": conn(OLD, rehearsal="pt2")})  # not running: as stored
    assert (gone.host, gone.host_key) == ("10.0.0.12", OLD)


def test_labels_are_no_change_of_the_connection():
    assert ssh.reach(conn(OLD)) == ssh.reach({**conn(OLD), "entry": "gpu-serving:host", "rehearsal": "x"})
    assert ssh.reach(conn(OLD)) != ssh.reach(conn(NEW))
