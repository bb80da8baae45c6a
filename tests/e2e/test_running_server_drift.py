"""Issue 12, points 2-4, on one rehearsal host: drift covers the running server, not only its
files; a hand-changed layout is repaired by one `up`; after a kill -9 or an interrupted switch,
one `up` converges and the drift check is then clean."""
from __future__ import annotations

import copy
import signal
import subprocess
import time

import pytest
import yaml
from pulumi import automation as auto

from tests.e2e.conftest import FAST_ENV, FAST_READINESS
from tests.pulumi_env import bin_dir

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

TP8 = "sglang-kimi-k2.6-tp8.service"
EP8 = "sglang-kimi-k2.6-ep8.service"
UNIT_FILE = f"/etc/systemd/system/{TP8}"
ENV_FILE = "/etc/gpu-serving/kimi-k2.6.env"


def main_pid(d, unit: str) -> str:
    return d.sh(f"systemctl show -p MainPID --value {unit}").strip()


def running_argv(d, unit: str) -> list[str]:
    return d.sh(f"tr '\\0' '\\n' < /proc/{main_pid(d, unit)}/cmdline").splitlines()


def running_environment(d, unit: str) -> dict[str, str]:
    lines = d.sh(f"tr '\\0' '\\n' < /proc/{main_pid(d, unit)}/environ").splitlines()
    return dict(line.partition("=")[::2] for line in lines if "=" in line)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def drift_text(d, stack: str) -> str:
    """The drift check (`preview --refresh --expect-no-changes`); fails the test when clean."""
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as info:
        d.stack(stack).preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines) + str(info.value)
    return text


def check_is_clean(d, stack: str) -> None:
    d.stack(stack).preview(refresh=True, expect_no_changes=True, diff=True)


@pytest.fixture(scope="module")
def serving(deployment):
    """tp8 deployed and ready, the drift check clean."""
    result = deployment.stack("tp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    return deployment


def test_hand_edited_flag_and_environment_after_restart_is_drift_naming_the_running_server(serving):
    d = serving
    d.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 128/' {UNIT_FILE}; "
         f"sed -i 's/^NCCL_ALGO=Ring$/NCCL_ALGO=Tree/' {ENV_FILE}; systemctl daemon-reload; systemctl restart {TP8}")
    assert flag(running_argv(d, TP8), "--max-running-requests") == "128"
    text = drift_text(d, "tp8")
    assert "runningServer" in text and "the running server was started from other settings" in text, text[-4000:]
    assert "--max-running-requests 128 (declared 64)" in text and "NCCL_ALGO=Tree (declared Ring)" in text, text[-4000:]
    assert "an up restarts it" in text


# What the preview says before an `up` reloads the serving model to repair it (issue 36.3).
RESTART_LINE = ("will RESTART (model reload): the running server was started from other settings: "
                "--max-running-requests 128 (declared 64); NCCL_ALGO=Tree (declared Ring)")


def test_the_preview_of_up_refresh_says_the_drift_repair_restarts_the_model(serving):
    """Issue 36.3: `pulumi up --refresh`'s preview showed only `service update [diff:
    ~runningServer]`, and "restarting" came once the update ran: for a 590 GB model a long outage
    approved blind. Its preview says which unit on which host restarts, and why."""
    d = serving
    before = main_pid(d, TP8)
    # The preview `pulumi up --refresh` shows before it asks (the engine's `up` has no preview-only flag).
    done = subprocess.run([str(bin_dir(d.env) / "pulumi"), "preview", "--refresh", "--stack", "tp8"],
                          cwd=d.project, env=d.env, capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    said = [line.strip() for line in text.splitlines() if RESTART_LINE in line]
    assert said and said[-1] == f"restart: {TP8} on root@{d.host.address}:{d.host.port} {RESTART_LINE}", text[-4000:]
    assert main_pid(d, TP8) == before  # a preview restarts nothing


def test_up_after_the_hand_edit_runs_the_declared_flags_and_environment(serving):
    d = serving
    before = main_pid(d, TP8)
    lines: list[str] = []
    result = d.stack("tp8").up(refresh=True, on_output=lines.append)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    # An up without a preview of its own (the Automation API's: --skip-preview) says it itself.
    assert any(RESTART_LINE in line for line in lines), "\n".join(lines)[-4000:]
    assert main_pid(d, TP8) != before  # restarted, not only the files rewritten
    argv, env = running_argv(d, TP8), running_environment(d, TP8)
    assert flag(argv, "--max-running-requests") == "64"
    declared = {k: v.strip('"') for k, _, v in (line.partition("=") for line in d.sh(f"cat {ENV_FILE}").splitlines())
                if k and not k.startswith("#")}
    assert declared["NCCL_ALGO"] == "Ring"
    assert {k: env.get(k) for k in declared} == declared
    check_is_clean(d, "tp8")


def test_hand_changed_layout_is_repaired_by_one_up(serving):
    d = serving
    d.sh(f"sed -i 's/--tp-size 8 /--tp-size 4 /; s/--pp-size 1 /--pp-size 2 /' {UNIT_FILE}; "
         f"systemctl daemon-reload; systemctl restart {TP8}")
    argv = running_argv(d, TP8)
    assert (flag(argv, "--tp-size"), flag(argv, "--pp-size")) == ("4", "2")
    # Wait until it serves the hand-made layout, so the check sees a layout_mismatch.
    for _ in range(60):
        if d.sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30001/health_generate || true").strip() == "200":
            break
        time.sleep(0.5)
    text = drift_text(d, "tp8")
    assert "layout_mismatch" in text and "tp_size declared 8 running 4" in text, text[-4000:]
    assert "pp_size declared 1 running 2" in text
    result = d.stack("tp8").up(on_output=print)  # refresh: always (Pulumi.yaml)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready" and r["layout"]["tp_size"] == 8 and r["layout"]["pp_size"] == 1, r
    argv = running_argv(d, TP8)
    assert (flag(argv, "--tp-size"), flag(argv, "--pp-size")) == ("8", "1")
    check_is_clean(d, "tp8")


def test_status_is_a_probe_nothing_serves_after_a_stop(serving):
    """Issue 36.14: a stopped unit is exit 3 (nothing serves), not 0; one up and it is 0 again."""
    d = serving
    assert d.components("status", "--stack", "tp8", timeout=300).returncode == 0
    d.sh(f"systemctl stop {TP8}")
    done = d.components("status", "--stack", "tp8", timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "serving   nothing" in done.stdout and "nothing serves on " in done.stdout, done.stdout
    assert d.stack("tp8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    assert d.components("status", "--stack", "tp8", timeout=300).returncode == 0


def test_after_kill_9_one_up_converges_and_the_check_is_clean(serving):
    d = serving
    d.sh(f"kill -9 {main_pid(d, TP8)}")
    result = d.stack("tp8").up(on_output=print)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready", r
    assert d.sh(f"systemctl is-active {TP8}").strip() == "active"
    check_is_clean(d, "tp8")


def test_status_after_an_interrupted_switch_says_a_reboot_would_start_the_old_strategy(serving):
    """Issue 36.2: two Ctrl-C while the switch to ep8 waits for readiness leave ep8 serving but
    not enabled, tp8 stopped but enabled. `status` says what a reboot would start and exits
    non-zero (the drift check catches it too); the next test's `up` converges."""
    d = serving
    # ep8 loads slowly (its own environment file, so tp8's is untouched). It was deployed before
    # (tp8 serves again since): the switch back to it, with the same settings, is killed while it
    # waits for readiness, after ep8 started and tp8 stopped.
    project = yaml.safe_load((d.project / "Pulumi.yaml").read_text())["config"]
    serving_settings = copy.deepcopy(project["gpu-serving:serving"]["value"])
    serving_settings["environment"] = {**serving_settings["environment"], **FAST_ENV, "REHEARSAL_LOAD_SECONDS": "12"}
    serving_settings["environmentDir"] = "/etc/gpu-serving/ep8"
    d.write_stack_file("ep8", {"tpSize": 8, "epSize": 8}, {"gpu-serving:serving": serving_settings,
                                                           "gpu-serving:readiness": FAST_READINESS})
    assert d.stack("ep8").up().outputs["readiness"].value["status_when_checked"] == "ready"
    assert d.stack("tp8").up().outputs["readiness"].value["status_when_checked"] == "ready"
    run = subprocess.Popen([str(bin_dir(d.env) / "pulumi"), "up", "--stack", "ep8", "--yes", "--skip-preview"],
                           cwd=d.project, env=d.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        for _ in range(240):
            if d.sh(f"systemctl is-active {EP8} || true").strip() == "active":
                break
            time.sleep(0.5)
        else:
            pytest.fail("ep8 never started")
        time.sleep(2)
        run.send_signal(signal.SIGINT)  # the operator's double Ctrl-C
        time.sleep(0.3)
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode != 0, out.decode(errors="replace")[-3000:]
    # What the interruption left: ep8 running (loading) but not enabled, tp8 stopped but enabled.
    assert d.sh(f"systemctl is-enabled {EP8} || true").strip() != "enabled"
    assert d.sh(f"systemctl is-active {TP8} || true").strip() != "active"
    assert d.sh(f"systemctl is-enabled {TP8} || true").strip() == "enabled"
    # Once ep8 generates (it loads 12 s), the only thing wrong is what a reboot would start.
    for _ in range(240):
        if d.sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30001/health_generate || true").strip() == "200":
            break
        time.sleep(0.5)
    done = d.components("status", "--stack", "ep8", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # drift of the serving stack
    said = f"enabled/active disagree with what serves: a reboot would start {TP8} (stack tp8), while {EP8} (stack ep8) serves"
    assert said in done.stdout and "`pulumi up --stack ep8` enables it" in done.stdout, done.stdout
    assert "files as declared" not in done.stdout.split("* ep8")[1].splitlines()[0], done.stdout


def test_after_an_interrupted_switch_one_up_converges_and_the_check_is_clean(serving):
    d = serving
    # The interruption left Pulumi's pending operation (docs/readiness.md: what it means here); one up
    # refreshes first and clears it (issue 36.20).
    assert d.stack("ep8").export_stack().deployment.get("pending_operations"), "no pending operation to clear"
    result = d.stack("ep8").up(on_output=print)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready" and r["layout"]["ep_size"] == 8, r
    assert d.sh(f"systemctl is-enabled {EP8}").strip() == "enabled"
    assert d.sh(f"systemctl is-enabled {TP8} || true").strip() != "enabled"
    check_is_clean(d, "ep8")
    assert not d.stack("ep8").export_stack().deployment.get("pending_operations")
    done = d.components("status", "--stack", "ep8", timeout=300)
    assert done.returncode == 0 and "disagree" not in done.stdout, done.stdout + done.stderr


def test_an_environment_key_on_and_a_value_off_deploy_with_no_drift_in_status(serving):
    """Issue 36.13: a variable named `on` and one set to `off`, written plainly in the stack file.
    Pulumi reads them as YAML 1.2 does (`on=1`, `SWITCH=off` on the host); `plan` and `status`
    read the file the same way, so `status` finds no drift (with YAML 1.1 it showed
    `Environment=true=1` as declared and reported drift for ever, exit 1)."""
    d = serving
    path = d.project / "Pulumi.tp8.yaml"
    text = path.read_text()
    path.write_text(text.replace("config:\n", 'config:\n  gpu-serving:serving:\n    environment:\n'
                                 '      on: "1"\n      SWITCH: off\n', 1))
    try:
        assert d.stack("tp8").up().outputs["readiness"].value["status_when_checked"] == "ready"
        env = running_environment(d, TP8)
        assert env.get("on") == "1" and env.get("SWITCH") == "off", env
        planned = d.components("plan", "--stack", "tp8", "--json")
        assert planned.returncode == 0, planned.stderr
        assert {"on": "1", "SWITCH": "off"}.items() <= yaml.safe_load(planned.stdout)["environment"].items()
        done = d.components("status", "--stack", "tp8")
        assert done.returncode == 0 and "DRIFT" not in done.stdout, done.stdout + done.stderr
        check_is_clean(d, "tp8")
    finally:
        path.write_text(text)
