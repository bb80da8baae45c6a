"""A stack pointed at another machine (another address *and* host key, or another rehearsal host)
is a move: the providers ask Pulumi to replace the unit file, the service and its readiness
check (create on the new machine, then delete on the old one), never an update that would leave
the old machine serving. A renumbered machine (same key) or a reinstalled one (same address) is
the same machine. Pure diffs and the unit file's delete over a recorded fake transport."""
from __future__ import annotations

import pytest

from components.remote import identity, providers, ssh

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


def conn(host: str, key: str, **extra) -> dict:
    return {"host": host, "port": 22, "user": "root", "privateKey": "k", "hostKey": key, **extra}


CASES = [
    # (what happened, old connection, new connection, another machine?)
    ("another box", conn("10.0.0.11", KEY_A), conn("10.0.0.12", KEY_B), True),
    ("renumbered: same key", conn("10.0.0.11", KEY_A), conn("10.0.0.99", KEY_A), False),
    ("renumbered, key with a comment", conn("10.0.0.11", KEY_A), conn("10.0.0.99", KEY_A + " root@gpu1"), False),
    ("reinstalled: same address", conn("10.0.0.11", KEY_A), conn("10.0.0.11", KEY_B), False),
    ("another login and port", conn("10.0.0.11", KEY_A), conn("10.0.0.11", KEY_A, user="deploy", port=2222), False),
    ("a label added", conn("10.0.0.11", KEY_A), conn("10.0.0.11", KEY_A, entry="gpu-serving:host"), False),
    ("another rehearsal host", conn("10.213.0.2", KEY_A, rehearsal="default"),
     conn("10.213.2.2", KEY_B, rehearsal="mv2"), True),
    ("a rehearsal host rebuilt: new address and key, same name", conn("10.213.0.2", KEY_A, rehearsal="default"),
     conn("10.213.4.2", KEY_B, rehearsal="default"), False),
    ("from the rehearsal host to a real one", conn("10.213.0.2", KEY_A, rehearsal="default"),
     conn("gpu-box-1.example.internal", KEY_B), True),
    ("unknown in a preview", conn("10.0.0.11", KEY_A), "04da6b54-80e4-46f7-96ec-b56ff0331ba9", False),
]


@pytest.mark.parametrize("what, old, new, moved", CASES, ids=[c[0] for c in CASES])
def test_another_machine(what, old, new, moved):
    assert ssh.another_machine(old, new) is moved


def _file(connection) -> dict:
    return {"connection": connection, "path": "/etc/systemd/system/sglang-kimi-k2.6-tp8.service", "content": "x\n",
            "mode": "0644", "reloadSystemd": True}


def _service(connection) -> dict:
    return {"connection": connection, "unit": "sglang-kimi-k2.6-tp8.service", "configHash": "h", "port": 30001,
            "bind": "0.0.0.0", "declared": {"tp_size": 8}, "execStart": "python -m sglang.launch_server",
            "environment": {}, "active": True, "enabled": True, "readinessReport": {"status": "ready"}}


def _readiness(connection) -> dict:
    return {"connection": connection, "unit": "sglang-kimi-k2.6-tp8.service", "port": 30001,
            "declared": {"tp_size": 8}, "status": "ready"}


@pytest.mark.parametrize("what, old, new, moved", CASES[:9], ids=[c[0] for c in CASES[:9]])
def test_a_move_replaces_the_unit_file_the_service_and_its_check_and_nothing_else_does(what, old, new, moved, capsys):
    for provider, props in ((providers.RemoteFileProvider(), _file), (providers.ServiceProvider(), _service),
                            (providers.ReadinessProvider(), _readiness)):
        result = provider.diff("id", props(old), props(new))
        assert result.replaces == (["connection"] if moved else []), (provider, result.replaces)
        assert result.changes is (ssh.reach(old) != ssh.reach(new)), provider
        assert not result.delete_before_replace  # the new machine first, the old one emptied after
    said = capsys.readouterr().err
    assert ("sglang-kimi-k2.6-tp8.service moves from" in said) is moved, said
    if moved:
        assert f"moves from {old['host']} to {new['host']}: it starts there and is checked, then it is stopped" in said


def test_a_renamed_unit_is_written_first_and_the_old_file_removed_after():
    old, new = _file(conn("10.0.0.11", KEY_A)), _file(conn("10.0.0.11", KEY_A))
    new["path"] = "/etc/systemd/system/sglang-kimi-k2.7-tp8.service"
    result = providers.RemoteFileProvider().diff("id", old, new)
    assert result.replaces == ["path"] and not result.delete_before_replace


@pytest.fixture
def commands(monkeypatch):
    ran: list[list[str]] = []
    monkeypatch.setattr(ssh, "run", lambda t, argv, **kw: ran.append(list(argv)))
    monkeypatch.setattr(ssh, "remove_file", lambda t, path: ran.append(["rm", "-f", "--", path]))
    return ran


def test_a_unit_files_delete_stops_and_disables_the_unit_before_removing_its_file(commands):
    """Pulumi deletes the old machine's unit file and service at once when a move replaces both:
    the file's delete must never leave the unit running without a file (systemctl could then no
    longer disable it, and it would start again at boot)."""
    providers.RemoteFileProvider().delete("id", _file(conn("10.0.0.11", KEY_A)))
    unit = "sglang-kimi-k2.6-tp8.service"
    assert commands == [["systemctl", "disable", "--now", unit], ["rm", "-f", "--", f"/etc/systemd/system/{unit}"],
                        ["systemctl", "daemon-reload"]]


def test_other_files_are_only_removed(commands):
    props = {**_file(conn("10.0.0.11", KEY_A)), "path": "/etc/gpu-serving/other.conf", "reloadSystemd": False}
    providers.RemoteFileProvider().delete("id", props)
    assert commands == [["rm", "-f", "--", "/etc/gpu-serving/other.conf"]]


# --- a machine that does not answer, which the stack no longer names ----------------------------

class Settings:
    """The engine's config as the dynamic provider's `configure` gets it: JSON text per key."""

    def __init__(self, values: dict):
        import json
        self.values = {k: json.dumps(v) for k, v in values.items()}

    def get(self, key):
        return self.values.get(key)


@pytest.fixture
def declared(monkeypatch):
    monkeypatch.setattr(identity, "_declared", {})
    monkeypatch.setattr(identity, "_left", set())
    monkeypatch.setattr(ssh, "rehearsal_info", lambda name: None)

    def declare(values: dict) -> None:
        identity.remember_config(Settings(values))
    return declare


A = conn("10.0.0.11", KEY_A, entry="gpu-serving:host")
DECLARED = [
    # (the stack's host settings now, the state's connection, where it is now (None: still this one))
    ({"gpu-serving:host": {"address": "10.0.0.11", "hostKey": KEY_A}}, A, None),
    ({"gpu-serving:host": {"address": "10.0.0.99", "hostKey": KEY_A}}, A, None),  # renumbered
    ({"gpu-serving:host": {"address": "10.0.0.12", "hostKey": KEY_B}}, A, "10.0.0.12"),
    ({"gpu-serving:host": {"rehearsal": "default"}}, A, "the rehearsal host 'default'"),
    ({"gpu-serving:host": {}, "gpu-serving:hosts": [{"name": "gpu1", "address": "10.0.0.11", "hostKey": KEY_A}]}, A, ""),
    ({"gpu-serving:host": {"user": "root"}, "gpu-serving:hosts": [{"name": "gpu2", "address": "10.0.0.12", "hostKey": KEY_B}]},
     conn("10.0.0.12", KEY_B, entry="hosts[gpu2]"), None),
    ({"gpu-serving:host": {"user": "root"}, "gpu-serving:hosts": [{"name": "gpu1", "address": "10.0.0.11", "hostKey": KEY_A}]},
     conn("10.0.0.12", KEY_B, entry="hosts[gpu2]"), ""),  # its entry removed from the fleet
    ({"gpu-serving:host": {"user": "root"}, "gpu-serving:hosts": [{"name": "gpu2", "address": "10.0.0.13", "hostKey": KEY_A}]},
     conn("10.0.0.12", KEY_B, entry="hosts[gpu2]"), "10.0.0.13"),
    ({"gpu-serving:host": {"address": "10.0.0.12", "hostKey": KEY_B}}, conn("10.0.0.11", KEY_A), None),  # no label: cannot tell
    ({}, A, None),  # no settings: cannot tell
]


@pytest.mark.parametrize("settings, state, now", DECLARED)
def test_where_the_stack_now_puts_the_machine(declared, settings, state, now):
    declared(settings)
    assert identity.declared_machine(state) == now


class Dead:
    """A provider's read on a machine that does not answer."""

    def __init__(self):
        self.reads = 0

    def read(self, id, props):
        self.reads += 1
        raise ssh.Unreachable("cannot reach root@10.0.0.11:22 over SSH after 3 attempt(s) in 4 s")


def test_a_machine_still_named_stops_the_run_at_the_read(declared):
    declared({"gpu-serving:host": {"address": "10.0.0.11", "hostKey": KEY_A}})
    with pytest.raises(ssh.Unreachable):
        identity.checked_read(Dead.read)(Dead(), "id", {"connection": A})
    assert not identity.left_behind({"connection": A, identity.UNREACHABLE: "x"})


def test_a_machine_moved_off_is_recorded_and_its_deletes_run_nothing(declared, commands, capsys):
    declared({"gpu-serving:host": {"address": "10.0.0.12", "hostKey": KEY_B}})
    result = identity.checked_read(Dead.read)(Dead(), "id", {**_service(A), "connection": A})
    assert result.outs[identity.UNREACHABLE].startswith("cannot reach")
    assert "does not answer" in capsys.readouterr().err
    # The engine's Check with the program's inputs (the new machine) lets it through ...
    identity.check(result.inputs, {"connection": conn("10.0.0.12", KEY_B, entry="gpu-serving:host")})
    # ... but never with this machine declared again.
    with pytest.raises(ssh.Unreachable):
        identity.check(result.inputs, {"connection": A})
    providers.ServiceProvider().delete("id", result.outs)
    providers.RemoteFileProvider().delete("id", {**_file(A), identity.UNREACHABLE: "x"})
    assert commands == []
    assert "sglang-kimi-k2.6-tp8.service is left on 10.0.0.11, which does not answer" in capsys.readouterr().err
