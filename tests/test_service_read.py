"""ServiceProvider.read on recorded answers of a real host (tests/data/service-read/): what the
refresh reports for the strategy unit, which decides whether a preview promises a start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core import readiness as R
from components.remote import providers, ssh

CASES = Path(__file__).parent / "data" / "service-read"
TARGET = {"host": "192.0.2.7", "port": 22, "user": "root", "privateKey": "k", "hostKey": "ssh-ed25519 AAAA"}


def _case(name: str) -> dict:
    return json.loads((CASES / f"{name}.json").read_text())


def _read(monkeypatch, props: dict, stdout: str):
    asked = []

    def fetch(t, request):
        asked.append(request["purpose"])
        if request["purpose"].startswith("reading the state of"):
            return ssh.Result(0, stdout, "")
        if request["purpose"] == "reading what serves":  # a unit that does not run: who does instead
            return ssh.Result(0, "@@now 100.0\n", "")
        raise AssertionError(f"unexpected read: {request['purpose']}")

    monkeypatch.setattr(ssh, "fetch", fetch)
    result = providers.ServiceProvider().read("10.213.0.2:" + props["unit"], {**props, "connection": TARGET})
    return result, asked


def test_a_unit_whose_file_was_deleted_while_it_runs_still_serves(monkeypatch):
    # Recorded: `rm` of the unit file and `systemctl daemon-reload` on a serving host. systemd
    # keeps the process (LoadState=not-found, ActiveState=active); the refresh must not read the
    # service as gone, or the preview promises a start (a restart of the model) that the update,
    # once the unit file is back, never makes.
    case = _case("unit-file-deleted-while-it-runs")
    assert "LoadState=not-found" in case["stdout"] and "ActiveState=active" in case["stdout"]
    for enabled in (True, False):
        result, asked = _read(monkeypatch, {**case["props"], "enabled": enabled}, case["stdout"])
        assert result.id is not None
        assert result.outs["active"] is True and result.outs["runningServer"] == R.AS_DECLARED
        assert result.outs["enabled"] is enabled  # systemd cannot say without the file: the last reading
        assert asked == [f"reading the state of {case['props']['unit']}"]


def test_a_unit_whose_file_is_gone_and_that_does_not_run_is_gone(monkeypatch):
    case = _case("unit-file-deleted-while-it-runs")
    stopped = case["stdout"].replace("ActiveState=active", "ActiveState=inactive").replace("SubState=running", "SubState=dead")
    result, _ = _read(monkeypatch, case["props"], stopped)
    assert result.id is None and result.outs == {}


@pytest.mark.parametrize("file_state, enabled", [("enabled", True), ("disabled", False)])
def test_a_loaded_unit_says_itself_whether_it_is_enabled(monkeypatch, file_state, enabled):
    case = _case("unit-file-deleted-while-it-runs")
    loaded = case["stdout"].replace("LoadState=not-found", "LoadState=loaded").replace("UnitFileState=\n", f"UnitFileState={file_state}\n")
    result, _ = _read(monkeypatch, {**case["props"], "enabled": not enabled}, loaded)
    assert result.outs["enabled"] is enabled and result.outs["runningServer"] == R.AS_DECLARED


def test_the_units_own_drop_ins_are_drift_until_gone(monkeypatch):
    # `systemctl edit` on the serving unit: its drop-in is a hand edit of the unit. The refresh
    # reports it (the diff then plans the update that removes it); the OS's drop-ins for every
    # service are not the unit's; once gone, the key goes too, so nothing stays to update.
    case = _case("unit-file-deleted-while-it-runs")
    unit = case["props"]["unit"]
    own = f"/etc/systemd/system/{unit}.d/override.conf"
    loaded = case["stdout"].replace("LoadState=not-found", "LoadState=loaded").replace("UnitFileState=\n", "UnitFileState=enabled\n")
    listed = f"/usr/lib/systemd/system/service.d/10-timeout-abort.conf {own}"
    edited = loaded.replace("NeedDaemonReload=no\n", f"NeedDaemonReload=no\nDropInPaths={listed}\n")
    result, _ = _read(monkeypatch, case["props"], edited)
    assert result.outs["dropIns"] == [own] and result.inputs["dropIns"] == [own]
    assert result.outs["runningServer"] == R.AS_DECLARED  # not restarted since: the process runs as declared
    # The engine diffs the outputs it stored against what the program declares.
    declared = {**{k: v for k, v in case["props"].items() if k not in ("previous", "readinessReport", "runningServer")},
                "connection": TARGET}
    provider = providers.ServiceProvider()
    assert provider.diff("id", result.outs, declared).changes is True
    # The next reading, after the up removed it: no key, no change left.
    again, _ = _read(monkeypatch, result.outs, loaded)
    assert "dropIns" not in again.outs and "dropIns" not in again.inputs
    assert provider.diff("id", again.outs, declared).changes is False


def test_another_strategy_enabled_beside_the_serving_one_is_drift_of_the_serving_one(monkeypatch):
    # `systemctl enable` of tp8 by hand while ep8 serves: a reboot would start both. The serving
    # unit's read says so (its up disables tp8, as a switch does); a unit that does not serve
    # says nothing of the others (its stack is superseded anyway).
    case = _case("unit-file-deleted-while-it-runs")
    loaded = case["stdout"].replace("LoadState=not-found", "LoadState=loaded").replace("UnitFileState=\n", "UnitFileState=enabled\n")
    assert loaded.rstrip().splitlines()[-1] != "@@others-enabled"
    both = loaded + "@@others-enabled\nsglang-kimi-k2.6-tp8.service\n"
    result, _ = _read(monkeypatch, case["props"], both)
    assert result.outs["othersEnabled"] == ["sglang-kimi-k2.6-tp8.service"]
    declared = {**{k: v for k, v in case["props"].items() if k not in ("previous", "readinessReport", "runningServer")},
                "connection": TARGET}
    assert providers.ServiceProvider().diff("id", result.outs, declared).changes is True
    alone, _ = _read(monkeypatch, result.outs, loaded + "@@others-enabled\n")
    assert "othersEnabled" not in alone.outs and providers.ServiceProvider().diff("id", alone.outs, declared).changes is False
    stopped = both.replace("ActiveState=active", "ActiveState=inactive").replace("SubState=running", "SubState=dead")
    quiet, _ = _read(monkeypatch, case["props"], stopped)
    assert "othersEnabled" not in quiet.outs


def test_a_vendor_drop_in_is_drift_that_names_it_and_the_variable_it_adds(monkeypatch):
    # Issue 36.8: a package's /usr/lib/systemd/system/<unit>.d/*.conf (recorded on a rehearsal
    # host, tests/data/dropins/) is read by the refresh: the drop-in with its settings and the
    # variable that reaches the server, until it is removed (an up does not delete it).
    recorded = json.loads((Path(__file__).parent / "data" / "dropins" / "vendor-drop-in-for-this-unit-under-usr-lib.json").read_text())
    case = _case("unit-file-deleted-while-it-runs")
    props = {**case["props"], "unit": recorded["unit"], "environment": recorded["declared"]}
    result, _ = _read(monkeypatch, props, recorded["stdout"])
    path = f"/usr/lib/systemd/system/{recorded['unit']}.d/50-vendor.conf"
    assert [line.split(" ")[0] for line in result.outs["foreignDropIns"]] == [path]
    assert "NCCL_DEBUG=INFO" in result.outs["foreignDropIns"][0] and "LimitNOFILE=4096" in result.outs["foreignDropIns"][0]
    assert result.outs["effectiveEnvironment"] == [f"NCCL_DEBUG=INFO set by {path}, not declared"]
    declared = {**{k: v for k, v in props.items() if k not in ("previous", "readinessReport", "runningServer")},
                "active": False, "enabled": result.outs["enabled"], "connection": TARGET}  # recorded stopped
    assert providers.ServiceProvider().diff("id", result.outs, declared).changes is True
    # Removed: no key left, nothing to update.
    clean = json.loads((Path(__file__).parent / "data" / "dropins" / "clean-unit-without-drop-ins.json").read_text())
    again, _ = _read(monkeypatch, result.outs, clean["stdout"])
    assert "foreignDropIns" not in again.outs and "effectiveEnvironment" not in again.outs
    assert providers.ServiceProvider().diff("id", again.outs, declared).changes is False
