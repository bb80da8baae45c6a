"""A stack pointed at another machine (another address *and* host key, or another rehearsal host)
is a move: the providers ask Pulumi to replace the unit file, the service and its readiness
check (create on the new machine, then delete on the old one), never an update that would leave
the old machine serving. A renumbered machine (same key) or a reinstalled one (same address) is
the same machine. Pure diffs and the unit file's delete over a recorded fake transport."""
from __future__ import annotations

import pytest

from components.remote import identity, providers, service_state, ssh

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
    # Each command answers nothing, as a host with nothing of ours would.
    monkeypatch.setattr(ssh, "run", lambda t, argv, **kw: ran.append(list(argv)) or ssh.Result(0, "", ""))
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


# --- the router's own machine (gpu-serving:router.host or .runsOn) -------------------------------

def _router(connection, unit="gpu-serving-router.service") -> dict:
    return {"connection": connection, "unit": unit, "unitText": "[Unit]\n", "bind": "0.0.0.0", "port": 30080,
            "venvPath": "/opt/gpu-serving-router", "adminKey": "admin-key-0123456789", "active": True, "enabled": True}


@pytest.fixture
def router_steps(monkeypatch, commands):
    """RouterServiceProvider's update over the recorded transport: the new router's start is
    recorded as one step (`converge <host>`) between the old one's commands."""
    from components.remote import router
    monkeypatch.setattr(router.RouterServiceProvider, "_converge",
                        lambda self, props: commands.append(["converge", props["connection"]["host"]]) or dict(props))
    return router.RouterServiceProvider()


def test_a_router_moved_to_another_machine_starts_there_before_the_old_one_is_retired(router_steps, commands, capsys):
    """The router's resources are kept on delete (every strategy stack declares the same router),
    so a move is an update that retires the old router itself, after the new one answers: never
    two routers enabled, never one left running on a machine the stack no longer names."""
    old, new = _router(conn("10.0.0.11", KEY_A, entry="gpu-serving:router.host")), _router(conn("10.0.0.12", KEY_B))
    diff = router_steps.diff("id", old, new)
    assert diff.changes and diff.replaces == []
    said = capsys.readouterr().err
    assert "router: gpu-serving-router.service moves from 10.0.0.11 to 10.0.0.12: it starts there and is checked" in said
    router_steps.update("id", old, new)
    unit = "gpu-serving-router.service"
    assert commands == [["converge", "10.0.0.12"], ["systemctl", "disable", "--now", unit],
                        ["rm", "-f", "--", f"/etc/systemd/system/{unit}"],
                        ["rm", "-f", "--", "/etc/gpu-serving/gpu-serving-router.env"],
                        ["rm", "-f", "--", f"/run/gpu-serving/{unit}.started"], ["systemctl", "daemon-reload"]]
    assert "stopped and disabled on 10.0.0.11, its unit file and environment file removed" in capsys.readouterr().err


def test_a_renamed_router_unit_stops_the_old_one_first_since_both_take_the_port(router_steps, commands, capsys):
    old = _router(conn("10.0.0.11", KEY_A))
    new = _router(conn("10.0.0.11", KEY_A), unit="gpu-serving-router-b.service")
    router_steps.diff("id", old, new)
    assert "gpu-serving-router.service is renamed gpu-serving-router-b.service" in capsys.readouterr().err
    router_steps.update("id", old, new)
    assert commands[0] == ["systemctl", "disable", "--now", "gpu-serving-router.service"]
    assert commands[-1] == ["converge", "10.0.0.11"]
    assert ["rm", "-f", "--", "/etc/gpu-serving/gpu-serving-router.env"] in commands


@pytest.mark.parametrize("new", [conn("10.0.0.11", KEY_A), conn("10.0.0.99", KEY_A), conn("10.0.0.11", KEY_B)],
                         ids=["unchanged", "renumbered", "reinstalled"])
def test_a_router_on_the_same_machine_retires_nothing(router_steps, commands, new, capsys):
    router_steps.update("id", _router(conn("10.0.0.11", KEY_A)), _router(new))
    assert commands == [["converge", new["host"]]]
    assert "moves from" not in capsys.readouterr().err


def test_a_router_moved_off_a_dead_machine_is_left_there_and_said(declared, router_steps, commands, capsys):
    """The old router's machine does not answer and the stack names another one: the refresh
    records it, the new router starts, and the old one is left with the command that stops it."""
    declared({"gpu-serving:router": {"host": {"address": "10.0.0.12", "hostKey": KEY_B}}})
    old_c = conn("10.0.0.11", KEY_A, entry="gpu-serving:router.host")
    read = identity.checked_read(Dead.read)(Dead(), "id", _router(old_c))
    assert read.outs[identity.UNREACHABLE]
    router_steps.update("id", read.outs, _router(conn("10.0.0.12", KEY_B, entry="gpu-serving:router.host")))
    assert commands == [["converge", "10.0.0.12"]]
    said = capsys.readouterr().err
    assert ("router: warning: gpu-serving-router.service is left on 10.0.0.11, which does not answer: if it comes back "
            "it starts gpu-serving-router.service at boot; run `systemctl disable --now gpu-serving-router.service` there") in said


def test_a_router_on_a_dead_machine_still_named_stops_the_run(declared):
    declared({"gpu-serving:router": {"host": {"address": "10.0.0.11", "hostKey": KEY_A}}})
    with pytest.raises(ssh.Unreachable):
        identity.checked_read(Dead.read)(Dead(), "id", _router(conn("10.0.0.11", KEY_A, entry="gpu-serving:router.host")))


# --- the same unit on the same machine under another resource name ------------------------------

def test_a_renamed_resource_on_the_same_machine_takes_the_unit_over_and_the_old_delete_leaves_it(declared, commands, capsys,
                                                                                                 monkeypatch):
    """A fleet entry renamed (gpu2 -> b2), or a stack turned from gpu-serving:host into a fleet
    listing that machine: Pulumi creates the new names and then deletes the old ones. The engine
    checks every declared resource first; the old delete then leaves the unit serving and its file
    in place, where it stopped the unit the new resource had just taken over."""
    service, unit_file = providers.ServiceProvider(), providers.RemoteFileProvider()
    renamed = conn("10.0.0.99", KEY_A, entry="hosts[b2]")  # the same machine, and even renumbered
    for provider, props in ((service, _service), (unit_file, _file)):
        provider.check({}, props(renamed))
    commands.clear()  # the service's check reads what serves (its switch preview)
    service.delete("id", _service(conn("10.0.0.11", KEY_A, entry="hosts[gpu2]")))
    unit_file.delete("id", _file(conn("10.0.0.11", KEY_A, entry="hosts[gpu2]")))
    assert commands == []
    assert "is declared under another name on the same machine now" in capsys.readouterr().err
    # Another machine, or another unit, is deleted as ever.
    monkeypatch.setattr(service_state, "show", lambda t, units: {units[0]: {"ActiveState": "active"}})
    service.delete("id", _service(conn("10.0.0.12", KEY_B)))
    unit_file.delete("id", {**_file(conn("10.0.0.11", KEY_A)), "path": "/etc/systemd/system/sglang-other.service"})
    assert ["systemctl", "disable", "--now", "sglang-kimi-k2.6-tp8.service"] in commands
    assert ["rm", "-f", "--", "/etc/systemd/system/sglang-other.service"] in commands
