"""Issue 8, point 1, for real: bad input is refused by `pulumi preview` and `pulumi up` with an
error naming the setting, and not one command runs on the host; a serving port held by a
process that is not ours is refused at `up` before the serving strategy is stopped.

The rehearsal host of this module records every command its sshd runs (ForceCommand, see
tests/hardening_support.py) and logs every login; the test reads both from outside the
container, so that looking runs nothing there.
"""
from __future__ import annotations

import copy

import pytest
import yaml
from pulumi import automation as auto

from tests import hardening_support as H
from tests.test_bad_input_corpus import CORPUS

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

TP8 = "sglang-kimi-k2.6-tp8.service"
# Corpus cases sent through the real engine: one or more of each kind.
SAMPLE = ["arith-tp1-ep8", "memory-80gb-gpus", "port-privileged", "served-name-subshell", "path-model-space",
          "unit-model-name-template", "extra-abbrev-mem-fraction", "type-tp-bool", "env-token-in-clear",
          "apt-trusted-yes"]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    H.install_command_log(host)
    d = make_deployment(tmp_path_factory.mktemp("hardening-input"), host)
    result = d.stack("tp8").up()
    assert result.outputs["readiness"].value["status"] == "ready"
    return d


def stack_file(d, case: dict) -> dict:
    """The corpus case as a stack file: its sections under the namespace, tp8's layout unless it
    states one, and (sections replace whole objects) this module's rehearsal host kept."""
    config = {f"gpu-serving:{k}": copy.deepcopy(v) for k, v in case["config"].items()}
    config.setdefault("gpu-serving:strategy", {"tpSize": 8})
    host = config.get("gpu-serving:host")
    if isinstance(host, dict) and "address" not in host:
        host["rehearsal"] = d.host.name
    return config


def failing(op, **kwargs) -> str:
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as info:
        op(on_output=lines.append, **kwargs)
    return "\n".join(lines) + "\n" + str(info.value)


def host_state(d) -> str:
    """What a bad run must not change: the unit and environment files and the serving process."""
    return d.sh(f"sha256sum /etc/systemd/system/sglang-* /etc/gpu-serving/*.env; stat -c '%n %Y %a' "
                f"/etc/systemd/system/sglang-* /etc/gpu-serving/*.env; systemctl show -p MainPID -p ActiveState "
                f"-p ActiveEnterTimestamp -p UnitFileState {TP8}; ls -a /etc/systemd/system /etc/gpu-serving /tmp")


@pytest.mark.parametrize("name", SAMPLE)
def test_bad_input_refused_by_preview_and_up_with_no_command_on_the_host(deployed, name):
    d = deployed
    case = yaml.safe_load((CORPUS / f"{name}.yaml").read_text())
    (d.project / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": stack_file(d, case)}))
    record = H.HostRecord(d.host)
    mark = record.mark()
    try:
        for op in (d.stack("bad").preview, d.stack("bad").up):
            text = failing(op)
            assert case["expect"]["setting"] in text and case["expect"]["contains"] in text, text[-3000:]
            assert "Traceback" not in text
    finally:
        (d.project / "Pulumi.bad.yaml").unlink()
    commands, logins = record.since(mark)
    assert commands == [] and logins == 0, (commands, logins)
    H.refused(name, through_pulumi=True)


def test_bad_edit_of_a_deployed_stack_runs_nothing_with_run_program(deployed):
    """A deployed stack reads the host on refresh (Pulumi.yaml: refresh: always). With
    --run-program (PULUMI_RUN_PROGRAM=true) the program runs first, so a bad value stops the run
    before any refresh read: zero commands, as for a new stack."""
    d = deployed
    path = d.project / "Pulumi.tp8.yaml"
    original = path.read_text()
    bad = {"gpu-serving:strategy": {"tpSize": 8},
           "gpu-serving:model": {"profile": "kimi-k2.6", "servedName": "kimi$(touch /tmp/pwned)"}}
    path.write_text(yaml.safe_dump({"config": bad}))
    before = host_state(d)
    record = H.HostRecord(d.host)
    mark = record.mark()
    try:
        for op in (d.stack("tp8").preview, d.stack("tp8").up):
            text = failing(op, refresh=True, run_program=True)
            assert "gpu-serving:model.servedName" in text, text[-3000:]
        commands, logins = record.since(mark)
        assert commands == [] and logins == 0, (commands, logins)
        # scripts/env.sh makes that the default: a plain preview runs nothing either.
        assert d.env.get("PULUMI_RUN_PROGRAM") == "true"
        mark = record.mark()
        text = failing(d.stack("tp8").preview)
        assert "gpu-serving:model.servedName" in text, text[-3000:]
        commands, logins = record.since(mark)
        assert commands == [] and logins == 0, (commands, logins)
        # Without it the refresh reads the host first (read-only, with the settings in the
        # state); the bad value still reaches nothing and nothing changes.
        d.env["PULUMI_RUN_PROGRAM"] = "false"
        mark = record.mark()
        try:
            text = failing(d.stack("tp8").preview)
        finally:
            d.env["PULUMI_RUN_PROGRAM"] = "true"
        assert "gpu-serving:model.servedName" in text, text[-3000:]
        commands, logins = record.since(mark)
        assert commands and logins, "the recording saw the refresh's reads (it is not blind)"
        assert not any("pwned" in c for c in commands), commands
        assert host_state(d) == before
    finally:
        path.write_text(original)
    H.refused("deployed-stack-served-name-subshell", through_pulumi=True)


def test_bad_secret_refused_at_preview_without_its_value(deployed):
    """gpu-serving:hfToken goes into a KEY="value" line of the environment file: a newline or a
    quote in it is refused at preview (the provider's check, no SSH), and the message does not
    repeat the value."""
    d = deployed
    token = "hf_SneakyValue42\nLD_PRELOAD=/tmp/evil.so"
    (d.project / "Pulumi.badsecret.yaml").write_text(yaml.safe_dump({"config": {"gpu-serving:strategy": {"tpSize": 8}}}))
    stack = d.stack("badsecret")
    stack.set_config("gpu-serving:hfToken", auto.ConfigValue(value=token, secret=True))
    record = H.HostRecord(d.host)
    mark = record.mark()
    try:
        text = failing(stack.preview)
    finally:
        (d.project / "Pulumi.badsecret.yaml").unlink()
    assert "gpu-serving:hfToken" in text and "whitespace" in text, text[-3000:]
    assert "SneakyValue42" not in text and "LD_PRELOAD" not in text
    commands, logins = record.since(mark)
    assert commands == [] and logins == 0, (commands, logins)
    H.refused("secret-hf-token-newline", through_pulumi=True)


def test_port_held_by_a_foreign_process_is_refused_before_the_serving_strategy_stops(deployed):
    """tp8 serves on 30001; a stack that would serve on 30002 finds a process that is none of our
    units there: `up` refuses before stopping tp8 (same process, same start time), leaves the new
    unit neither started nor enabled. Once the port is free, the same `up` switches."""
    d = deployed
    show = f"systemctl show -p MainPID -p ActiveEnterTimestamp -p ActiveState {TP8}"
    before = d.sh(show)
    assert "ActiveState=active" in before
    serving = yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]["gpu-serving:serving"]["value"]
    (d.project / "Pulumi.alt.yaml").write_text(yaml.safe_dump({"config": {
        "gpu-serving:strategy": {"tpSize": 8, "epSize": 8},
        "gpu-serving:serving": {**serving, "port": 30002}}}))
    d.sh("systemd-run --quiet --unit=foreign-http -p WorkingDirectory=/tmp python3 -m http.server 30002")
    H.fault_injected("a foreign process on the serving port")
    try:
        H.wait_for(lambda: "30002" in d.sh("ss -Hltn 'sport = :30002'"), 20, what="the foreign listener")
        text = failing(d.stack("alt").up)
        assert "port 30002" in text and "not a gpu-serving strategy unit" in text and "nothing was stopped" in text, text[-3000:]
        assert "python3" in text
        assert d.sh(show) == before
        alt = "sglang-kimi-k2.6-alt.service"
        assert d.sh(f"systemctl is-active {alt}; systemctl is-enabled {alt}").split() == ["inactive", "disabled"]
        assert "30002" in d.sh("ss -Hltn 'sport = :30002'")  # still theirs
    finally:
        d.sh("systemctl stop foreign-http.service")
    result = d.stack("alt").up()
    assert result.outputs["readiness"].value["status"] == "ready"
    states = d.sh(f"systemctl is-active {TP8} sglang-kimi-k2.6-alt.service; "
                  f"systemctl is-enabled {TP8} sglang-kimi-k2.6-alt.service").split()
    assert states == ["inactive", "active", "disabled", "enabled"], states
    H.fault_survived("a foreign process on the serving port")
