"""Issue 5, end to end: deploy, switch, drift, repair, destroy — the real Pulumi engine, a real
systemd + sshd host, the rehearsal engine under real units. The steps run in order and share
one host, as a user's day would."""
from __future__ import annotations


import pytest
from pulumi import automation as auto

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"


def is_active(d, stack):
    return d.sh(f"systemctl is-active {UNIT.format(stack)}").strip()


def ep8_serves(d, tp8_on_the_host: bool = False) -> None:
    """The state the drift tests start from, made by each (a no-op `up` after the module's earlier
    steps, a deploy when the test runs alone): ep8 serving and ready; with `tp8_on_the_host`, tp8's
    unit on the host too, as the module's first step leaves it."""
    if tp8_on_the_host and d.sh(f"test -e /etc/systemd/system/{UNIT.format('tp8')} && echo yes").strip() != "yes":
        d.stack("tp8").up(on_output=print)
    result = d.stack("ep8").up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert is_active(d, "ep8") == "active"


def test_up_tp8_is_ready(deployment):
    d = deployment
    result = d.stack("tp8").up(on_output=print)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready", r
    assert r["layout"]["tp_size"] == 8 and r["layout"]["ep_size"] == 1
    assert "rehearsal" in r["version"]
    assert is_active(d, "tp8") == "active"
    assert d.sh("stat -c %a /etc/gpu-serving/kimi-k2.6.env").strip() == "600"
    facts = result.outputs["host"].value
    assert facts["gpu_count"] == 8 and facts["interconnect"] == "pcie"


def test_preview_ep8_shows_the_unit_to_create(deployment):
    d = deployment
    lines = []
    preview = d.stack("ep8").preview(diff=True, on_output=lines.append)
    text = "\n".join(lines) + preview.stdout + preview.stderr
    summary = preview.change_summary
    assert set(summary) <= {"create", "same"}, summary  # nothing deleted or replaced
    assert "--ep-size 8" in text and "sglang-kimi-k2.6-ep8.service" in text
    # the host has not been touched by the preview
    assert d.sh("test -e /etc/systemd/system/sglang-kimi-k2.6-ep8.service && echo yes || echo no").strip() == "no"


def test_up_ep8_switches(deployment):
    d = deployment
    result = d.stack("ep8").up(on_output=print)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready" and r["layout"]["tp_size"] == 8 and r["layout"]["ep_size"] == 8
    assert is_active(d, "ep8") == "active"
    assert is_active(d, "tp8") == "inactive"
    # The sibling's stop finished before ep8 started (After= beside Conflicts=): no crash on a
    # port still held, no restart by systemd.
    assert d.sh(f"systemctl show -p NRestarts --value {UNIT.format('ep8')}").strip() == "0"


def test_hand_edited_unit_is_drift_and_repaired(deployment):
    d = deployment
    path = "/etc/systemd/system/" + UNIT.format("ep8")
    original = d.sh(f"cat {path}")
    d.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 128/' {path}")
    lines = []
    with pytest.raises(auto.CommandError) as info:
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines) + str(info.value)
    assert "unit-file" in text and "max-running-requests" in text
    d.stack("ep8").up(refresh=True, on_output=print)
    assert d.sh(f"cat {path}") == original
    assert is_active(d, "ep8") == "active"


def test_stopped_unit_is_drift_and_restarted(deployment):
    d = deployment
    d.sh(f"systemctl stop {UNIT.format('ep8')}")
    with pytest.raises(auto.CommandError) as info:
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True)
    assert "service" in str(info.value)
    result = d.stack("ep8").up(refresh=True, on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert is_active(d, "ep8") == "active"


def test_hand_edited_environment_file_is_drift_and_repaired(deployment):
    d = deployment
    path = "/etc/gpu-serving/kimi-k2.6.env"
    original = d.sh(f"cat {path}")
    d.sh(f"sed -i 's/^NCCL_ALGO=Ring$/NCCL_ALGO=Tree/' {path}")
    with pytest.raises(auto.CommandError) as info:
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True)
    text = str(info.value)
    assert "environment-file" in text and "NCCL_ALGO=Tree" in text, text[-3000:]
    d.stack("ep8").up(refresh=True)
    assert d.sh(f"cat {path}") == original
    assert d.sh(f"stat -c %a {path}").strip() == "600"


def test_disabled_unit_is_drift_and_enabled_again(deployment):
    d = deployment
    d.sh(f"systemctl disable {UNIT.format('ep8')}")
    with pytest.raises(auto.CommandError) as info:
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True)
    assert "enabled" in str(info.value)
    d.stack("ep8").up(refresh=True)
    assert d.sh(f"systemctl is-enabled {UNIT.format('ep8')}").strip() == "enabled"
    assert is_active(d, "ep8") == "active"


def test_unit_file_deleted_while_serving_is_written_back_without_a_restart(deployment):
    # An operator deletes the unit file and reloads systemd while the model serves: systemd keeps
    # the process. The preview shows the file to write back and nothing that starts or restarts
    # the model (before: the service read as gone, "+ create"); the up writes it and systemd
    # loads it again (not LoadState=error, which a restart would then trip on); same process.
    d = deployment
    ep8_serves(d)
    unit = UNIT.format("ep8")
    show = f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {unit}"
    before = d.sh(show)
    d.sh(f"rm /etc/systemd/system/{unit} && systemctl daemon-reload")
    assert d.sh(f"systemctl show -p LoadState -p ActiveState {unit}").split() == ["LoadState=not-found", "ActiveState=active"]
    lines = []
    preview = d.stack("ep8").preview(refresh=True, diff=True, on_output=lines.append)
    assert {k: v for k, v in preview.change_summary.items() if k != "same"} == {"create": 1}, preview.change_summary
    assert "unit-file" in "\n".join(lines)
    result = d.stack("ep8").up(refresh=True, on_output=print)
    assert {k: v for k, v in (result.summary.resource_changes or {}).items() if k != "same"} == {"create": 1}
    assert d.sh(f"systemctl show -p LoadState -p UnitFileState {unit}").split() == ["LoadState=loaded", "UnitFileState=enabled"]
    assert d.sh(show) == before
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)


def _environ(d, unit: str) -> str:
    return d.sh(f"tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value {unit})/environ")


def test_a_drop_in_is_drift_and_the_up_removes_it_instead_of_restarting_into_it_again(deployment):
    # `systemctl edit` on the serving unit, then a restart: the server runs a variable nobody
    # declared. Before: the up restarted the unit, the drop-in set it again, and every later
    # preview and up found the same drift (a model restart per up, for ever). Now the drop-in is
    # drift itself, and the up removes it before the restart.
    d = deployment
    ep8_serves(d)
    unit = UNIT.format("ep8")
    drop_in = f"/etc/systemd/system/{unit}.d/override.conf"
    d.sh(f"mkdir -p /etc/systemd/system/{unit}.d && printf '[Service]\\nEnvironment=SGLANG_ENABLE_TORCH_COMPILE=1\\n' > {drop_in}"
         f" && systemctl daemon-reload && systemctl restart {unit}")
    assert "SGLANG_ENABLE_TORCH_COMPILE=1" in _environ(d, unit)
    lines = []
    with pytest.raises(auto.CommandError) as info:
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines) + str(info.value)
    assert "dropIns" in text and drop_in in text and "SGLANG_ENABLE_TORCH_COMPILE=1 set, not declared" in text, text[-3000:]
    result = d.stack("ep8").up(refresh=True, on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert d.sh(f"test -e {drop_in} && echo kept || echo gone").strip() == "gone"
    assert "SGLANG_ENABLE_TORCH_COMPILE" not in _environ(d, unit)
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)  # converged: nothing left to restart


def test_a_drop_in_that_never_ran_is_removed_without_a_restart(deployment):
    d = deployment
    ep8_serves(d)
    unit = UNIT.format("ep8")
    drop_in = f"/run/systemd/system/{unit}.d/override.conf"  # `systemctl edit --runtime`
    d.sh(f"mkdir -p /run/systemd/system/{unit}.d && printf '[Unit]\\nDescription=edited by hand\\n' > {drop_in}"
         " && systemctl daemon-reload")
    show = f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {unit}"
    before = d.sh(show)
    lines = []
    preview = d.stack("ep8").preview(refresh=True, diff=True, on_output=lines.append)
    # The service (its drop-in to remove) and its readiness check after it; nothing created or replaced.
    assert {k: v for k, v in preview.change_summary.items() if k != "same"} == {"update": 2}, preview.change_summary
    assert drop_in in "\n".join(lines)
    d.stack("ep8").up(refresh=True, on_output=print)
    assert d.sh(f"test -e {drop_in} && echo kept || echo gone").strip() == "gone"
    assert d.sh(f"systemctl show -p Description --value {unit}").strip() != "edited by hand"
    assert d.sh(show) == before
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)


def test_a_vendor_drop_in_is_drift_in_the_check_and_in_status_and_the_up_says_it_stays(deployment):
    """Issue 36.8: a package's /usr/lib/systemd/system/<unit>.d/*.conf that changes the unit's
    environment (the cause of a crash in a fleet run) is seen by the drift check and by `status`,
    with the variable it adds to the environment systemd would start the unit with. It is not
    gpu-serving's to delete: the up says it stays; removed, the check is clean again."""
    d = deployment
    ep8_serves(d)
    unit = UNIT.format("ep8")
    vendor = f"/usr/lib/systemd/system/{unit}.d/50-vendor.conf"
    d.sh(f"mkdir -p /usr/lib/systemd/system/{unit}.d && printf '[Service]\\nEnvironment=NCCL_DEBUG=INFO\\n' > {vendor}"
         " && systemctl daemon-reload")
    try:
        lines: list[str] = []
        with pytest.raises(auto.CommandError) as info:
            d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
        text = "\n".join(lines) + str(info.value)
        assert "foreignDropIns" in text and vendor in text and "Environment=NCCL_DEBUG=INFO" in text, text[-3000:]
        assert f"NCCL_DEBUG=INFO set by {vendor}, not declared" in text, text[-3000:]
        done = d.components("status", "--stack", "ep8", timeout=300)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"drop-in {vendor} sets Environment=NCCL_DEBUG=INFO (for this unit;" in done.stdout, done.stdout
        assert f"environment: NCCL_DEBUG=INFO set by {vendor}" in done.stdout, done.stdout
        said: list[str] = []
        result = d.stack("ep8").up(on_output=said.append)
        assert "a drop-in gpu-serving did not write stays" in "\n".join(said) + result.stderr, "\n".join(said)[-3000:]
        assert d.sh(f"test -e {vendor} && echo kept || echo gone").strip() == "kept"
    finally:
        d.sh(f"rm -rf /usr/lib/systemd/system/{unit}.d && systemctl daemon-reload")
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)
    assert d.components("status", "--stack", "ep8", timeout=300).returncode == 0


def test_the_environment_file_given_to_another_user_is_drift_and_given_back(deployment):
    # chown: the file keeps its mode (0600) and its text, but another user may now read the
    # secrets in it. Drift (the file's owner), in the preview and in status; the up gives it back.
    d = deployment
    ep8_serves(d)
    path = "/etc/gpu-serving/kimi-k2.6.env"
    d.sh(f"chown nobody:nogroup {path}")
    lines = []
    with pytest.raises(auto.CommandError):
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines)
    assert "owner" in text and "65534:65534" in text, text[-3000:]
    status = d.components("status", "--stack", "ep8")
    assert f"environment file {path} belongs to 65534:65534 (uid:gid), not root" in status.stdout, status.stdout
    d.stack("ep8").up(refresh=True, on_output=print)
    assert d.sh(f"stat -c '%u:%g %a' {path}").strip() == "0:0 600"
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)


def test_another_strategy_enabled_by_hand_is_drift_and_disabled_by_the_up(deployment):
    # `systemctl enable` of tp8 while ep8 serves: after a reboot both would start, and either could
    # end up serving. The serving stack's check says so; its up disables tp8 and restarts nothing.
    d = deployment
    ep8_serves(d, tp8_on_the_host=True)
    tp8, ep8 = UNIT.format("tp8"), UNIT.format("ep8")
    d.sh(f"systemctl enable --quiet {tp8}")
    show = f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {ep8}"
    before = d.sh(show)
    lines = []
    with pytest.raises(auto.CommandError):
        d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines)
    assert "othersEnabled" in text and tp8 in text, text[-3000:]
    d.stack("ep8").up(refresh=True, on_output=print)
    assert d.sh(f"systemctl is-enabled {tp8}").strip() == "disabled"
    assert d.sh(f"systemctl is-enabled {ep8}").strip() == "enabled" and d.sh(show) == before
    d.stack("ep8").preview(refresh=True, expect_no_changes=True)


def test_second_up_changes_nothing_on_the_host(deployment):
    d = deployment
    probe = ("stat -c '%Y %a' /etc/systemd/system/" + UNIT.format("ep8") + " /etc/gpu-serving/kimi-k2.6.env; "
             f"systemctl show -p MainPID -p NRestarts -p ActiveEnterTimestamp {UNIT.format('ep8')}")
    before = d.sh(probe)
    result = d.stack("ep8").up(on_output=print)
    changes = {k: v for k, v in (result.summary.resource_changes or {}).items() if k != "same"}
    assert changes == {}, changes
    assert d.sh(probe) == before


def test_the_state_keeps_only_the_projects_own_frames_of_each_resources_stack_trace(deployment):
    """components/pulumi_sdk.py: the stack trace the engine keeps with each resource is the
    project's own frames (not the language host's, asyncio's, the SDK's or the warm runner's)."""
    resources = deployment.stack("ep8").export_stack().deployment["resources"]
    # The stack resource itself is registered by the SDK before the program's first line.
    traces = {r["urn"].rsplit("::", 1)[-1]: [f.get("sourcePosition", "") for f in r.get("stackTrace") or []]
              for r in resources if r["type"] != "pulumi:pulumi:Stack"}
    assert traces["service"][0].startswith("project:///components/"), traces["service"]
    assert any(p.startswith("project:///__main__.py") for p in traces["service"]), traces["service"]
    foreign = {name: [p for p in frames[1:] if not p.startswith("project:///") or p.startswith(("project:///.venv/",
                                                                                              "project:///../"))]
               for name, frames in traces.items()}
    assert {name: f for name, f in foreign.items() if f} == {}, foreign


def test_refreshes_of_a_clean_stack_show_no_change(deployment):
    """`pulumi refresh` run by hand, twice: nothing on the host changed, so no resource may show
    a difference (the files' sha256 output once came back as an input and read as
    `[diff: -sha256]` on every refresh after the first)."""
    d = deployment
    diffs: dict[str, list[str]] = {}

    def seen(event: auto.EngineEvent) -> None:
        for part in (event.resource_pre_event, event.res_outputs_event):
            if part is not None and part.metadata.diffs:
                diffs.setdefault(part.metadata.urn.rsplit("::", 1)[-1], []).extend(part.metadata.diffs)

    for _ in range(2):
        d.stack("ep8").refresh(on_event=seen)
    # The readiness check says when it looked: that output changes on every look, by design.
    assert {name: keys for name, keys in diffs.items() if name != "readiness"} == {}, diffs


def test_switch_back_to_tp8(deployment):
    d = deployment
    result = d.stack("tp8").up(on_output=print)
    assert result.outputs["readiness"].value["layout"]["tp_size"] == 8
    assert is_active(d, "tp8") == "active" and is_active(d, "ep8") == "inactive"
    assert d.sh(f"systemctl show -p NRestarts --value {UNIT.format('tp8')}").strip() == "0"


def test_strategy_needing_more_gpus_than_the_host_has_fails_before_writing(deployment):
    d = deployment
    d.write_stack_file("tp16", {"tpSize": 16}, {"gpu-serving:host": {"rehearsal": d.host.name, "gpuCount": 16, "gpuMemoryGb": 96}})
    with pytest.raises(auto.CommandError) as info:
        d.stack("tp16").up(on_output=print)
    assert "needs 16 GPUs but the host has 8" in str(info.value)
    assert d.sh("ls /etc/systemd/system/ | grep -c tp16 || true").strip() == "0"
    assert is_active(d, "tp8") == "active"


def test_destroy_removes_only_its_own_unit(deployment):
    d = deployment
    d.stack("ep8").destroy(on_output=print)
    units = d.sh("ls /etc/systemd/system/")
    assert UNIT.format("ep8") not in units and UNIT.format("tp8") in units
    assert d.sh("test -f /etc/gpu-serving/kimi-k2.6.env && echo yes").strip() == "yes"
    assert is_active(d, "tp8") == "active"
