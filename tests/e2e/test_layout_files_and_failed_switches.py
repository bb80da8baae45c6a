"""Issue 12, points 1 and 6, on one rehearsal host, in order as an operator's day would go:
a new layout file never restarts the model that serves; a switch still leaves exactly one
strategy running and enabled; a failing stack that shares the environment file leaves the
previous strategy serving with its own environment (checked by a real generation); a switch
whose new shared environment breaks loading puts the file back byte for byte; and a rollback
that cannot serve says so instead of "Rolled back"."""
from __future__ import annotations

import json
import shlex

import pytest
from pulumi import automation as auto

from ..hardening_support import HostRecord, install_command_log
from .conftest import FAST_ENV, FAST_READINESS

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
ENV_FILE = "/etc/gpu-serving/kimi-k2.6.env"
MODEL = "/models/kimi-k2.6"


def main_pid(d, stack: str) -> str:
    return d.sh(f"systemctl show -p MainPID --value {UNIT.format(stack)}").strip()


def generates(d) -> bool:
    """A real generation on the serving port, whatever strategy serves."""
    out = d.host.run("curl -sf --max-time 20 -H 'Content-Type: application/json' "
                     "-d '{\"text\": \"hello\", \"sampling_params\": {\"max_new_tokens\": 4}}' "
                     "http://127.0.0.1:30001/generate", timeout=60)
    return out.returncode == 0 and "text" in json.loads(out.stdout or "{}")


def running_and_enabled(d, stacks) -> tuple[list[str], list[str]]:
    states = d.sh("for u in " + " ".join(UNIT.format(s) for s in stacks) + "; do "
                  "echo $(systemctl is-active $u) $(systemctl is-enabled $u 2>/dev/null || echo none); done").split("\n")
    active = [s for s, line in zip(stacks, states) if line.split()[0] == "active"]
    enabled = [s for s, line in zip(stacks, states) if line.split()[1:] == ["enabled"]]
    return active, enabled


def no_changes(d, stack: str) -> None:
    """The drift check is clean and `up` changes nothing."""
    d.stack(stack).preview(refresh=True, expect_no_changes=True, diff=True)
    result = d.stack(stack).up(on_output=print)
    changes = {k: v for k, v in (result.summary.resource_changes or {}).items() if k != "same"}
    assert changes == {}, changes


def serving(d, stack: str) -> None:
    """The state a test starts from, made by the test itself: `stack` deployed and serving (a
    no-op `up` when an earlier test of the module left it so), so each test passes alone too."""
    result = d.stack(stack).up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert running_and_enabled(d, [stack])[0] == [stack]


def write_crash_stack(d, name: str = "crash", fault: str = "crash_during_load") -> None:
    """The stack's own serving block (Pulumi would let it replace the project's), with a variable that
    crashes its server while loading, and the default environmentDir: the file it would share."""
    d.write_stack_file(name, {"tpSize": 8, "epSize": 8}, {
        "gpu-serving:serving": {"environment": {**FAST_ENV, "REHEARSAL_FAULT": fault}},
        "gpu-serving:readiness": FAST_READINESS})


def test_adding_and_removing_a_layout_file_never_restarts_the_serving_model(deployment):
    d = deployment
    assert d.stack("tp8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    pid, unit_text = main_pid(d, "tp8"), d.sh(f"cat /etc/systemd/system/{UNIT.format('tp8')}")
    assert "Conflicts=" not in unit_text and "X-GpuServing-Stack=tp8" in unit_text
    d.write_stack_file("tp4pp2", {"tpSize": 4, "ppSize": 2})
    no_changes(d, "tp8")
    assert main_pid(d, "tp8") == pid
    (d.project / "Pulumi.tp4pp2.yaml").unlink()
    no_changes(d, "tp8")
    assert main_pid(d, "tp8") == pid
    assert d.sh(f"cat /etc/systemd/system/{UNIT.format('tp8')}") == unit_text


def systemd_jobs(d, since: float) -> list[tuple[float, str, str]]:
    """(time, start|stop, unit) of systemd's own journal lines about jobs of the strategy units
    since `since`, in order."""
    out = d.sh(f"journalctl _PID=1 --since @{since:.3f} -o json --no-pager")
    events = []
    for line in out.splitlines():
        e = json.loads(line)
        message, when = str(e.get("MESSAGE", "")), int(e["__REALTIME_TIMESTAMP"]) / 1e6
        if e.get("UNIT", "").startswith("sglang-"):
            kind = e.get("JOB_TYPE") or ("stop" if message.startswith("Stopping") else
                                         "start" if message.startswith(("Starting", "Started")) else "")
            if kind:
                events.append((when, kind, e["UNIT"]))
    return events


def test_a_switch_still_stops_the_serving_strategy_and_only_one_is_enabled(deployment):
    d = deployment
    serving(d, "tp8")
    install_command_log(d.host)
    record = HostRecord(d.host)
    since = float(d.sh("date +%s.%N"))
    result = d.stack("ep8").up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert running_and_enabled(d, ["tp8", "ep8"]) == (["ep8"], ["ep8"])
    # The stop of tp8 finished before ep8 started (no crash on a port still held).
    assert d.sh(f"systemctl show -p NRestarts --value {UNIT.format('ep8')}").strip() == "0"
    # Everything that can be staged happened before tp8 stopped: ep8's unit file written, and the
    # command that stops tp8 then starts ep8. From the stop to ep8's start nothing else of ours began on the host (issue 18:
    # the downtime a switch adds).
    jobs = systemd_jobs(d, since)
    stop = min(t for t, what, unit in jobs if what == "stop" and unit == UNIT.format("tp8"))
    start = min(t for t, what, unit in jobs if what == "start" and unit == UNIT.format("ep8"))
    assert stop < start
    commands = [(t, shlex.split(c)) for t, c in record.timed_commands() if t >= since]
    switching = [(t, argv) for t, argv in commands if f"stop:{UNIT.format('tp8')}" in argv]
    assert len(switching) == 1, switching
    began, argv = switching[0]
    # The plan's steps before the start ride in its command: a daemon-reload when systemd's copy of
    # ep8 is stale (here systemd loaded the new file when the switch read it), then the stop.
    steps = [w for w in argv[6:] if w != "</dev/null"]
    assert began < stop and argv[3:6] == ["sh", "start", UNIT.format("ep8")], argv[3:]
    assert steps[-1] == f"stop:{UNIT.format('tp8')}" and set(steps[:-1]) <= {"daemon-reload:"}, steps
    written = float(d.sh(f"stat -c %.9Y /etc/systemd/system/{UNIT.format('ep8')}"))
    assert since < written < began
    between = [" ".join(argv)[:80] for t, argv in commands if stop <= t <= start]
    assert between == [], between


def test_a_failing_stack_sharing_the_environment_file_leaves_the_previous_strategy_serving_its_own_environment(deployment):
    d = deployment
    serving(d, "ep8")
    before = d.sh(f"sha256sum {ENV_FILE}; cat {ENV_FILE}")
    write_crash_stack(d)
    with pytest.raises(auto.CommandError) as info:
        d.stack("crash").up(on_output=print)
    text = str(info.value)
    assert "readiness: crashed_during_load" in text, text[-4000:]
    assert f"Rolled back: restarted {UNIT.format('ep8')}" in text and "generates again" in text
    assert d.sh(f"sha256sum {ENV_FILE}; cat {ENV_FILE}") == before
    assert running_and_enabled(d, ["ep8", "crash"]) == (["ep8"], ["ep8"])
    assert generates(d)
    environ = d.sh(f"tr '\\0' '\\n' < /proc/{main_pid(d, 'ep8')}/environ")
    assert "REHEARSAL_FAULT" not in environ and "NCCL_ALGO=Ring" in environ
    # The serving stack's drift check is clean: nothing of it was changed.
    d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True)


def test_a_switch_whose_new_shared_environment_breaks_loading_puts_the_file_back_byte_for_byte(deployment):
    d = deployment
    serving(d, "ep8")
    project = (d.project / "Pulumi.yaml").read_text()
    before = d.sh(f"sha256sum {ENV_FILE}; stat -c %a {ENV_FILE}")
    pid = main_pid(d, "ep8")
    d.edit_project(lambda c: c["gpu-serving:serving"]["value"]["environment"].update(REHEARSAL_FAULT="crash_during_load"))
    try:
        with pytest.raises(auto.CommandError) as info:
            d.stack("tp8").up(on_output=print)
        text = str(info.value)
        assert "readiness: crashed_during_load" in text, text[-4000:]
        assert f"Rolled back: restarted {UNIT.format('ep8')}" in text and f"Put back as they were: {ENV_FILE}" in text
        assert d.sh(f"sha256sum {ENV_FILE}; stat -c %a {ENV_FILE}") == before
        assert main_pid(d, "ep8") != pid  # restarted, and with the file as it was
        assert running_and_enabled(d, ["tp8", "ep8"]) == (["ep8"], ["ep8"])
        assert generates(d)
    finally:
        (d.project / "Pulumi.yaml").write_text(project)
    d.stack("ep8").preview(refresh=True, expect_no_changes=True, diff=True)


def test_a_rollback_that_cannot_serve_says_nothing_serves(deployment):
    d = deployment
    serving(d, "ep8")
    write_crash_stack(d)
    # The model directory vanished (seen on a fleet host): no strategy can load it any more. The
    # rehearsal host mounts the model read-only; an empty tmpfs over it hides it until unmounted.
    d.sh(f"mount -t tmpfs -o size=1m gone {MODEL}")
    assert d.sh(f"ls -A {MODEL}").strip() == ""
    try:
        with pytest.raises(auto.CommandError) as info:
            d.stack("crash").up(on_output=print)
        text = str(info.value)
        assert "rollback failed: nothing serves on " in text, text[-4000:]
        assert UNIT.format("ep8") in text.split("rollback failed")[1]
        assert "Rolled back" not in text, text[-4000:]
        assert not generates(d)
        # The outputs say so too: the failed start's verdict and the failed rollback, as of this run.
        readiness = d.stack("crash").outputs()["readiness"].value
        assert readiness["status_when_checked"] == "crashed_during_load", readiness
        assert readiness["rollback"].startswith("rollback failed: nothing serves on root@"), readiness
        assert UNIT.format("ep8") in readiness["rollback"], readiness
        assert readiness["checked_by"].startswith("up: the switch started the unit"), readiness
        # The failed switch is tried again by the next up (the model still hidden: the same failure).
        with pytest.raises(auto.CommandError) as again:
            d.stack("crash").up(on_output=print)
        assert "rollback failed: nothing serves on " in str(again.value), str(again.value)[-4000:]
    finally:
        d.sh(f"umount {MODEL}")
    result = d.stack("ep8").up(refresh=True, on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert result.outputs["readiness"].value["rollback"] is None
    assert generates(d)


def ledger(d, *args: str) -> str:
    done = d.components("ledger", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_crashed_stack_is_in_the_ledger_and_the_next_plan_and_preview_warn(deployment):
    """Issue 43: a stack whose server runs out of CUDA memory while loading is rolled back, and its
    failed start is recorded in the failure ledger beside the state (here the file backend's
    folder) with its signature and the error class read from the journal; the next `plan` and
    `preview` of the same start say the same warning before anything loads; the serving strategy
    is untouched by all of it."""
    d = deployment
    serving(d, "ep8")
    ledger(d, "clear", "--stack", "oom")
    write_crash_stack(d, "oom", "oom_during_load")
    pid = main_pid(d, "ep8")
    with pytest.raises(auto.CommandError) as info:
        d.stack("oom").up(on_output=print)
    text = str(info.value)
    assert "readiness: crashed_during_load" in text and f"Rolled back: restarted {UNIT.format('ep8')}" in text, text[-4000:]
    entry, = json.loads(ledger(d, "--stack", "oom", "--json"))
    assert f"Recorded in the failure ledger as entry {entry['id']} (CUDA out of memory while loading the weights)" in text
    assert (entry["stack"], entry["host"], entry["outcome"], entry["error_class"]) == \
        ("oom", d.host.name, "crashed_during_load", "out-of-memory")
    assert entry["journal_line"].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"), entry
    assert entry["layout"] == "tp 8 x pp 1 (ep 8, dp 1)" and entry["model_path"] == MODEL and entry["driver_version"]
    assert entry["gpu_model"].startswith("NVIDIA ") and "rehearsal" in entry["sglang_version"], entry
    assert (d.project / ".." / "state" / "gpu-serving-failures.jsonl").resolve().exists()  # beside the file backend
    listed = ledger(d)
    assert "stack oom on " in listed and "crashed: CUDA out of memory while loading the weights" in listed, listed

    words = (f"this layout with these flags crashed on {d.host.name} on {entry['time'][:10]}: CUDA out of memory while "
             f"loading the weights ({entry['journal_line']}) [ledger entry {entry['id']}: "
             f"`python -m components ledger clear --id {entry['id']}` once it is fixed]")
    planned = d.components("plan", "--stack", "oom")
    assert planned.returncode == 0 and f"warning        {words}" in planned.stdout, planned.stdout[-3000:]
    lines: list[str] = []
    preview = d.stack("oom").preview(on_output=lines.append)
    assert f"switch: warning: {words}" in "\n".join(lines) + preview.stderr, ("\n".join(lines) + preview.stderr)[-4000:]
    assert main_pid(d, "ep8") != pid and generates(d)  # restarted by the rollback, serving as before
    # Cleared once fixed: plan says nothing more.
    assert "cleared 1 ledger entry" in ledger(d, "clear", "--id", entry["id"])
    assert "this layout with these flags" not in d.components("plan", "--stack", "oom").stdout
