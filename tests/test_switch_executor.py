"""ServiceProvider runs exactly the switch plan of components/core/switch.py, in order, and on a
failed start exactly the plan's `on_failure`: every case of tests/data/switch/ goes through the
provider's real switch code over a fake transport (`ssh._run`, `ssh._write_file`) that answers
what the case's host has and records every command. The waiting for readiness (probe.wait_ready,
tested on rehearsal hosts) is the one part replaced. The real hosts: tests/e2e/."""
import contextlib
import json
import shlex

import pytest

from components.core import fitness_read, ledger
from components.core import readiness as R
from components.core import switch
from components.core.specs import ServiceSpec
from components.remote import host_lock, probe, provider_errors, providers, ssh, switch_executor, switch_memory

from .casedata import cases

PLANS = [(n, c) for n, c in cases("switch") if "declared" in c]
STARTS = [(n, c) for n, c in PLANS if c["expect"]["on_failure"]]
REPLACED = "/etc/gpu-serving/shared.env"


class Host:
    """What the case's host answers; `changes`: every command that changes it, as plan steps read."""

    def __init__(self, case: dict, fail: str = "", rollback_fails: bool = False, fitness: str = "@@baseline\n@@end\n",
                 journal: bytes = b"2026-01-01T00:00:00+0000 host python3[77]: CUDA out of memory\n"):
        self.units = case["host"]["units"]
        self.fitness = fitness  # the fitness read's answer (default: a host never benchmarked)
        self.journal = journal
        self.reads: list[str] = []  # the reads of the fitness check and of the failure ledger, in order
        self.holder = case["host"]["port_holder"]
        self.fail = fail  # the unit whose readiness fails
        self.rollback_fails = rollback_fails  # and the unit started again after it fails too
        self.changes: list[str] = []
        # The target unit's own drop-ins (DropInPaths), each with its own text.
        unit = case["declared"]["unit"]
        self.files = {p: f"[Service]\n# {p}\n".encode()
                      for p in switch.own_drop_ins(unit, self.units.get(unit, {}).get("DropInPaths", ""))}

    def read_file(self, t, path):
        return self.files.get(path)

    def stat_mode(self, t, path):
        return 0o644 if path in self.files else None

    def run(self, t, command, input, timeout, purpose):
        argv = shlex.split(command)
        if argv[:2] == ["sh", "-c"] and argv[2] == switch.MANAGED_UNITS_SCRIPT:
            # A unit systemd does not know (no properties) is not among the files found.
            listed = [u for u, props in self.units.items() if props]
            blocks = "\n\n".join("\n".join(f"{k}={v}" for k, v in self.units[u].items()) for u in listed)
            # The port's listener, when the case has one: a process in a login session, none of our units.
            listeners = ('@@listeners\nLISTEN 0 2048 0.0.0.0:30000 0.0.0.0:* users:(("python3",pid=4242,fd=3))\n'
                         "@@cgroup 4242\n0::/user.slice/user-0.slice/session-1.scope\n") if self.holder else "@@listeners\n\n"
            return 0, f"{listeners}@@units\n{chr(10).join(listed)}\n@@show\n{blocks}\n".encode(), b""
        if argv[:2] == ["sh", "-c"] and argv[2] == probe.START_SCRIPT:
            # The steps before the start ride in the start's own round trip, in order.
            verb, unit, *before = argv[4:]
            self.changes += [self.step(w) for w in before] + [f"{verb} {unit}"]
            return 0, (b"1700000000\n@@start\n@@rc=0\n@@unit\nActiveState=activating\nSubState=start\nMainPID=77\n"
                       b"NRestarts=0\nResult=success\nExecMainStatus=0\n"), b""
        if argv[:2] == ["sh", "-c"] and argv[2] == probe.STEPS_SCRIPT:
            unit, *steps = argv[4:]
            self.changes += [self.step(w) for w in steps]
            return 0, f"@@read\nId={unit}\nActiveState=active\nUnitFileState=enabled\n@@cmdline\n\n@@environ\n\n@@manager\n".encode(), b""
        if argv[:2] == ["sh", "-c"] and argv[2] == fitness_read.FITNESS_SCRIPT:
            self.reads.append(f"fitness {argv[4]}")
            return 0, self.fitness.encode(), b""
        if argv[:2] == ["sh", "-c"] and argv[2] == ledger.FAILED_START_SCRIPT:
            self.reads.append(f"failed start {argv[4]}")
            return 0, (b"NVIDIA H200, 580.95.05\nNVIDIA H200, 580.95.05\n@@sglang\n"
                       b"__version__ = \"0.5.23\"\n"), b""
        if argv[0] == "journalctl":
            return 0, self.journal, b""
        if argv[:2] == ["systemctl", "show"]:
            if "ExecStart" in argv and "--value" in argv:
                return 0, b"{ path=/opt/venv/bin/python ; argv[]=python -m sglang.launch_server --host 0.0.0.0 --port 30000 }\n", b""
            unit = argv[-1]
            return 0, f"Id={unit}\nActiveState=active\nUnitFileState=enabled\n".encode(), b""
        if argv[:4] == ["sh", "-c", switch.REMOVE_DROP_INS_SCRIPT, "sh"] and all(p in self.files for p in argv[4:]):
            self.changes.append(" ".join(["remove-drop-ins", *argv[4:]]))
            return 0, b"", b""
        if argv[0] == "systemctl" and argv[1] in ("daemon-reload", "stop", "enable", "disable"):
            self.changes.append(" ".join(a for a in argv[1:] if a != "--quiet"))
            return 0, b"", b""
        raise AssertionError(f"a command the switch does not run: {command}")

    @staticmethod
    def step(word: str) -> str:
        """RUN_STEPS's word ("stop:a,b") as the plan's step reads ("stop a b")."""
        action, _, units = word.partition(":")
        return " ".join([action, *filter(None, units.split(","))])

    def write(self, t, path, content, mode):
        self.changes.append(f"write {path} {content.decode()} {oct(mode)}")

    def wait_ready(self, t, unit, **kwargs):
        # Only the start fails: a rollback to the unit itself (with its files put back) serves again.
        status = R.CRASHED if unit == self.fail or (self.rollback_fails and not self.fail) else R.READY
        self.fail = ""
        return R.Report(status=status, unit=unit, url="http://127.0.0.1:30000", reason="it exited" if status != R.READY else "")


@pytest.fixture
def run_switch(monkeypatch):
    def run(case: dict, fail: str = "", replaced: bool = False, rollback_fails: bool = False, more: dict | None = None,
            host: Host | None = None):
        host = host or Host(case, fail, rollback_fails)
        monkeypatch.setattr(ssh, "_run", host.run)
        monkeypatch.setattr(ssh, "_write_file", host.write)
        monkeypatch.setattr(ssh, "read_file", host.read_file)
        monkeypatch.setattr(ssh, "stat_mode", host.stat_mode)
        monkeypatch.setattr(probe, "wait_ready", host.wait_ready)
        planned = []
        real_plan = switch.plan
        monkeypatch.setattr(switch, "plan", lambda *a, **k: planned.append(real_plan(*a, **k)) or planned[-1])
        d = case["declared"]
        user, _, address = case["host"]["label"].partition("@")
        name, _, port = address.rpartition(":")
        t = ssh.Target(host=name, port=int(port), user=user, private_key="k", host_key="h")
        if replaced:
            switch_memory.remember_replaced(t, REPLACED, b"NCCL_ALGO=Ring\n", 0o640)
        props = {"unit": d["unit"], "port": d["port"], "bind": "0.0.0.0", "declared": {"tp": 8},
                 "active": d["active"], "enabled": d["enabled"], "readiness": {}, "connection": {}, **(more or {})}
        try:
            spec = ServiceSpec.from_props(props)
            outs = switch_executor.Switch(spec, [switch_executor.Node(t, spec)], d["restart"]).switch()
            error = None
        except (provider_errors.DeployError, ssh.RemoteError) as exc:
            outs, error = None, exc
        finally:
            left = switch_memory.take_replaced(t)
        plan, = planned
        run.host = host
        return plan, host.changes, outs, error, left
    return run


@pytest.mark.parametrize("name,case", PLANS, ids=[n for n, _ in PLANS])
def test_the_provider_runs_exactly_the_planned_steps(run_switch, name, case):
    plan, changes, outs, error, left = run_switch(case, replaced=True)
    # The plan the provider made is the one the data case expects (the host answered the case).
    assert plan.as_dict() == case["expect"]
    assert changes == [str(s) for s in plan.steps]
    if plan.refused:
        assert str(error) == plan.refused
        return
    assert error is None
    assert outs["previous"] == plan.previous
    assert (outs["readinessReport"] is not None) == (plan.starts is not None)
    assert left == {}  # a switch that worked forgets the files it would have put back
    # A start that served leaves its check for the readiness resource's refresh in this run.
    kept = switch_memory.checks_kept(plan.unit)
    switch_memory.forget_checks()
    assert kept == ([outs["readinessReport"]] if plan.starts else []), kept


def test_a_failed_start_leaves_no_check_for_the_refresh(run_switch):
    case = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
    switch_memory.forget_checks()
    run_switch(case, fail=case["declared"]["unit"])
    assert switch_memory.checks_kept(case["declared"]["unit"]) == []


@pytest.mark.parametrize("name,case", STARTS, ids=[n for n, _ in STARTS])
def test_a_failed_start_runs_exactly_the_plans_on_failure(run_switch, name, case):
    unit = case["declared"]["unit"]
    plan, changes, outs, error, left = run_switch(case, fail=unit, replaced=True)
    at = plan.steps.index(plan.starts) + 1
    undo = []
    # What the run replaced or removed: the shared file, and the unit's drop-ins it took away.
    replaced = {REPLACED: "NCCL_ALGO=Ring\n 0o640", **{p: f"[Service]\n# {p}\n 0o644" for p in Host(case).files}}
    for step in plan.on_failure:
        # restore-files: each file byte for byte with its mode, then systemd reads them again.
        undo += [f"write {p} {replaced[p]}" for p in sorted(replaced)] + ["daemon-reload"] if step.action == "restore-files" \
            else [str(step)]
    # Nothing of the plan after the start runs (the failed unit is never enabled).
    assert changes == [str(s) for s in plan.steps[:at]] + undo
    assert isinstance(error, providers.DeployError)
    message = str(error)
    assert message.startswith(f"readiness: {R.CRASHED}: it exited")
    assert f"Put back as they were: {', '.join(sorted(replaced))}." in message and "CUDA out of memory" in message
    if plan.rollback_to:
        assert f"Rolled back: restarted {plan.rollback_to}" in message
    else:
        assert f"No strategy was serving before; {unit} was stopped." in message
    assert left == {}


def test_a_failed_start_with_nothing_replaced_writes_nothing(run_switch):
    case = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
    plan, changes, _, error, _ = run_switch(case, fail=case["declared"]["unit"])
    assert changes == ["stop sglang-kimi-k2.6-tp8.service", "start sglang-kimi-k2.6-ep8.service",
                       "stop sglang-kimi-k2.6-ep8.service", "disable sglang-kimi-k2.6-ep8.service",
                       "start sglang-kimi-k2.6-tp8.service"]
    assert "Put back" not in str(error)


def _fake_systemctl(tmp_path, fail: str = ""):
    """A `systemctl` on PATH that records its arguments and fails the `fail` verb (exit 5)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    tool = bin_dir / "systemctl"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" = "{fail}" ] && exit 5\n'
                    'if [ "$1" = show ]; then echo Id=x; echo ActiveState=active; fi\nexit 0\n')
    tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return log, env


@pytest.mark.parametrize("fail", ["", "stop", "daemon-reload"])
def test_the_staged_steps_and_the_stop_run_before_the_start_in_one_command(tmp_path, fail):
    """The real START_SCRIPT through sh: the daemon-reload, then the stop of what serves, then the
    crash-loop reset and the start, in that order, in one command (nothing of ours runs between the
    stop and the start); a step that fails ends it before the start (the old strategy is not
    left stopped by a start that follows a failed step)."""
    import subprocess
    log, env = _fake_systemctl(tmp_path, fail)
    plan = switch.plan("new.service", {"new.service": {}, "old.service": {"ActiveState": "active"}}, restart=False)
    at = plan.steps.index(plan.starts)
    assert [str(s) for s in plan.steps[:at]] == ["daemon-reload", "stop old.service"]
    words = probe.step_words(plan.steps[:at])
    out = subprocess.run(["sh", "-c", probe.START_SCRIPT, "sh", "start", "new.service", *words], env=env,
                         capture_output=True, text=True, check=True).stdout
    calls = [" ".join(w for w in line.split() if not w.startswith("-")) for line in log.read_text().splitlines()]
    run = ["daemon-reload", "stop old.service", "reset-failed new.service", "start new.service"]
    if not fail:
        assert calls[:4] == run and calls[4].startswith("show ")
        return
    upto = run.index(next(r for r in run if r.startswith(fail))) + 1
    assert calls == run[:upto]
    t = ssh.Target(host="h", port=22, user="root", private_key="k", host_key="h")
    with pytest.raises(ssh.RemoteError, match=r"(stopping old.service|systemctl daemon-reload) on root@h:22 failed \(exit 5\)"):
        probe._step_failed(t, out.partition("@@start")[0])


def test_after_the_start_enable_then_disable_then_the_read_in_one_command(tmp_path):
    import subprocess
    log, env = _fake_systemctl(tmp_path)
    steps = [switch.Step("enable", ("new.service",)), switch.Step("disable", ("old.service", "older.service"))]
    out = subprocess.run(["sh", "-c", probe.STEPS_SCRIPT, "sh", "new.service", *probe.step_words(steps)], env=env,
                         capture_output=True, text=True, check=True).stdout
    calls = [" ".join(w for w in line.split() if not w.startswith("-")) for line in log.read_text().splitlines()]
    # One reload for both (each would reload on its own), before the read.
    assert calls[:3] == ["enable new.service", "disable old.service older.service", "daemon-reload"]
    assert calls[3].startswith("show ") and calls[3].endswith("new.service")
    assert "ActiveState=active" in out.partition("@@read\n")[2]


def test_a_rollback_that_fails_too_is_recorded_with_the_unit_as_it_is(run_switch):
    """Issue 12 on the switch path: the start fails, the previous strategy does not come back;
    the provider raises RollbackFailed carrying the outputs (the unit read as it is now, the
    failed start's report with `rollback`) for the service to record."""
    case = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
    unit = case["declared"]["unit"]
    plan, changes, _, error, _ = run_switch(case, fail=unit, rollback_fails=True)
    assert isinstance(error, providers.RollbackFailed), error
    assert str(error).startswith(f"readiness: {R.CRASHED}: it exited")
    report = error.outs["readinessReport"]
    assert report["status"] == R.CRASHED and report["rollback"].startswith(providers.ROLLBACK_FAILED), report
    assert error.outs["previous"] == plan.previous and "runningServer" in error.outs
    assert changes[-1] == f"start {plan.rollback_to}"  # tried, and nothing after it


# --- the token never in a failed switch's message ------------------------------------------------

# An HF token's shape (hf_ and 34 letters and digits), made up; the journal holds it as a server
# that logs its environment, or the hub's refusal quoting it, would leave it there.
TOKEN = "hf_Zq8XvN3kLm2PdR7tYw4BcJ6sHf9GaE5uKo"


class LeakyHost(Host):
    """The case's host, whose journal prints the token (the failed start's and the rollback's)."""

    def run(self, t, command, input, timeout, purpose):
        if shlex.split(command)[0] == "journalctl":
            return 0, f"2026-01-01T00:00:00+0000 host python3[77]: HF_TOKEN={TOKEN} rejected by the hub\n".encode(), b""
        return super().run(t, command, input, timeout, purpose)


@pytest.mark.parametrize("rollback_fails", [False, True], ids=["rolled back", "rollback failed"])
def test_a_failed_switch_through_update_never_carries_the_token(monkeypatch, capsys, rollback_fails):
    """The provider's own path, update() to the error the engine shows: the failed start's journal
    tail, and the rollback's when the previous strategy does not come back, hold the HF token on
    the host; the token (secretEnvironment, the value the unit gets) is in none of the error, the
    outputs recorded for a failed rollback (`switchFailure`, the readiness report with its
    `rollback`), or what the provider printed. Asserted on the value itself, not on a `[secret]`
    being somewhere. (The outputs also carry the props, secretEnvironment among them: the engine
    keeps an output secret whose input was.)"""
    case = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
    d = case["declared"]
    host = LeakyHost(case, fail=d["unit"], rollback_fails=rollback_fails)
    monkeypatch.setattr(ssh, "_run", host.run)
    monkeypatch.setattr(ssh, "_write_file", host.write)
    monkeypatch.setattr(probe, "wait_ready", host.wait_ready)
    # The lock and the pinned connection are a real host's (tests/e2e); here the fake answers alone.
    monkeypatch.setattr(ssh, "one_connection", lambda t, during: contextlib.nullcontext())
    monkeypatch.setattr(host_lock, "acquire", lambda t, wait=0: None)
    news = {"connection": {"host": "10.213.0.2", "port": 22, "user": "root", "privateKey": "k", "hostKey": "h"},
            "unit": d["unit"], "port": d["port"], "bind": "0.0.0.0", "declared": {"tp": 8}, "active": True, "enabled": True,
            "readiness": {}, "configHash": "new", "execStart": "python -m sglang.launch_server", "environment": {},
            "secretEnvironment": {"HF_TOKEN": TOKEN}, "hostEntry": "gpu1"}
    olds = {**news, "configHash": "old"}
    try:
        outs = providers.ServiceProvider().update("id", olds, news).outs
        assert rollback_fails, "a failed start that rolled back must fail the update"
        shown = outs["switchFailure"] + json.dumps(outs["readinessReport"])
        assert outs["readinessReport"]["rollback"].startswith(providers.ROLLBACK_FAILED), outs["readinessReport"]
    except providers.DeployError as exc:
        assert not rollback_fails, exc
        shown = str(exc)
    printed = capsys.readouterr()
    assert TOKEN not in shown and TOKEN not in printed.out + printed.err
    # Not blind: the journal's line is in the message, the token's place taken.
    assert "python3[77]: HF_TOKEN=" in shown and "rejected by the hub" in shown, shown
    switch_memory.take_replaced(ssh.Target.from_props(news))  # this run's memory of replaced files, for the next test
