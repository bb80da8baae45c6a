"""Issue 8, point 4, for real: faults on the way to the host, injected against a rehearsal host.

- a command that outlives its timeout, a connection that freezes: bounded, the next command
  gets a fresh connection;
- the connection killed in the middle of a file write: the file keeps its old bytes (temp file +
  rename), the half-written temp file is removed by the next write;
- the connection killed while `up` waits for readiness: the `up` fails at once and clearly (the
  host lock lived on that connection, so the switch does not carry on without it), no temp
  file is left, the lock is free, a rerun converges and refresh is clean;
- the host rebooted: the strategy that served comes back (and only it), refresh is clean;
- sshd stopped, sshd hung, nothing listening on the SSH port: a clear "cannot reach" within a
  bound set by host.connectTimeoutSeconds (5 s here): attempts stop starting after
  2 x connectTimeout, and the other resources of the same run fail at once on that result.

The steps run in order on one host, like test_deploy_switch_drift.
"""
from __future__ import annotations

import copy
import hashlib
import os
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml
from pulumi import automation as auto

from components.remote import ssh
from rehearsal import host as rehearsal
from tests import hardening_support as H

from .conftest import FAST_ENV, FAST_READINESS, make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

CONNECT_TIMEOUT = 5
# Room over a command's own timeout for a loaded 2-core machine (the channel closed, the thread
# woken, the engine's host and this test's sharing the CPUs). The promise these bounds check is
# that a command ends at its deadline instead of never: a chatty command (a deadline counted
# between reads) or a frozen connection (one that waits on its peer) would never end by itself,
# so any finite bound tells the two apart; 20 s of room keeps the bound far from the machine's
# load and far below "never".
DEADLINE_ROOM = 20
TP8, SLOW = "sglang-kimi-k2.6-tp8.service", "sglang-kimi-k2.6-slow.service"
LOCK = "/run/lock/gpu-serving.lock"
# What a temp file of ssh.write_file looks like, anywhere our files go.
TEMP_FILES = ("find /etc /root /var/lib/gpu-serving -name '.*.gpu-serving-*' 2>/dev/null; true")


@pytest.fixture(scope="module")
def serving(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("hardening-faults"), host)
    d.edit_project(lambda c: c["gpu-serving:host"]["value"].update(connectTimeoutSeconds=CONNECT_TIMEOUT))
    result = d.stack("tp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    return d


def target(d, command_timeout: float = 60) -> ssh.Target:
    h = d.host
    return ssh.Target(h.address, h.port, h.user, Path(h.private_key).read_text(), h.host_public_key,
                      CONNECT_TIMEOUT, command_timeout)


def failing(op, **kwargs) -> tuple[str, float]:
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(auto.CommandError) as info:
        op(on_output=lines.append, **kwargs)
    return "\n".join(lines) + "\n" + str(info.value), time.monotonic() - start


def refresh_is_clean(d, stack: str) -> None:
    d.stack(stack).preview(refresh=True, expect_no_changes=True, diff=True)


def active(d, *units) -> list[str]:
    return d.sh("systemctl is-active " + " ".join(units) + "; true").split()


# ---------------------------------------------------------------------------------------------
# The SSH layer: deadlines

def test_command_that_outlives_its_timeout_is_cut_at_the_deadline(serving):
    """A command that keeps printing (so no single read ever waits long) is still stopped at its
    timeout: the deadline is for the whole run."""
    t = target(serving)
    H.fault_injected("a command outliving its timeout")
    start = time.monotonic()
    with pytest.raises(ssh.RemoteError) as info:
        ssh.run(t, ["sh", "-c", "while :; do echo still here; sleep 0.2; done"], purpose="a chatty command", timeout=3)
    assert "did not finish within 3 s" in str(info.value)
    assert time.monotonic() - start < 3 + DEADLINE_ROOM  # cut at its deadline: the command itself never ends
    assert ssh.run(t, ["echo", "ok"], purpose="the next command", timeout=10).stdout == "ok\n"
    H.fault_survived("a command outliving its timeout")


def test_frozen_connection_is_bounded_and_replaced(serving):
    """The sshd processes of our connection are stopped (SIGSTOP) while a command runs: that
    command fails at its deadline; the next one does not wait on the frozen connection for
    ever, it opens a new one."""
    d = serving
    t = target(d, command_timeout=10)
    H.fault_injected("a frozen SSH connection")
    ssh.run(t, ["true"], purpose="opening the connection", timeout=10)
    errors: list[Exception] = []

    def long_command():
        try:
            ssh.run(t, ["sh", "-c", "sleep 2; echo done"], purpose="a command on a frozen connection", timeout=4)
        except Exception as exc:  # noqa: BLE001 - kept for the assertion below
            errors.append(exc)
    thread = threading.Thread(target=long_command)
    start = time.monotonic()
    thread.start()
    frozen = H.wait_for(lambda: H.kill_connection_holding(d.host, "^sh -c sleep 2; echo done", "STOP"), 5,
                        what="the command's sshd session")
    try:
        # Failed at its 4 s deadline (the frozen peer never answers, so without one it would wait for ever).
        thread.join(4 + DEADLINE_ROOM)
        assert not thread.is_alive() and time.monotonic() - start < 4 + DEADLINE_ROOM
        assert errors and "did not finish within 4 s" in str(errors[0]), errors
        opened = ssh.opened_connections
        start = time.monotonic()
        assert ssh.run(t, ["echo", "fresh"], purpose="the next command", timeout=4).stdout == "fresh\n"
        # A new connection within the next command's own 4 s (not a wait on the frozen one, which never answers).
        assert time.monotonic() - start < 4 + DEADLINE_ROOM and ssh.opened_connections == opened + 1
        assert ssh.read_file(t, "/etc/hostname").decode().strip() == d.host.name
    finally:
        d.host.run("kill -CONT {0}; kill -KILL {0}".format(" ".join(frozen)), timeout=30)
    H.fault_survived("a frozen SSH connection")


def test_connection_killed_in_the_middle_of_a_write_leaves_the_old_file(serving, monkeypatch):
    d = serving
    t = target(d, command_timeout=30)
    path = "/etc/gpu-serving-test/payload.bin"
    old, new = b"old content\n" * 1000, os.urandom(8 << 20)
    ssh.write_file(t, path, old, 0o644)
    paused, release = threading.Event(), threading.Event()
    real_write = paramiko.SFTPFile.write

    def write_half_then_wait(self, data):
        real_write(self, data[: len(data) // 2])
        self.flush()
        paused.set()
        release.wait(30)
        real_write(self, data[len(data) // 2:])
    monkeypatch.setattr(paramiko.SFTPFile, "write", write_half_then_wait)
    errors: list[Exception] = []

    def write():
        try:
            ssh.write_file(t, path, new, 0o644)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    thread = threading.Thread(target=write)
    thread.start()
    H.fault_injected("the connection killed in the middle of a file write")
    assert paused.wait(30)
    assert H.kill_connection_holding(d.host, "^/usr/lib/openssh/sftp-server")
    release.set()
    thread.join(60)
    monkeypatch.undo()
    assert errors, "the write cannot have succeeded"
    # The file is the old one, byte for byte; what was half written is only a temp file.
    assert d.sh(f"sha256sum {path}").split()[0] == hashlib.sha256(old).hexdigest()
    leftovers = d.sh("find /etc/gpu-serving-test -name '.payload.bin.gpu-serving-*' -printf '%p %s\\n'").split()
    assert len(leftovers) == 2 and 0 < int(leftovers[1]) < len(new), leftovers
    # The next write of that file removes a leftover once it is stale (no write in progress:
    # older than a minute; aged here rather than waited for).
    d.sh(f"touch -d '-5 min' {leftovers[0]}")
    ssh.write_file(t, path, new, 0o644)
    assert d.sh(f"sha256sum {path}").split()[0] == hashlib.sha256(new).hexdigest()
    assert d.sh("find /etc/gpu-serving-test -name '.payload.bin.gpu-serving-*'").strip() == ""
    d.sh("rm -rf /etc/gpu-serving-test")
    H.fault_survived("the connection killed in the middle of a file write")


# ---------------------------------------------------------------------------------------------
# Through the engine

def slow_stack(d) -> auto.Stack:
    """ep8's layout with an engine that loads for 6 s (own environment file), so a switch spends
    a while in the readiness wait."""
    project = yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]
    serving = copy.deepcopy(project["gpu-serving:serving"]["value"])
    serving["environment"] = {**serving["environment"], **FAST_ENV, "REHEARSAL_LOAD_SECONDS": "6"}
    serving["environmentDir"] = "/etc/gpu-serving/slow"
    d.write_stack_file("slow", {"tpSize": 8, "epSize": 8}, {"gpu-serving:serving": serving,
                                                              "gpu-serving:readiness": FAST_READINESS})
    return d.stack("slow")


def test_connection_dropped_during_the_readiness_wait(serving):
    d = serving
    stack = slow_stack(d)
    # Set when the switch reaches the readiness wait, or when `up` ended before it (then the
    # failure below shows why, instead of a 90 s wait that hides the real error).
    loading_or_finished = threading.Event()
    outcome: dict = {}

    def watch(line: str):
        if f"{SLOW}: loading" in line:
            outcome.setdefault("loading", True)
            loading_or_finished.set()

    def up():
        try:
            stack.up(on_output=watch)
            outcome["result"] = "succeeded"
        except Exception as exc:  # noqa: BLE001 - reported in the assertion below, whatever it is
            outcome["error"] = str(exc)
        finally:
            outcome["at"] = time.monotonic()
            loading_or_finished.set()
    thread = threading.Thread(target=up)
    thread.start()
    assert loading_or_finished.wait(90) and outcome.get("loading") and "at" not in outcome, \
        f"the switch never reached the readiness wait; the up's outcome: {str(outcome)[-3000:] or 'still running after 90 s'}"
    H.fault_injected("the SSH connection killed during a switch")
    killed_at = time.monotonic()
    assert H.kill_connection_holding(d.host, f"^flock -w [0-9]+ {LOCK}")
    thread.join(120)
    assert "error" in outcome, outcome
    assert f"was lost during the switch to {SLOW}" in outcome["error"], outcome["error"][-3000:]
    print(f"dropped connection: up failed {outcome['at'] - killed_at:.1f} s after the kill: "
          + outcome["error"][outcome["error"].find("was lost"):][:300])
    assert outcome["at"] - killed_at < 20
    # Nothing half-written, nothing left locked.
    assert d.sh(TEMP_FILES).strip() == ""
    assert d.host.run(f"flock -n {LOCK} true").returncode == 0
    # A rerun converges.
    result = stack.up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert active(d, SLOW, TP8) == ["active", "inactive"]
    refresh_is_clean(d, "slow")
    H.fault_survived("the SSH connection killed during a switch")


def test_reboot_brings_back_the_strategy_that_served(serving):
    d = serving
    assert d.sh(f"systemctl is-enabled {SLOW} {TP8}; true").split() == ["enabled", "disabled"]
    H.fault_injected("a host reboot")
    rehearsal.restart(d.host.name)
    # The unit starts at boot and loads (6 s here, many minutes for a real checkpoint): until it
    # serves, a refresh rightly reports it as not ready. Wait for it to serve, as an operator would.
    H.wait_for(lambda: d.host.run("curl -sf -o /dev/null --max-time 5 http://127.0.0.1:30001/health_generate").returncode == 0,
               90, interval=1, what="the strategy to serve again after the reboot")
    assert active(d, SLOW, TP8) == ["active", "inactive"]
    refresh_is_clean(d, "slow")
    H.fault_survived("a host reboot")


def test_sshd_stopped_is_a_fast_clear_error(serving):
    d = serving
    H.fault_injected("sshd stopped")
    out = H.nsenter(d.host, "systemctl", "stop", "ssh.service")
    assert out.returncode == 0, out.stderr
    try:
        text, seconds = failing(d.stack("slow").up)
    finally:
        assert H.nsenter(d.host, "systemctl", "start", "ssh.service").returncode == 0
    print(f"sshd stopped: up failed after {seconds:.1f} s: " + text[text.find("cannot reach"):][:300])
    assert "cannot reach root@" in text and "is the host up and sshd listening?" in text, text[-3000:]
    # Connection refused: three attempts 1 s and 3 s apart; the other resources fail at once.
    assert seconds < 30, seconds
    assert active(d, SLOW) == ["active"]
    refresh_is_clean(d, "slow")
    H.fault_survived("sshd stopped")


def test_sshd_hung_is_a_clear_error_within_the_connect_bound(serving):
    """sshd accepts TCP connections (the kernel does) but never answers (SIGSTOP): each attempt
    waits connectTimeout for the banner, and no attempt starts after 2 x connectTimeout."""
    d = serving
    listener = H.sshd_listener(d.host)
    assert listener
    H.fault_injected("sshd hung")
    H.signal_pids(listener, H.SIGSTOP)
    try:
        text, seconds = failing(d.stack("slow").up)
    finally:
        H.signal_pids(listener, H.SIGCONT)
    print(f"sshd hung: up failed after {seconds:.1f} s: " + text[text.find("cannot reach"):][:300])
    assert "cannot reach root@" in text, text[-3000:]
    assert seconds < 2 * CONNECT_TIMEOUT + 3 + 15, seconds  # + the engine's own start and stop
    assert active(d, SLOW) == ["active"]
    refresh_is_clean(d, "slow")
    H.fault_survived("sshd hung")


def test_nothing_listening_on_the_ssh_port(serving):
    d = serving
    h = d.host
    host = yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]["gpu-serving:host"]["value"]
    elsewhere = {k: v for k, v in host.items() if k != "rehearsal"}
    elsewhere.update(address=h.address, port=2222, hostKey=h.host_public_key, privateKeyPath=h.private_key)
    d.write_stack_file("elsewhere", {"tpSize": 8}, {"gpu-serving:host": elsewhere})
    H.fault_injected("nothing listening on the SSH port")
    try:
        text, seconds = failing(d.stack("elsewhere").up)
    finally:
        (d.project / "Pulumi.elsewhere.yaml").unlink()
    print(f"closed port: up failed after {seconds:.1f} s")
    assert f"cannot reach root@{h.address}:2222" in text, text[-3000:]
    assert seconds < 30, seconds
    H.fault_survived("nothing listening on the SSH port")
