"""Issue 12.7: a host that got a new SSH host key (reinstalled, rebuilt, key rotated) is not a dead end.

`refresh: always` reads every resource with the connection the state recorded at the last `up`,
so with the old key. Before: every preview, refresh and up failed naming the old key, also after
the operator had set the new one, and only `pulumi state delete` got out. Now: while the declared
key is the old one (or a third one), the run stops before anything is sent to the host, naming the
fleet entry, the key it presents, the state's key and the declared one; once the verified new key
is declared, one `up` connects with it and the drift check is clean again. A rehearsal entry
re-pins what the rebuilt rehearsal host printed, so one `up` recovers a fleet with one host rebuilt.
Real rehearsal hosts, the real Pulumi engine.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pulumi import automation as auto

from components.remote import ssh
from rehearsal import host as rehearsal
from tests import hardening_support as H

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-tp8.service"
# Inside the host, without SSH (its key is what changes): a new ed25519 host key, sshd restarted.
ROTATE = ("rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub && "
          "ssh-keygen -q -t ed25519 -N '' -C reinstalled -f /etc/ssh/ssh_host_ed25519_key && "
          "systemctl restart ssh && cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub")


# The drift check's exit status with this Pulumi when it finds changes (README "Drift"): not the
# 255 of an error, so a script can tell drift from a failure.
DRIFT_EXIT = 7


def drift_check(d, stack: str) -> subprocess.CompletedProcess:
    """`pulumi preview --refresh --expect-no-changes`, the README's drift check, by the CLI."""
    argv = [str(Path(d.env["GPU_SERVING_PULUMI_BIN"]) / "pulumi"), "preview", "--refresh", "--expect-no-changes",
            "--non-interactive", "--stack", stack]
    return subprocess.run(argv, cwd=d.project, env=d.env, capture_output=True, text=True, timeout=600)


def main_pid(host) -> str:
    return H.nsenter(host, "systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()


def failing(op, **kwargs) -> str:
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as info:
        op(on_output=lines.append, **kwargs)
    text = "\n".join(lines) + "\n" + str(info.value)
    print(text)  # shown when an assertion on it fails
    return text


@pytest.fixture(scope="module")
def reinstalled(tmp_path_factory, rehearsal_host_factory):
    """A fleet entry `gpu2` written as for a real machine (address, pinned hostKey, key file),
    deployed, then given a new host key."""
    host = rehearsal_host_factory()
    H.install_command_log(host)
    d = make_deployment(tmp_path_factory.mktemp("host-key"), host)

    def one_real_entry(config):
        config["gpu-serving:host"]["value"].pop("rehearsal", None)
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu2", "address": host.address, "hostKey": host.host_public_key,
                                                  "privateKeyPath": host.private_key}]}
    d.edit_project(one_real_entry)
    return d


def declare_key(d, key: str) -> None:
    def set_key(config):
        config["gpu-serving:hosts"]["value"][0]["hostKey"] = key
    d.edit_project(set_key)


def test_reinstalled_host_stops_the_run_naming_both_keys_then_its_new_key_converges(reinstalled, tmp_path):
    d, host = reinstalled, reinstalled.host
    stack = d.stack("tp8")
    assert stack.up(on_output=print).outputs["readiness"].value["gpu2"]["status_when_checked"] == "ready"
    pid = main_pid(host)
    old = host.host_public_key
    out = H.nsenter(host, "sh", "-c", ROTATE)
    assert out.returncode == 0, out.stderr
    new = out.stdout.strip()
    assert ssh.key_blob(new) != ssh.key_blob(old)
    record = H.HostRecord(host)
    mark = record.mark()

    # The declared key is still the old one: every run stops at the handshake, saying why and how out.
    for op, kwargs in ((stack.up, {}), (stack.preview, {"refresh": True, "expect_no_changes": True})):
        text = failing(op, **kwargs)
        assert "host identity check failed for hosts[gpu2]" in text, "(output above)"
        assert f"it presents {ssh.key_fingerprint(new)}" in text, "(output above)"
        assert (f"the key the stack's state recorded at the last `pulumi up` is {ssh.key_fingerprint(old)}, "
                "and hosts[gpu2].hostKey is still that old key") in text, "(output above)"
        assert "then set it as hosts[gpu2].hostKey" in text, "(output above)"

    # By the CLI: an error, not the exit status of drift.
    out = drift_check(d, "tp8")
    assert out.returncode not in (0, DRIFT_EXIT) and "host identity check failed" in out.stdout + out.stderr, out
    print("drift check refusing a changed host key: exit", out.returncode)

    # A third key declared (neither the state's nor the host's): refused as well.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "third")], check=True)
    third = " ".join((tmp_path / "third.pub").read_text().split()[:2])
    declare_key(d, third)
    text = failing(stack.up)
    assert f"hosts[gpu2].hostKey pins a third key, {ssh.key_fingerprint(third)}" in text, "(output above)"

    # Nothing reached the host: no login, no command, over any connection.
    commands, logins = record.since(mark)
    assert commands == [] and logins == 0, (commands, logins)

    # The verified new key declared: one up connects with it (saying so), the model keeps serving.
    declare_key(d, new)
    lines: list[str] = []
    result = stack.up(on_output=lines.append)
    output = "\n".join(lines)
    assert f"hosts[gpu2] (root@{host.address}:22): connecting with the declared key, {ssh.key_fingerprint(new)}" in output, output[-3000:]
    assert result.outputs["readiness"].value["gpu2"]["status_when_checked"] == "ready"
    assert main_pid(host) == pid  # a new key is no reason to restart the server
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, rehearsal_host_factory):
    a, b = rehearsal_host_factory(), rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("rebuilt"), a)

    def two_hosts(config):
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu1", "rehearsal": a.name}, {"name": "gpu2", "rehearsal": b.name}]}
    d.edit_project(two_hosts)
    d.hosts = {"gpu1": a, "gpu2": b}
    return d


def test_fleet_with_one_rehearsal_host_rebuilt_recovers_in_one_up(fleet):
    """gpu2 is rebuilt (down, up: a new disk, host key and login key): one `up` deploys it again
    with the key it printed, gpu1's server keeps running, and the drift check is clean; no
    `pulumi state delete`."""
    stack = fleet.stack("tp8")
    stack.up(on_output=print)
    gpu1, gpu2 = fleet.hosts["gpu1"], fleet.hosts["gpu2"]
    pid1 = main_pid(gpu1)
    rehearsal.down(gpu2.name)
    rebuilt = rehearsal.up(gpu2.name)
    assert ssh.key_blob(rebuilt.host_public_key) != ssh.key_blob(gpu2.host_public_key)

    # The drift check sees the rebuilt host as it is (its units are gone): drift, exit 7.
    out = drift_check(fleet, "tp8")
    assert out.returncode == DRIFT_EXIT, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert "gpu2-" in out.stdout

    result = stack.up(on_output=print)
    readiness = result.outputs["readiness"].value
    assert readiness["gpu1"]["status_when_checked"] == "ready" and readiness["gpu2"]["status_when_checked"] == "ready", readiness
    assert main_pid(rebuilt) not in ("", "0")
    assert main_pid(gpu1) == pid1
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory, rehearsal_host_factory):
    """Two machines written as real hosts (address, pinned hostKey, key file): the stack is
    deployed on the first, then pointed at the second, as an operator moves a stack to another box."""
    a, b = rehearsal_host_factory(), rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("moved"), a)

    def point_at(machine):
        def edit(config):
            host = config["gpu-serving:host"]["value"]
            host.pop("rehearsal", None)
            host.update(address=machine.address, hostKey=machine.host_public_key, privateKeyPath=machine.private_key)
        d.edit_project(edit)
    d.point_at = point_at
    d.machines = (a, b)
    return d


def test_a_stack_pointed_at_another_machine_moves_there_and_leaves_nothing_serving_behind(two_machines):
    """Before: pointing a deployed stack at another machine was an update of the same resources:
    the new machine was set up and served, and the old one kept serving, enabled across reboots,
    forgotten by the stack (its drift checks, status and destroy). Now the unit moves: the
    preview says so, the up starts it on the new machine and checks it, then stops it and removes
    its unit file on the old one; CUDA, the venv and the environment file stay there."""
    d, (a, b) = two_machines, two_machines.machines
    stack = d.stack("tp8")
    d.point_at(a)
    assert stack.up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    pid = main_pid(a)

    d.point_at(b)
    lines: list[str] = []
    preview = stack.preview(on_output=lines.append)
    output = "\n".join(lines)
    print(output)
    assert f"{UNIT} moves from {a.address} to {b.address}: it starts there and is checked" in output
    assert f"{UNIT} is stopped and removed on {a.address}, where it serves now" in output
    assert preview.change_summary.get("replace", 0) >= 3, preview.change_summary
    assert main_pid(a) == pid  # a preview changes nothing

    result = stack.up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert result.outputs["endpoint"].value == f"http://{b.address}:30001"
    on_b = H.nsenter(b, "sh", "-c", f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}").stdout.split()
    assert on_b == ["active", "enabled"], on_b
    left = H.nsenter(a, "sh", "-c", f"systemctl is-active {UNIT}; ls /etc/systemd/system/{UNIT} "
                                    f"/etc/systemd/system/multi-user.target.wants/{UNIT} 2>&1; ls /etc/gpu-serving")
    assert left.stdout.split("\n")[0] == "inactive", left.stdout
    assert left.stdout.count("No such file or directory") == 2, left.stdout
    assert "kimi-k2.6.env" in left.stdout  # shared by the machine's other stacks: stays
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)


def test_a_stack_moves_off_a_machine_that_does_not_answer_saying_what_it_leaves_there(two_machines):
    """The machine a stack moves off is often a dead one. Its refresh read cannot reach it; the
    run carries on only because the stack no longer names it (pointed back at the first machine
    here): the unit starts and is checked there, and the run says what could not be stopped on
    the dead one. A machine the stack still names stops the run as before."""
    d, (a, b) = two_machines, two_machines.machines
    stack = d.stack("tp8")
    rehearsal.stop(b.name)  # B serves since the test above; now it is gone
    try:
        # Still named: the run stops at the read, naming the machine, before any change.
        text = failing(stack.preview, refresh=True)
        assert f"cannot reach root@{b.address}:22" in text, "(output above)"

        d.point_at(a)
        lines: list[str] = []
        result = stack.up(on_output=lines.append)
        output = "\n".join(lines)
        print(output)
        assert f"(root@{b.address}:22) does not answer" in output and f"it now names {a.address}" in output
        assert f"warning: {UNIT} is left on {b.address}, which does not answer" in output
        assert result.outputs["readiness"].value["status_when_checked"] == "ready"
        on_a = H.nsenter(a, "sh", "-c", f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}").stdout.split()
        assert on_a == ["active", "enabled"], on_a
        stack.preview(refresh=True, expect_no_changes=True, on_output=print)
    finally:
        rehearsal.restart(b.name)
