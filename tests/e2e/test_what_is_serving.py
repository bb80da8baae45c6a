"""Issue 12, point 5 ("nothing says what is serving") and point 9 (preview noise), and the issue's
"Done when" sequence, on one rehearsal host with the real engine: a switch preview says what
serves now and will stop, read from the host; a superseded stack's drift check says superseded,
naming the unit and stack that serve; `python -m components status` is the host's truth; the
readiness output says what checked it; destroying the serving stack says nothing serves."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e.test_layout_files_and_failed_switches import no_changes
from tests.pulumi_env import bin_dir
from tests.e2e.test_running_server_drift import (ENV_FILE, TP8, UNIT_FILE, check_is_clean, drift_text, flag, main_pid,
                                                 running_argv, running_environment)

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

EP8 = "sglang-kimi-k2.6-ep8.service"


def status(d, *args: str) -> subprocess.CompletedProcess:
    return d.components("status", *args, timeout=300)


def switch_block(text: str) -> list[str]:
    """The lines of the switch block in an engine's output (the provider's check prints them to
    its stderr: a preview shows them as the engine's diagnostics, an up inline)."""
    lines = [line for line in text.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if "serves now, since" in line)
    end = start
    while end + 1 < len(lines) and (lines[end + 1].lstrip().startswith(("switch:", "flags", "environment", "--", "(new)"))
                                    or lines[end + 1].startswith("        ") and "->" in lines[end + 1]):
        end += 1
    return lines[start:end + 1]


def test_the_done_when_sequence_on_one_host(deployment):
    d = deployment
    # deploy tp8
    result = d.stack("tp8").up(on_output=print)
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready" and r["checked_by"].startswith("up: the switch started the unit"), r
    pid = main_pid(d, TP8)

    # add and remove a new layout file: tp8's MainPID unchanged, its drift check clean
    d.write_stack_file("tp4pp2", {"tpSize": 4, "ppSize": 2})
    no_changes(d, "tp8")
    (d.project / "Pulumi.tp4pp2.yaml").unlink()
    no_changes(d, "tp8")
    assert main_pid(d, TP8) == pid

    # hand-edit flag + environment + restart: the drift names the running server
    d.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 128/' {UNIT_FILE}; "
         f"sed -i 's/^NCCL_ALGO=Ring$/NCCL_ALGO=Tree/' {ENV_FILE}; systemctl daemon-reload; systemctl restart {TP8}")
    text = drift_text(d, "tp8")
    assert "the running server was started from other settings" in text, text[-4000:]
    assert "--max-running-requests 128 (declared 64)" in text and "NCCL_ALGO=Tree (declared Ring)" in text
    assert "superseded" not in text  # an edit reads as an edit

    # up --refresh: the process runs the declared flags and environment
    d.stack("tp8").up(refresh=True, on_output=print)
    assert flag(running_argv(d, TP8), "--max-running-requests") == "64"
    assert running_environment(d, TP8)["NCCL_ALGO"] == "Ring"

    # kill -9: one up converges, the check is clean
    d.sh(f"kill -9 {main_pid(d, TP8)}")
    assert d.stack("tp8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    check_is_clean(d, "tp8")

    # the switch preview says, from the host, what serves now, that it stops, and what differs
    lines: list[str] = []
    preview = d.stack("ep8").preview(diff=True, on_output=lines.append)
    text = "\n".join(lines) + "\n" + preview.stderr
    block = switch_block(preview.stderr)
    assert len(block) <= 40, block
    joined = "\n".join(block)
    assert f"{TP8} (stack tp8) serves now, since " in joined and "tp 8 x pp 1 (ep 1, dp 1)" in joined, joined
    assert f"it will stop; {EP8} (stack ep8) starts, tp 8 x pp 1 (ep 8, dp 1)" in joined, joined
    assert "--ep-size 1 -> 8" in joined and "environment: identical" in joined, joined
    assert "HF_TOKEN" not in joined

    # switch to ep8: tp8's check says superseded by ep8
    result = d.stack("ep8").up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    text = drift_text(d, "tp8")
    assert f"superseded: {EP8} (stack ep8) serves since " in text, text[-4000:]
    assert "the running server was started from other settings" not in text

    # status names ep8: unit, stack, layout, uptime, readiness now, every stack's files
    done = status(d, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    # The multi-node stack's rehearsal hosts are not booted here: nothing serves there, not an error.
    host, = [h for h in doc["hosts"] if not h.get("down")]
    assert doc["unreachable"] == [] and doc["down"] == [h["host"] for h in doc["hosts"] if h.get("down")]
    assert host["serving"]["unit"] == EP8 and host["serving"]["stack"] == "ep8", host
    assert host["serving"]["layout"]["ep_size"] == 8 and host["serving"]["uptime_seconds"] >= 0
    assert host["readiness"]["status"] == "ready" and host["readiness"]["layout"]["ep_size"] == 8
    stacks = {s["stack"]: s for s in host["stacks"]}
    assert stacks["ep8"]["serving"] and stacks["ep8"]["drift"] == [] and stacks["tp8"]["drift"] == []
    assert stacks["pp8"]["state"] == "not on this host"
    text = status(d).stdout
    assert f"serving   {EP8} (stack ep8), tp 8 x pp 1 (ep 8, dp 1)" in text and "readiness ready" in text, text
    assert len(text.split("\nhost ")[0].splitlines()) <= 25, text


def ep8_serves(d) -> None:
    """The state the later tests start from, made by each (a no-op `up` after the sequence above,
    a deploy when the test runs alone): ep8 deployed, serving and ready."""
    result = d.stack("ep8").up(on_output=print)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert d.sh(f"systemctl is-active {EP8}").strip() == "active"


def test_status_exits_non_zero_when_the_serving_stack_drifted(deployment):
    d = deployment
    ep8_serves(d)
    path = f"/etc/systemd/system/{EP8}"
    original = d.sh(f"cat {path}")
    d.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 96/' {path}")
    try:
        done = status(d, "--stack", "ep8")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "DRIFT: unit file differs" in done.stdout and "--max-running-requests 96" in done.stdout, done.stdout
        assert "drift on the serving stack" in done.stdout
    finally:
        d.sh(f"cat > {path} <<'EOF'\n{original}EOF\nsystemctl daemon-reload")
    assert status(d, "--stack", "ep8").returncode == 0


def test_a_refresh_says_what_checked_the_readiness(deployment):
    d = deployment
    ep8_serves(d)
    result = d.stack("ep8").up(on_output=print)  # refresh: always; nothing restarted
    r = result.outputs["readiness"].value
    assert r["status_when_checked"] == "ready" and r["checked_by"].startswith("refresh"), r
    assert r["checked_at"]


def test_a_switch_preview_of_an_existing_stack_is_short(deployment):
    """Issue 12.9: the same steps on main (8b1d6ee) gave 169 lines and 43 of diagnostics (argv
    one argument a line, every field of the last readiness report as removed, the unchanged unit
    text); now 100: the unit text only for a new unit, execStart on one line, the readiness
    hand-over one opaque value. 102 since `readiness.fitness` joined the readiness settings, which
    the service and the readiness resource both carry (one line each in the diff)."""
    d = deployment
    assert d.stack("tp8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    lines: list[str] = []
    preview = d.stack("ep8").preview(diff=True, on_output=lines.append)
    text = "\n".join(lines)
    print(f"switch preview: {len(lines)} lines of output, {len(preview.stderr.splitlines())} of diagnostics")
    assert "as it will be written" not in text + preview.stderr  # the unit does not change
    assert "[3]: " not in text  # no argv one argument a line
    assert len(lines) <= 105, text
    assert f"{TP8} (stack tp8) serves now" in preview.stderr


def test_a_superseded_stacks_readiness_output_is_a_past_verdict_not_ready_now(deployment):
    """Issue 36.15: after another stack's switch, the stack output of the one it replaced said
    `"status": "ready"` for a server that no longer ran, and scripts read `status`. The record
    keeps its verdict as `status_when_checked` (no `status` key at all), with when and how it was
    taken; the stack's own refresh records what is true then: stopped, superseded by the other."""
    d = deployment
    assert d.stack("tp8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    serving = d.stack("ep8").up(on_output=print).outputs["readiness"].value
    record = d.stack("tp8").outputs()["readiness"].value  # tp8 was ready at its last up, then ep8 took the host
    assert d.sh(f"systemctl is-active {TP8}").strip() != "active"
    assert "status" not in record, record
    assert record["status_when_checked"] == "ready" and record["checked_at"] < serving["checked_at"], (record, serving)
    d.stack("tp8").refresh(on_output=print)  # the program runs with the refresh (scripts/env.sh: PULUMI_RUN_PROGRAM)
    record = d.stack("tp8").outputs()["readiness"].value
    assert record["status_when_checked"] == "stopped" and record["checked_by"].startswith("refresh"), record
    assert record["reason"].startswith(f"superseded: {EP8} (stack ep8) serves since "), record


KV_WARNING = "exceeds the KV pool"


def operator_up(d, stack: str) -> list[str]:
    """`pulumi up --yes --stack STACK` as an operator types it (its preview, then the update),
    every line it printed but the engine's ticker (`@ updating....`, one a few seconds: a count
    of time, not of what was said)."""
    d.stack(stack)  # `pulumi stack select --create`, once
    done = subprocess.run([str(bin_dir(d.env) / "pulumi"), "up", "--yes", "--stack", stack], cwd=d.project, env=d.env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("@ ")]


def said(lines: list[str], words: str) -> int:
    """How many times a message was said: its lines among the run's diagnostics (the engine also
    shows a message's first line inline while it runs; that is not a second saying)."""
    return sum(1 for line in lines if words in line and not line.startswith((" +  pulumi:pulumi:Stack", " ~  pulumi:pulumi:Stack",
                                                                            "    pulumi:pulumi:Stack")))


def test_an_up_says_each_thing_once_and_prints_few_lines(deployment):
    """Issue 36.18: a switch back printed ~260 lines (154 of them the per-GPU `host` output), a first
    `up` 455-571 (the unit text four times), the KV-capacity warning 4-6 times a run, and `preview
    --diff` double-spaced the switch block. Counted here on `pulumi up --yes` as an operator runs
    it (the preview, then the update; the stack's settings warn that the KV pool is short), on
    main at 208a922 in the same runs: 455 (first up), 212 (no-op), 251 (switch back) lines. The
    engine itself prints three lines a resource for each refresh (42 of a no-op)."""
    d = deployment
    for stack in ("ep8", "tp8"):  # ep8 deployed before, tp8 serving
        assert d.stack(stack).up().outputs["readiness"].value["status_when_checked"] == "ready"
    first = operator_up(d, "pp8")  # a first up (new unit) that switches tp8 out
    text = "\n".join(first)
    print(f"first up: {len(first)} lines")
    assert said(first, "ExecStart=") == 1 and said(first, "as it will be written") == 1, text
    assert said(first, KV_WARNING) == 1, text
    assert len(first) <= 230, text
    noop = operator_up(d, "pp8")
    text = "\n".join(noop)
    print(f"no-op up: {len(noop)} lines")
    assert said(noop, KV_WARNING) == 1 and "bus_id" not in text and "[7]: {" not in text, text
    assert len(noop) <= 130, text
    # preview --diff: the switch block as written, not a blank line after each of its lines.
    preview = subprocess.run([str(bin_dir(d.env) / "pulumi"), "preview", "--diff", "--stack", "ep8"], cwd=d.project,
                             env=d.env, capture_output=True, text=True, timeout=900)
    lines = preview.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if "serves now, since" in line)
    assert lines[start + 1].startswith("switch: it will stop;"), preview.stderr
    back = operator_up(d, "ep8")  # a switch back to a stack deployed before
    text = "\n".join(back)
    print(f"switch back: {len(back)} lines")
    assert said(back, "it will stop;") == 1 and said(back, KV_WARNING) == 1, text
    assert len(back) <= 150, text
    assert d.sh(f"systemctl is-active {EP8}").strip() == "active"


def test_destroying_the_serving_stack_says_nothing_serves(deployment):
    d = deployment
    assert d.stack("ep8").up(on_output=print).outputs["readiness"].value["status_when_checked"] == "ready"
    # The preview already says it (a delete hook: Pulumi runs no provider code in a destroy's
    # preview), and only for the stack that serves: tp8 is superseded, its destroy takes nothing.
    warning = "which serves on "
    ahead: list[str] = []
    preview = d.stack("ep8").preview_destroy(on_output=ahead.append)
    said = "\n".join(ahead) + "\n" + preview.stderr
    assert f"destroying stack ep8 stops {EP8}, {warning}" in said and "nothing will serve on " in said, said[-3000:]
    quiet: list[str] = []
    other = d.stack("tp8").preview_destroy(on_output=quiet.append)
    assert warning not in "\n".join(quiet) + other.stderr
    assert d.sh(f"systemctl is-active {EP8}").strip() == "active"  # a preview stops nothing
    lines: list[str] = []
    result = d.stack("ep8").destroy(on_output=lines.append)
    text = "\n".join(lines) + "\n" + result.stderr
    assert f"{EP8} served and is stopped: nothing serves on " in text, text[-3000:]
    done = status(d)
    assert "serving   nothing" in done.stdout, done.stdout
