"""A fleet in one stack (gpu-serving:hosts): one engine run deploys, switches, checks and repairs
every host, in parallel, with one SSH connection per host per program run. Two real rehearsal
hosts, the real Pulumi engine."""
from __future__ import annotations

import pytest
from pulumi import automation as auto

from bench.hosts import Counter, Host
from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, rehearsal_host_factory):
    a, b = rehearsal_host_factory(), rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("fleet"), a)

    def two_hosts(config):
        # `host` stays the fleet's common hardware; the entries name the machines.
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu1", "rehearsal": a.name},
                                                 {"name": "gpu2", "rehearsal": b.name}]}
    d.edit_project(two_hosts)
    d.hosts = {"gpu1": a, "gpu2": b}
    return d


def active(host, strategy: str) -> str:
    return host.run(f"systemctl is-active {UNIT.format(strategy)}").stdout.strip()


def test_up_deploys_every_host_in_one_run_and_reports_each(fleet):
    counter = Counter([Host(h) for h in fleet.hosts.values()])
    counter.start()
    result = fleet.stack("tp8").up(on_output=print)
    conns, _ = counter.stop()
    readiness = result.outputs["readiness"].value
    assert set(readiness) == {"gpu1", "gpu2"}
    for name, host in fleet.hosts.items():
        assert readiness[name]["status_when_checked"] == "ready", readiness[name]
        assert readiness[name]["layout"]["tp_size"] == 8
        assert active(host, "tp8") == "active"
        assert result.outputs["endpoint"].value[name] == f"http://{host.address}:30001"
        assert result.outputs["host"].value[name]["gpu_count"] == 8
    # Automation API's up is one program run: one connection per host, reused by every resource.
    assert conns == 2, conns


ALL_AT_ONCE = "no router (gpu-serving:router): the hosts whose strategy changes"


def test_the_all_at_once_line_comes_only_with_a_planned_switch(fleet):
    # tp8 serves everywhere: its preview changes nothing, and says nothing of a switch.
    noop: list[str] = []
    fleet.stack("tp8").preview(on_output=noop.append)
    assert ALL_AT_ONCE not in "\n".join(noop), "\n".join(noop)[-3000:]
    # The preview of ep8 would restart every host's unit: it says so.
    switch: list[str] = []
    fleet.stack("ep8").preview(on_output=switch.append)
    text = "\n".join(switch)
    assert f"{ALL_AT_ONCE}, of gpu1, gpu2, stop at once and switch to ep8 together" in text, text[-4000:]


def test_switch_moves_every_host(fleet):
    lines: list[str] = []
    result = fleet.stack("ep8").up(on_output=lines.append)
    text = "\n".join(lines)
    # Without a router the run says plainly that nothing serves during the switch (issue 16.4).
    assert f"{ALL_AT_ONCE}, of gpu1, gpu2, stop at once and switch to ep8 together" in text, text[-4000:]
    # Every progress line and switch block names its fleet entry (issue 12.9).
    for name in fleet.hosts:
        assert f"hosts[{name}] switch: {UNIT.format('tp8')} (stack tp8) serves now" in text, text[-4000:]
        assert f"hosts[{name}]: {UNIT.format('ep8')}: starting (stops {UNIT.format('tp8')})" in text, text[-4000:]
    for name, host in fleet.hosts.items():
        assert result.outputs["readiness"].value[name]["layout"]["ep_size"] == 8
        assert active(host, "ep8") == "active" and active(host, "tp8") == "inactive"


def test_hand_edit_on_one_host_is_drift_named_by_host_and_repaired_there_only(fleet):
    gpu1, gpu2 = fleet.hosts["gpu1"], fleet.hosts["gpu2"]
    path = "/etc/systemd/system/" + UNIT.format("ep8")
    gpu2.run(f"sed -i 's/--ep-size 8/--ep-size 4/' {path}", check=True)
    mtime_gpu1 = gpu1.run(f"stat -c %Y {path}").stdout
    stack = fleet.stack("ep8")
    lines: list[str] = []
    with pytest.raises(auto.CommandError):
        stack.preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines)
    assert "gpu2-unit-file" in text and "gpu1-unit-file" not in text, text[-3000:]
    stack.up(refresh=True, on_output=print)
    assert "--ep-size 8" in gpu2.run(f"cat {path}").stdout
    assert gpu1.run(f"stat -c %Y {path}").stdout == mtime_gpu1  # the other host was not touched
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)


def test_a_host_removed_from_the_fleet_is_stopped_there_and_can_be_listed_again(fleet):
    """gpu2's entry removed from gpu-serving:hosts: the preview says its unit stops there (the
    delete hook is registered under one name whatever the fleet: a per-entry name, which the
    program no longer registers once the entry is gone, failed the run); `up` stops and removes it
    on gpu2 only; the next drift check is clean; listing gpu2 again deploys it there again."""
    gpu1, gpu2 = fleet.hosts["gpu1"], fleet.hosts["gpu2"]
    path = "/etc/systemd/system/" + UNIT.format("ep8")
    mtime_gpu1 = gpu1.run(f"stat -c %Y {path}").stdout

    def fleet_of(names):
        def edit(config):
            config["gpu-serving:hosts"] = {"value": [{"name": n, "rehearsal": fleet.hosts[n].name} for n in names]}
        fleet.edit_project(edit)

    stack = fleet.stack("ep8")
    fleet_of(["gpu1"])
    try:
        lines: list[str] = []
        stack.preview(on_output=lines.append)
        text = "\n".join(lines)
        assert (f"hosts[gpu2] ({gpu2.address}) is no longer in gpu-serving:hosts: stack ep8's {UNIT.format('ep8')}, which "
                "serves there now") in text, text[-4000:]
        result = stack.up(on_output=print)
        assert set(result.outputs["readiness"].value) == {"gpu1"}
        assert active(gpu2, "ep8") == "inactive" and gpu2.run(f"test -e {path}").returncode != 0
        assert active(gpu1, "ep8") == "active" and gpu1.run(f"stat -c %Y {path}").stdout == mtime_gpu1
        stack.preview(refresh=True, expect_no_changes=True, on_output=print)
    finally:
        fleet_of(["gpu1", "gpu2"])
    result = stack.up(on_output=print)
    assert result.outputs["readiness"].value["gpu2"]["status_when_checked"] == "ready"
    assert active(gpu2, "ep8") == "active"


def test_a_fleet_entry_renamed_keeps_its_machine_serving(fleet):
    """gpu2 renamed b2 (the same machine), then back: Pulumi creates the new names and deletes the
    old ones; the old deletes must leave the unit the new names took over serving, untouched (they
    stopped it and removed its file), and the drift check after each is clean."""
    gpu2 = fleet.hosts["gpu2"]
    path = "/etc/systemd/system/" + UNIT.format("ep8")
    pid = f"systemctl show -p MainPID --value {UNIT.format('ep8')}"
    before = gpu2.run(pid).stdout.strip()
    stack = fleet.stack("ep8")

    def named(second):
        def edit(config):
            config["gpu-serving:hosts"] = {"value": [{"name": "gpu1", "rehearsal": fleet.hosts["gpu1"].name},
                                                     {"name": second, "rehearsal": gpu2.name}]}
        fleet.edit_project(edit)

    named("b2")
    try:
        lines: list[str] = []
        result = stack.up(on_output=lines.append)
        assert result.outputs["readiness"].value["b2"]["status_when_checked"] == "ready"
        assert "is declared under another name on the same machine now" in "\n".join(lines), "\n".join(lines)[-4000:]
        assert active(gpu2, "ep8") == "active" and gpu2.run(f"test -e {path}").returncode == 0
        assert gpu2.run(pid).stdout.strip() == before
        stack.preview(refresh=True, expect_no_changes=True, on_output=print)
    finally:
        named("gpu2")
    result = stack.up(on_output=print)
    assert result.outputs["readiness"].value["gpu2"]["status_when_checked"] == "ready"
    assert active(gpu2, "ep8") == "active" and gpu2.run(f"test -e {path}").returncode == 0
    assert gpu2.run(pid).stdout.strip() == before
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)


def test_destroy_removes_the_strategy_from_every_host(fleet):
    fleet.stack("ep8").destroy(on_output=print)
    for host in fleet.hosts.values():
        assert host.run("test -e /etc/systemd/system/" + UNIT.format("ep8") + " && echo yes || echo no").stdout.strip() == "no"
    fleet.stack("tp8").destroy(on_output=print)


def test_a_one_host_stack_turned_into_a_fleet_of_its_machine_keeps_serving(fleet):
    """gpu-serving:host alone, deployed; then gpu-serving:hosts listing that machine: the fleet's
    names take the running unit over (not restarted) and the one-host names' deletes leave it;
    then back to gpu-serving:host alone, the same way round."""
    gpu1 = fleet.hosts["gpu1"]
    pid = f"systemctl show -p MainPID --value {UNIT.format('tp8')}"

    def one_host(config):
        config.pop("gpu-serving:hosts", None)
        config["gpu-serving:host"] = {"value": {**config["gpu-serving:host"]["value"], "rehearsal": gpu1.name}}
    fleet.edit_project(one_host)
    stack = fleet.stack("tp8")
    assert stack.up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    before = gpu1.run(pid).stdout.strip()

    def a_fleet(config):
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu1", "rehearsal": gpu1.name}]}
    fleet.edit_project(a_fleet)
    lines: list[str] = []
    result = stack.up(on_output=lines.append)
    assert result.outputs["readiness"].value["gpu1"]["status_when_checked"] == "ready"
    assert "already runs as declared: taken over, not restarted" in "\n".join(lines), "\n".join(lines)[-4000:]
    assert active(gpu1, "tp8") == "active" and gpu1.run(pid).stdout.strip() == before
    assert gpu1.run("test -e /etc/systemd/system/" + UNIT.format("tp8")).returncode == 0
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)

    # and back: the fleet of one turned into the one-host form again, still the same process
    fleet.edit_project(one_host)
    lines.clear()
    result = stack.up(on_output=lines.append)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready", "\n".join(lines)[-4000:]
    assert active(gpu1, "tp8") == "active" and gpu1.run(pid).stdout.strip() == before, "\n".join(lines)[-4000:]
    assert gpu1.run("test -e /etc/systemd/system/" + UNIT.format("tp8")).returncode == 0
    stack.preview(refresh=True, expect_no_changes=True, on_output=print)
    stack.destroy(on_output=print)
    assert active(gpu1, "tp8") != "active"
