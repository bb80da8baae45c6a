"""The rehearsal host, for real: systemd-nspawn boots Debian bookworm with systemd as PID 1 and
OpenSSH in its own network namespace. Nothing is mocked; every check goes over ssh or looks at
the machine (/proc, ip, mounts)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rehearsal import host, machine

pytestmark = pytest.mark.rehearsal

REPO = Path(__file__).resolve().parents[2]


def ok(info: host.HostInfo, cmd: str, timeout: float = 60) -> str:
    proc = info.run(cmd, timeout=timeout)
    assert proc.returncode == 0, f"{cmd!r} on {info.name}: rc={proc.returncode}\n" \
                                 f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def proc_mounts() -> str:
    return Path("/proc/mounts").read_text()


def links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                          check=True).stdout


# ---------------------------------------------------------------------------------------------
# The booted host


def test_pid1_is_systemd_and_system_running(rehearsal_host):
    assert ok(rehearsal_host, "cat /proc/1/comm").strip() == "systemd"
    assert ok(rehearsal_host, "ps -p 1 -o comm=").strip() == "systemd"
    state = rehearsal_host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), state
    assert ok(rehearsal_host, ". /etc/os-release; echo $VERSION_CODENAME").strip() == "bookworm"
    assert ok(rehearsal_host, "hostname").strip() == rehearsal_host.name


def test_host_json_and_status(rehearsal_host):
    data = json.loads((Path(rehearsal_host.state_dir) / "host.json").read_text())
    for key in ("name", "address", "port", "user", "private_key", "host_public_key",
                "known_hosts", "profile", "model_path", "pid"):
        assert data[key] not in (None, ""), key
    assert data["port"] == 22 and data["user"] == "root"
    assert data["model_path"] == "/models/kimi-k2.6"
    assert data["host_public_key"].startswith("ssh-ed25519 AAAA")
    st = host.status(rehearsal_host.name)
    assert st.state == "running" and st.pid == data["pid"] and st.address == data["address"]
    cli = subprocess.run(["python3", "-m", "rehearsal", "status", rehearsal_host.name, "--json"],
                         cwd=REPO, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["address"] == data["address"]


def test_ssh_root_by_key_only_with_pinned_host_key(rehearsal_host):
    info = rehearsal_host
    # The host key the host presents is the one host.json pins.
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-T", "5", info.address],
                          capture_output=True, text=True)
    presented = [line.split(None, 1)[1] for line in scan.stdout.splitlines()
                 if line and not line.startswith("#")]
    assert presented == [info.host_public_key]
    assert ok(info, "id -un").strip() == "root"
    # Password and keyboard-interactive logins are refused.
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no",
         "-o", "PreferredAuthentications=password,keyboard-interactive",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={info.known_hosts}",
         f"root@{info.address}", "true"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Permission denied (publickey)" in proc.stderr
    cfg = ok(info, "sshd -T")
    assert "passwordauthentication no" in cfg
    assert "permitrootlogin without-password" in cfg  # = prohibit-password
    # Connecting against a different pinned key fails (StrictHostKeyChecking).
    wrong = Path(info.state_dir) / "wrong_known_hosts"
    wrong.write_text(f"{info.address} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n")
    try:
        args = [a if not a.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={wrong}"
                for a in info.ssh_args()]
        proc = subprocess.run(args + ["true"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 255
    finally:
        wrong.unlink()


def test_unit_starts_and_journal_keeps_its_output(rehearsal_host):
    marker = f"rehearsal-unit-{os.getpid()}"
    unit = (f"[Unit]\nDescription=pytest demo\n[Service]\n"
            f"ExecStart=/bin/sh -c 'echo {marker}; exec sleep infinity'\n")
    rehearsal_host.run("cat > /etc/systemd/system/pt-demo.service", input=unit, check=True)
    try:
        ok(rehearsal_host, "systemctl daemon-reload && systemctl start pt-demo.service")
        assert ok(rehearsal_host, "systemctl is-active pt-demo.service").strip() == "active"
        deadline = time.monotonic() + 10
        while marker not in (log := rehearsal_host.run(
                "journalctl -u pt-demo.service --no-pager -o cat").stdout):
            assert time.monotonic() < deadline, log
            time.sleep(0.2)
        props = ok(rehearsal_host, "systemctl show pt-demo.service -p MainPID -p ActiveState")
        assert "ActiveState=active" in props and "MainPID=0" not in props
    finally:
        rehearsal_host.run("systemctl stop pt-demo.service; rm -f "
                           "/etc/systemd/system/pt-demo.service; systemctl daemon-reload")


def test_nvidia_smi_answers_from_the_profile(rehearsal_host):
    profile = json.loads((REPO / "rehearsal/gpu/profiles/rtx-pro-6000-8.json").read_text())
    out = ok(rehearsal_host, "nvidia-smi --query-gpu=index,name,memory.total "
                             "--format=csv,noheader,nounits")
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    assert len(rows) == len(profile["gpus"]) == 8
    for i, (index, name, mem) in enumerate(rows):
        gpu = {**profile["gpu_defaults"], **profile["gpus"][i]}
        assert int(index) == gpu["index"] == i
        assert name == gpu["name"]
        assert int(mem) == gpu["memory_total_mib"]
    # The profile is the one named in host.json, at the documented path.
    assert json.loads(ok(rehearsal_host, "cat /etc/rehearsal/gpu-profile.json")) == profile
    assert ok(rehearsal_host, "command -v nvidia-smi").strip() == "/usr/bin/nvidia-smi"
    # -q -x reads its <gpu> template from a data file next to the script: the mount carries it,
    # so the host answers what the stand-in answers here (but for the clock line).
    local = subprocess.run(
        [sys.executable, str(REPO / "rehearsal/gpu/nvidia_smi.py"), "-q", "-x"], capture_output=True,
        text=True, check=True, timeout=30,
        env={**os.environ, "REHEARSAL_GPU_PROFILE": str(REPO / "rehearsal/gpu/profiles/rtx-pro-6000-8.json"),
             "REHEARSAL_GPU_STATE_DIR": "/nonexistent-rehearsal-state"}).stdout

    def clockless(xml: str) -> list[str]:
        return [line for line in xml.splitlines() if "<timestamp>" not in line]
    remote_xml = ok(rehearsal_host, "nvidia-smi -q -x")
    assert "<product_name>NVIDIA RTX PRO 6000" in remote_xml
    assert clockless(remote_xml) == clockless(local)


def test_model_stand_in_is_mounted_read_only(rehearsal_host):
    local = json.loads((REPO / "rehearsal/models/kimi-k2.6/config.json").read_text())
    remote = json.loads(ok(rehearsal_host, "cat /models/kimi-k2.6/config.json"))
    assert remote == local
    proc = rehearsal_host.run("touch /models/kimi-k2.6/written-by-test")
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr


def test_the_model_directory_is_a_checkpoint_the_host_scripts_read_with_its_own_python3(rehearsal_host):
    """/models/<model> holds the stand-in checkpoint (rehearsal/checkpoint.py), and the weights
    scripts (components/core/weights_host.py) run on the host's own python3 (Debian's), as the
    provider will run them: the cheap read finds it complete, the verifier's sums are this
    machine's sums of the same files."""
    import hashlib
    import shlex

    from components.core import weights as W
    from components.core import weights_host as WH
    from rehearsal.checkpoint import standin

    def remote(request: dict) -> subprocess.CompletedProcess:
        return rehearsal_host.run(shlex.join(request["argv"]), timeout=request["timeout"])

    read = remote(WH.read_checkpoint("/models/kimi-k2.6"))
    assert read.returncode == 0, read.stderr
    r = W.parse_read(read.stdout)
    assert r.index_shards and W.check_copy(r) == []
    local = standin("kimi-k2.6")
    assert set(r.files) == {p.name for p in local.iterdir()}
    proc = remote(WH.verify_checkpoint("/models/kimi-k2.6", sorted(r.files), every=0))
    assert proc.returncode == 0, proc.stderr
    sums = {a["path"]: a["sha256"] for a in map(json.loads, proc.stdout.splitlines()) if "sha256" in a}
    assert sums == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in local.iterdir()}
    assert WH.parse_progress(proc.stderr.splitlines()[-1])["files"] == len(sums)


def test_up_is_idempotent(rehearsal_host):
    # The same machine, not booted again: the same nspawn process and address (how long `up`
    # takes to say so is no promise).
    again = host.up(rehearsal_host.name)
    assert again.pid == rehearsal_host.pid and again.address == rehearsal_host.address


def test_rejects_bad_names_and_conflicting_settings(rehearsal_host):
    with pytest.raises(host.RehearsalError, match="invalid rehearsal host name"):
        host.up("this-name-is-too-long")
    with pytest.raises(host.RehearsalError, match="exists with profile"):
        host.up(rehearsal_host.name, profile="h200-8")


# ---------------------------------------------------------------------------------------------
# Lifecycle: restart, several at once, down, crash recovery


def test_restart_keeps_etc_like_a_reboot(rehearsal_host_factory):
    info = rehearsal_host_factory()
    ok(info, "echo kept-across-reboot > /etc/pt-reboot-marker")
    unit = "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n"
    info.run("cat > /etc/systemd/system/pt-enabled.service", input=unit, check=True)
    ok(info, "systemctl daemon-reload && systemctl enable --now pt-enabled.service")
    boot_id = ok(info, "cat /proc/sys/kernel/random/boot_id").strip()
    machine_id = ok(info, "cat /etc/machine-id").strip()

    after = host.restart(info.name)

    assert after.pid != info.pid
    assert after.address == info.address and after.host_public_key == info.host_public_key
    assert ok(after, "cat /etc/pt-reboot-marker").strip() == "kept-across-reboot"
    assert ok(after, "systemctl is-active pt-enabled.service").strip() == "active"
    assert ok(after, "cat /proc/sys/kernel/random/boot_id").strip() != boot_id
    assert ok(after, "cat /etc/machine-id").strip() == machine_id
    # The journal is persistent: the previous boot is still listed.
    boots = ok(after, "journalctl --list-boots --no-pager | tail -n +2").strip().splitlines()
    assert len(boots) >= 2


def test_two_hosts_at_once(rehearsal_host, rehearsal_host_factory):
    other = rehearsal_host_factory(profile="h200-8", model="deepseek-v3")
    assert other.address != rehearsal_host.address and other.index != rehearsal_host.index
    assert ok(other, "hostname").strip() == other.name
    assert ok(rehearsal_host, "hostname").strip() == rehearsal_host.name
    assert ok(other, "nvidia-smi --query-gpu=name --format=csv,noheader").splitlines()[0] \
        .startswith("NVIDIA H200")
    assert ok(other, "ls /models").split() == ["deepseek-v3"]
    # Hosts reach each other through this machine, as one cluster's machines do (a router's
    # fleet, a multi-node layout's ranks): network.link_to_range.
    proc = other.run(f"timeout 3 bash -c '</dev/tcp/{rehearsal_host.address}/22'")
    assert proc.returncode == 0, proc


def test_down_leaves_nothing_behind(rehearsal_host_factory, capfd):
    info = rehearsal_host_factory()
    assert info.pidns and info.leader_pid
    idir = info.instance_dir
    assert f"/run/netns/{info.netns}" in proc_mounts() and f"{info.veth}@" in links()

    capfd.readouterr()
    host.down(info.name)
    said = capfd.readouterr().err

    assert not Path("/run/netns", info.netns).exists()
    assert f"{info.veth}@" not in links()
    mounts = proc_mounts()
    assert idir not in mounts and f"/run/netns/{info.netns}" not in mounts
    assert not Path(f"/proc/{info.pid}").exists() or machine._proc_state(info.pid) in ("Z", "X")
    assert machine.pids_in_pidns(info.pidns) == []
    assert not Path(idir).exists() and not Path(info.state_dir).exists()
    assert host.status(info.name).state == "absent"
    # A clean poweroff (systemd in the container stopped everything), not the SIGKILL that down
    # falls back to after its own 30 s bound: said by down itself, not by a stopwatch.
    assert "no clean poweroff" not in said, said


def test_up_cleans_up_after_a_crash(rehearsal_host_factory):
    info = rehearsal_host_factory()
    ok(info, "echo survived > /etc/pt-crash-marker")
    os.kill(info.pid, signal.SIGKILL)  # systemd-nspawn dies; the container would live on
    deadline = time.monotonic() + 10
    while host.status(info.name).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)

    again = host.up(info.name)

    assert again.pid != info.pid
    assert machine.pids_in_pidns(info.pidns) == []  # the orphaned container was killed
    assert ok(again, "cat /etc/pt-crash-marker").strip() == "survived"
    assert mounts_count(again.instance_dir) == 1
    host.down(info.name)
    assert machine.pids_in_pidns(again.pidns) == []
    assert not Path("/run/netns", info.netns).exists()


def mounts_count(path: str) -> int:
    return sum(1 for line in proc_mounts().splitlines() if path in line.split()[1])


def test_cli_up_status_ssh_down():
    name = f"pt{os.getpid()}-z"
    def run(*a):
        return subprocess.run(["python3", "-m", "rehearsal", *a], cwd=REPO, capture_output=True, text=True, timeout=300)
    try:
        up = run("up", name, "--json")
        assert up.returncode == 0, up.stderr
        data = json.loads(up.stdout)
        assert data["state"] == "running" and data["address"].startswith("10.213.")
        ssh = run("ssh", name, "--", "systemctl", "is-system-running")
        assert ssh.stdout.strip() in ("running", "degraded"), ssh
        assert run("status", name).returncode == 0
        assert name in run("list").stdout
    finally:
        down = run("down", name)
    assert down.returncode == 0, down.stderr
    status = run("status", name)
    assert status.returncode == 3 and "absent" in status.stdout


def test_failed_boot_is_cleaned_up(rehearsal_host_factory):
    info = rehearsal_host_factory()  # exists; now make its next boot fail (timeout)
    host.stop(info.name)
    assert host.status(info.name).state == "stopped"
    assert not Path("/run/netns", info.netns).exists() and info.instance_dir not in proc_mounts()
    with pytest.raises(host.RehearsalError, match="not ready within"):
        host.up(info.name, timeout=0.05)
    assert host.status(info.name).state == "stopped"
    assert not Path("/run/netns", info.netns).exists()
    assert f"{info.veth}@" not in links() and info.instance_dir not in proc_mounts()
    assert machine.container_pids(info.name) == []
    again = host.up(info.name)  # and the next up works
    assert ok(again, "systemctl is-system-running").strip() in ("running", "degraded")


# ---------------------------------------------------------------------------------------------
# Room for many hosts: every host's systemd draws on root's inotify budget

def test_inotify_limits_are_raised_never_lowered(tmp_path):
    from rehearsal.common import INOTIFY_FLOORS, ensure_inotify_room
    (tmp_path / "max_user_instances").write_text("128\n")
    (tmp_path / "max_user_watches").write_text("9999999\n")
    changed = ensure_inotify_room(tmp_path)
    assert changed == [f"fs.inotify.max_user_instances 128 -> {INOTIFY_FLOORS['max_user_instances']}"]
    assert int((tmp_path / "max_user_instances").read_text()) == INOTIFY_FLOORS["max_user_instances"]
    assert (tmp_path / "max_user_watches").read_text() == "9999999\n"
    assert ensure_inotify_room(tmp_path) == []


def test_booting_a_host_makes_room_for_the_next_ones(rehearsal_host_factory):
    """A fresh machine has 128 inotify instances for root and each host holds 7: the boot must
    raise it (a CI run with ~20 hosts up at once failed at boot before it did)."""
    from rehearsal.common import INOTIFY_FLOORS
    limit = Path("/proc/sys/fs/inotify/max_user_instances")
    before = limit.read_text()
    limit.write_text("128\n")  # the kernel default, as on a fresh CI machine
    try:
        rehearsal_host_factory()
        assert int(limit.read_text()) >= INOTIFY_FLOORS["max_user_instances"]
    finally:
        if int(limit.read_text()) < int(before):
            limit.write_text(before)


def test_degrading_a_running_hosts_gpus(rehearsal_host):
    """`python -m rehearsal degrade` changes what the host's nvidia-smi answers at once, as a real
    machine degrades without a restart; the facts script reads it as a real host's; --clear undoes it."""
    import shlex

    from components.core import facts as F
    from components.core import fitness as FIT
    from rehearsal import degrade

    def read_fitness():
        answer = ok(rehearsal_host, "sh -c " + shlex.quote(F.FACTS_SCRIPT) + " sh /usr/local/cuda-13.0", timeout=120)
        return F.parse_facts(answer).fitness.gpus

    def fitness_on_host() -> list[list[str]]:
        return [FIT.gpu_degradations(g) for g in read_fitness()]

    name = rehearsal_host.name
    try:
        degrade.degrade(name, ["1"], {"power_cap_w": 450})
        cli = subprocess.run([sys.executable, "-m", "rehearsal", "degrade", name, "--gpu", "3,5", "--pcie", "gen4x8"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        with pytest.raises(host.RehearsalError, match="power_cap_w 9000 is outside the GPU's range 150-600 W"):
            degrade.degrade(name, ["1"], {"power_cap_w": 9000})  # refused before the file changes
        got = fitness_on_host()
        assert got[1] == ["power capped at 450 W (default 600 W)"]
        # The RTX profile's GPUs idle at P8, where a link's generation says nothing: its width does.
        assert got[3] == got[5] == ["PCIe link x8 of x16"]
        assert [(g.pcie_gen_current, g.pcie_width_current) for g in read_fitness()][2:6] == [(5, 16), (4, 8), (5, 16), (4, 8)]
        assert [i for i, d in enumerate(got) if d] == [1, 3, 5]
        assert ok(rehearsal_host, "cat /etc/rehearsal/gpu-degrade.json").count("gen4x8") == 2
    finally:
        degrade.clear(name)
    assert all(d == [] for d in fitness_on_host())
