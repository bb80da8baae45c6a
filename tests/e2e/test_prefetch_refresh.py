"""Batched refresh reads, end to end: the real engine (`PULUMI_RUN_PROGRAM` refresh, as
scripts/env.sh sets it) and a real host whose sshd records every session it runs.

A no-drift refresh makes each read once: host facts, CUDA, venv, the environment and unit files
(content and mode in one SFTP session each: they were prefetched together), the service and
readiness: 7 sessions over 1 connection, where reading them one resource after the other took 9.
A hand edit made just before the refresh is still seen (drift, then repaired)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from pulumi import automation as auto

from tests import hardening_support as H

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

ENV_FILE = "/etc/gpu-serving/kimi-k2.6.env"


def _sessions(commands: list[str]) -> tuple[int, int]:
    """(sessions, of which SFTP)."""
    return len(commands), sum("sftp" in c for c in commands)


def test_a_refresh_reads_each_thing_once_over_one_connection(deployment):
    d = deployment
    d.stack("tp8").up(on_output=print)
    # A second `up`: its same step writes this run's prefetch list into the state's inputs,
    # which the next refresh's host-facts read takes (a first deploy stores it too).
    d.stack("tp8").up(on_output=print)
    H.install_command_log(d.host)
    record = H.HostRecord(d.host)
    for op in ("preview", "up"):
        mark = record.mark()
        if op == "preview":
            d.stack("tp8").preview(refresh=True, expect_no_changes=True)
        else:
            result = d.stack("tp8").up(refresh=True)
            assert set(result.summary.resource_changes or {}) <= {"same"}, result.summary.resource_changes
        commands, logins = record.since(mark)
        assert logins == 1, (op, logins)
        assert _sessions(commands) == (7, 2), (op, commands)


def _cli(d, *args: str) -> subprocess.CompletedProcess:
    """The `pulumi` CLI as an operator runs it (Automation's `up` skips the preview)."""
    exe = shutil.which("pulumi", path=d.env["PATH"])
    return subprocess.run([exe, *args], cwd=d.project, env=d.env, capture_output=True, text=True, timeout=600)


def _handoff_files() -> list[str]:
    base = os.environ.get("GPU_SERVING_HANDOFF_DIR") or f"/tmp/gpu-serving-handoff-{os.getuid()}"
    return [n for n in os.listdir(base) if n.startswith("reads-")] if os.path.isdir(base) else []


def test_pulumi_up_reads_the_host_once_its_update_starting_from_the_preview(deployment):
    # components/remote/handoff.py: the update of `pulumi up --yes` is served the reads its
    # preview was served, so the whole command is one connection and one set of sessions, as a
    # preview alone (it was 2 logins and 14 sessions); and it leaves no handoff file behind.
    d = deployment
    d.stack("tp8").up(on_output=print)
    H.install_command_log(d.host)
    record = H.HostRecord(d.host)
    before = set(_handoff_files())
    mark = record.mark()
    out = _cli(d, "up", "--stack", "tp8", "--yes")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "unchanged" in out.stdout and "updated" not in out.stdout, out.stdout[-3000:]
    commands, logins = record.since(mark)
    assert logins == 1, logins
    assert _sessions(commands) == (7, 2), commands
    assert set(_handoff_files()) <= before
    # A preview alone keeps nothing for anyone: it is not an `up`.
    out = _cli(d, "preview", "--stack", "tp8", "--refresh", "--expect-no-changes")
    assert out.returncode == 0, out.stdout[-3000:]
    assert set(_handoff_files()) <= before


def test_pulumi_up_repairs_a_hand_edit_and_reads_again_after_its_own_change(deployment):
    # The preview saw the edit, and the update acts on what it saw; once the update has written
    # the file it reads the host again (a change drops what was handed over): the service is
    # checked against the repaired file, and the next drift check is clean.
    d = deployment
    d.stack("tp8").up(on_output=print)
    original = d.sh(f"cat {ENV_FILE}")
    d.sh(f"sed -i 's/NCCL_ALGO=Ring/NCCL_ALGO=Tree/' {ENV_FILE}")
    H.install_command_log(d.host)
    record = H.HostRecord(d.host)
    mark = record.mark()
    out = _cli(d, "up", "--stack", "tp8", "--yes", "--diff")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "NCCL_ALGO" in out.stdout, out.stdout[-3000:]
    commands, logins = record.since(mark)
    # The preview's connection, then the update's for the write and what follows it.
    assert logins == 2, logins
    assert d.sh(f"cat {ENV_FILE}") == original
    assert _cli(d, "preview", "--stack", "tp8", "--refresh", "--expect-no-changes").returncode == 0


def test_pulumi_up_switches_and_back_through_the_cli_with_its_reads_handed_over(deployment):
    # The operator's switch, as typed: `pulumi up --yes` to ep8 (its preview's reads handed to the
    # update; the switch itself under the host lock, on the update's own connection), the
    # server really in the new layout, a clean drift check, then back to tp8 the same way.
    import json

    d = deployment
    d.stack("tp8").up(on_output=print)
    for stack, other, ep in (("ep8", "tp8", 8), ("tp8", "ep8", 1)):
        d.stack(stack)  # the stack exists (created here the first time, as `pulumi stack init` would)
        out = _cli(d, "up", "--stack", stack, "--yes")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        r = json.loads(_cli(d, "stack", "output", "readiness", "--stack", stack, "--json").stdout)
        assert r["status_when_checked"] == "ready" and r["layout"]["tp_size"] == 8 and r["layout"]["ep_size"] == ep, r
        assert d.sh(f"systemctl is-active sglang-kimi-k2.6-{stack}.service").strip() == "active"
        assert d.sh(f"systemctl is-active sglang-kimi-k2.6-{other}.service").strip() == "inactive"
        check = _cli(d, "preview", "--stack", stack, "--refresh", "--expect-no-changes")
        assert check.returncode == 0, check.stdout[-3000:]


def test_a_hand_edit_just_before_the_refresh_is_drift(deployment):
    d = deployment
    original = d.sh(f"cat {ENV_FILE}")
    d.sh(f"sed -i 's/NCCL_ALGO=Ring/NCCL_ALGO=Tree/' {ENV_FILE}")
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as info:
        d.stack("tp8").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    text = "\n".join(lines) + str(info.value)
    assert "environment-file" in text and "NCCL_ALGO" in text, text[-3000:]
    d.stack("tp8").up(refresh=True, on_output=print)
    assert d.sh(f"cat {ENV_FILE}") == original
    d.stack("tp8").preview(refresh=True, expect_no_changes=True)


def test_the_provider_process_starts_while_the_program_loads(deployment):
    # components/provider_start.py: the engine launches the dynamic provider on the program's first
    # call, made before its imports, instead of on the first resource, which the SDK sends only
    # after the program's body has run. Read from the engine's own log of a real drift check:
    # one provider process, launched before the program's body ended, and nothing about the call
    # on the user's screen.
    d = deployment
    d.stack("tp8").up(on_output=print)
    shown: list[str] = []
    # The SDK's debug line "Waiting for outstanding RPCs to complete" marks the body's end: the
    # program makes its debug lines only when asked (components/pulumi_sdk.py).
    result = d.stack("tp8", {"GPU_SERVING_SDK_DEBUG": "1"}).preview(
        refresh=True, expect_no_changes=True, log_verbosity=9, log_to_std_err=True, log_flow=True,
        on_output=shown.append)
    log = result.stderr.splitlines()
    launches = [i for i, line in enumerate(log) if "Launching plugin 'pulumi-python (resource)'" in line]
    body_done = [i for i, line in enumerate(log) if "Waiting for outstanding RPCs to complete" in line]
    first_read = [i for i, line in enumerate(log) if "].Read(" in line]
    assert len(launches) == 1, launches
    assert body_done and first_read, (body_done, first_read)
    assert launches[0] < body_done[0] < first_read[0], (launches, body_done, first_read)
    text = "\n".join(shown)
    assert "startProvider" not in text and "not implemented" not in text.lower(), text[-2000:]


def test_the_provider_is_told_the_machine_before_the_engine_reads_it(deployment):
    # components/provider_start.py + remote/ahead.py, through the real engine: the program's last
    # step names the machine, the provider answers that call (ours: not "not implemented") before
    # the engine sends its first Read, and the refresh still makes each read once over one
    # connection (no read made twice, whichever of the two started it).
    from bench import trace

    d = deployment
    d.stack("tp8").up(on_output=print)
    H.install_command_log(d.host)
    record = H.HostRecord(d.host)
    mark = record.mark()
    result = d.stack("tp8").preview(refresh=True, expect_no_changes=True, log_verbosity=9, log_to_std_err=True,
                                    log_flow=True)
    events = trace.events(result.stderr.splitlines())
    first_read = min(i for i, (_, msg) in enumerate(events) if trace._READ.match(msg))
    answered = [(i, msg.split(") ", 1)[1].split(" ")[0]) for i, (_, msg) in enumerate(events)
                if msg.startswith("Provider[") and ".Invoke(pulumi-python:dynamic:readAhead)" in msg]
    assert [what for _, what in answered] == ["executing", "success"], answered
    assert answered[-1][0] < first_read, (answered, first_read)
    commands, logins = record.since(mark)
    assert logins == 1 and _sessions(commands) == (7, 2), (logins, commands)


def test_reads_started_ahead_serve_the_engines_reads(deployment):
    # The provider process alone (the launcher the engine runs), told a machine as the program
    # tells it: it connects and runs the host-facts read and the six later reads by itself; the
    # host-facts Read that follows is served from them: no second connection, no new session.
    import asyncio
    import json
    import time

    from google.protobuf import struct_pb2
    from pulumi.dynamic.dynamic import serialize_provider
    from pulumi.runtime import rpc
    from pulumi.runtime.proto import provider_pb2

    from components.core.plan import plan_stack
    from components.core.reads import refresh_reads
    from components.remote.ahead import READ_AHEAD
    from components.remote.providers import HostFactsProvider
    from tests.pulumi_env import REPO, provider_process

    d = deployment
    d.stack("tp8").up(on_output=print)
    H.install_command_log(d.host)
    record = H.HostRecord(d.host)
    plan = plan_stack(d.project, "tp8")
    h = d.host
    connection = {"host": h.address, "port": h.port, "user": h.user, "privateKey": open(h.private_key).read(),
                  "hostKey": h.host_public_key, "rehearsal": h.name, "entry": "gpu-serving:host"}
    props = {"connection": connection, "cudaHome": plan.settings.cuda.home, "prefetch": refresh_reads(plan)}
    mark = record.mark()
    with provider_process(REPO) as stub:
        args = struct_pb2.Struct()
        args.update({"hosts": json.dumps([props])})
        stub.Invoke(provider_pb2.InvokeRequest(tok=READ_AHEAD, args=args), timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _sessions(record.since(mark)[0])[0] < 7:
            time.sleep(0.2)
        ahead, logins = record.since(mark)
        assert logins == 1 and _sessions(ahead) == (7, 2), (logins, ahead)
        assert any("nvidia-smi" in c for c in ahead), ahead  # the host-facts read is among them

        served = record.mark()
        # A loop of its own, never made the thread's current one (asyncio.run would leave the
        # main thread without one, and the SDK's mocks in later tests of the same run need it).
        loop = asyncio.new_event_loop()
        try:
            state = loop.run_until_complete(rpc.serialize_properties(
                {"__provider": serialize_provider(HostFactsProvider()), **props, "expect": {"neededGpus": 0}}, {}))
        finally:
            loop.close()
        answer = stub.Read(provider_pb2.ReadRequest(
            id=f"{h.address}:22", urn="urn:pulumi:tp8::gpu-serving::gpu-serving:index:GpuHost$"
            "pulumi-python:dynamic/gpu-serving:HostFacts::host-facts", properties=state), timeout=60)
        facts = rpc.deserialize_properties(answer.properties)["facts"]
        assert facts["gpu_count"] == 8, facts
        assert record.since(served) == ([], 0)  # served from what was read ahead
