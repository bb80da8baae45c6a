"""Issue 8, point 1, and issue 13, for real: every case of the bad-input corpus
(tests/data/bad-input/, whatever files it holds) is refused by the real `pulumi preview` (and
one case of each kind by `pulumi up` too) with an error naming the setting, and not one command
and not one login reaches the host; a serving port held by a process that is not ours is
refused at `up` before the serving strategy is stopped.

The corpus runs as one batch (fixture `corpus_through_pulumi`): a few stacks of one project at
once, each rewritten per case, through the pulumi CLI; each case is still asserted on its own
(exit status, message, the commands and logins that fall in its runs).

The rehearsal host of this module records every command its sshd runs (ForceCommand, see
tests/hardening_support.py) and logs every login; the test reads both from outside the
container, so that looking runs nothing there.
"""
from __future__ import annotations

import copy
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from tests import hardening_support as H
from tests.test_bad_input_corpus import corpus

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

TP8 = "sglang-kimi-k2.6-tp8.service"
CASES = dict(corpus())  # every file of tests/data/bad-input/, whatever it holds
# `pulumi up` too for the first case of each kind (the file name's first word: arith, port, ...).
UP_TOO = {min(n for n in CASES if n.split("-", 1)[0] == kind) for kind in {n.split("-", 1)[0] for n in CASES}}
WORKERS = 3  # engine runs at once: each is ~2 s of CPU, mostly Python start-up
# Pulumi's own rule for stack names: a case whose stack name breaks it never reaches the program.
PULUMI_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
PULUMI_STACK_NAME_REFUSAL = "a stack name may only contain alphanumeric, hyphens, underscores, or periods"


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
    states one, and (sections replace whole objects) this module's rehearsal host kept. A config
    that is not a mapping is written as it is (the refusal of that shape is what is tested)."""
    if not isinstance(case["config"], dict):
        return copy.deepcopy(case["config"])
    config = {k if isinstance(k, str) and ":" in k else f"gpu-serving:{k}": copy.deepcopy(v)
              for k, v in case["config"].items()}
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


# ---------------------------------------------------------------------------------------------
# Every corpus case through the real engine, batched


@dataclass
class Run:
    operation: str  # "preview" | "up"
    returncode: int
    output: str
    started: float  # epoch seconds
    ended: float


@dataclass
class Batch:
    runs: dict = field(default_factory=dict)      # case -> [Run]
    stacks: dict = field(default_factory=dict)    # case -> stack name used
    commands: list = field(default_factory=list)  # (when, command) recorded during the batch
    logins: list = field(default_factory=list)    # when, of each login during the batch
    seconds: float = 0.0

    def during(self, runs: list[Run]) -> tuple[list[str], list[float]]:
        """Commands and logins whose time falls in one of these runs (with a margin)."""
        inside = lambda t: any(r.started - 1 <= t <= r.ended + 1 for r in runs)
        return [c for t, c in self.commands if inside(t)], [t for t in self.logins if inside(t)]


def pulumi_cli(d, *args: str) -> subprocess.CompletedProcess:
    binary = Path(d.env["GPU_SERVING_PULUMI_BIN"]) / "pulumi"
    return subprocess.run([str(binary), *args, "--non-interactive", "--color", "never"], cwd=d.project,
                          env=d.env, capture_output=True, text=True, timeout=600)


def salt_of(d, stack: str) -> dict:
    """The stack file's encryptionsalt (written by `stack init`), kept in every rewrite."""
    path = d.project / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else None
    return {"encryptionsalt": doc["encryptionsalt"]} if isinstance(doc, dict) and "encryptionsalt" in doc else {}


def run_case(d, name: str, stack: str, operations: tuple[str, ...]) -> list[Run]:
    """Write the case as Pulumi.<stack>.yaml (the stack's encryptionsalt kept) and run pulumi."""
    path = d.project / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump({"config": stack_file(d, CASES[name]), **salt_of(d, stack)}))
    runs = []
    for operation in operations:
        args = ["preview"] if operation == "preview" else ["up", "--yes", "--skip-preview"]
        started = time.time()
        proc = pulumi_cli(d, *args, "--stack", stack)
        runs.append(Run(operation, proc.returncode, proc.stdout + "\n" + proc.stderr, started, time.time()))
    return runs


def new_stack(d, stack: str) -> None:
    init = pulumi_cli(d, "stack", "init", stack)
    assert init.returncode == 0, init.stderr


@pytest.fixture(scope="module")
def corpus_through_pulumi(deployed) -> Batch:
    """Every corpus case through the real `pulumi preview` against this module's recorded
    rehearsal host, WORKERS at once: one stack per worker, rewritten per case (a preview never
    stores a resource, so a stack carries nothing from one case to the next). Then `pulumi up`
    for one case of each kind, one after the other, each on a new stack of its own (a failed
    `up` may have stored resources; and one at a time, what reaches the host is that case's).
    The host's command log and sshd journal are read once at the end; each command or login is
    put on the case whose run it falls in."""
    d = deployed
    batch = Batch()
    record = H.HostRecord(d.host)
    mark = record.mark()
    logins_before = len(record.timed_logins())
    t0 = time.monotonic()
    shared, named, unnamable = [], [], []
    for name, case in CASES.items():
        stack = case.get("stack") if isinstance(case, dict) else None
        if stack is None:
            shared.append(name)
        elif PULUMI_STACK_NAME.fullmatch(str(stack)):
            named.append(name)
        else:
            unnamable.append(name)
    workers = [f"bad{i}" for i in range(WORKERS)]
    for stack in workers:
        new_stack(d, stack)
    queue = list(shared)
    lock = threading.Lock()

    def worker(stack: str) -> None:
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop(0)
            batch.stacks[name] = stack
            batch.runs[name] = run_case(d, name, stack, ("preview",))

    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(worker, stack) for stack in workers]:
            future.result()
    for i, name in enumerate(sorted(UP_TOO & set(shared))):
        stack = f"up{i}"
        new_stack(d, stack)
        batch.runs[name] += run_case(d, name, stack, ("up",))
    for name in named:
        # A stack of its own name (rare); a project stack's file is put back as it was.
        stack = str(CASES[name]["stack"])
        path = d.project / f"Pulumi.{stack}.yaml"
        original = path.read_text() if path.exists() else None
        try:
            select = pulumi_cli(d, "stack", "select", "--create", stack)
            assert select.returncode == 0, select.stderr
            batch.stacks[name] = stack
            batch.runs[name] = run_case(d, name, stack, ("preview", "up") if name in UP_TOO else ("preview",))
        finally:
            if original is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(original)
    for name in unnamable:
        # Pulumi refuses the stack name itself, before any program or provider runs.
        stack = str(CASES[name]["stack"])
        started = time.time()
        proc = pulumi_cli(d, "preview", "--stack", stack)
        batch.stacks[name] = stack
        batch.runs[name] = [Run("preview", proc.returncode, proc.stdout + "\n" + proc.stderr, started, time.time())]
    for path in d.project.glob("Pulumi.*.yaml"):
        if path.stem.removeprefix("Pulumi.") in workers or re.fullmatch(r"Pulumi\.up\d+", path.stem):
            path.unlink()
    batch.seconds = time.monotonic() - t0
    record.mark()  # let journald write what sshd logged
    batch.commands = record.timed_commands()[mark[0]:]
    batch.logins = record.timed_logins()[logins_before:]
    return batch


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_corpus_case_is_refused_by_pulumi_with_no_command_on_the_host(corpus_through_pulumi, name):
    batch = corpus_through_pulumi
    case = CASES[name]
    runs = batch.runs[name]
    nameable = PULUMI_STACK_NAME.fullmatch(batch.stacks[name])
    assert [r.operation for r in runs] == (["preview", "up"] if name in UP_TOO and nameable else ["preview"])
    for run in runs:
        text = run.output
        assert run.returncode != 0, f"{name}: pulumi {run.operation} exited 0\n{text[-3000:]}"
        if nameable:
            assert case["expect"]["setting"] in text and case["expect"]["contains"] in text, \
                f"{name} ({run.operation}): {text[-3000:]}"
        else:
            assert PULUMI_STACK_NAME_REFUSAL in text, f"{name} ({run.operation}): {text[-3000:]}"
        assert "Traceback" not in text, f"{name} ({run.operation}): {text[-3000:]}"
    for run in runs:
        commands, logins = batch.during([run])
        assert commands == [] and logins == [], \
            f"{name}: pulumi {run.operation} reached the host: {len(logins)} logins, commands {commands}\n{run.output[-2000:]}"
    H.refused(name, through_pulumi=True, operations=tuple(r.operation for r in runs))


def test_the_corpus_batch_ran_nothing_on_the_host(corpus_through_pulumi):
    """The whole batch: every case run, not one command and not one login on the host, whatever
    case it would belong to. (Its wall time is reported in the summary, not asserted: on a
    shared machine it depends on the load; about 2 s of CPU an engine run.)"""
    batch = corpus_through_pulumi
    assert sorted(batch.runs) == sorted(CASES)
    H.corpus_batch(len(batch.runs), sum(len(r) for r in batch.runs.values()), WORKERS, batch.seconds)
    assert batch.commands == [] and batch.logins == [], (batch.commands, batch.logins)


def test_the_recording_is_not_blind(deployed):
    """The same reading of the log and the journal sees one real SSH command and its login."""
    record = H.HostRecord(deployed.host)
    mark = record.mark()
    logins_before = len(record.timed_logins())
    started = time.time()
    deployed.sh("true")
    record.mark()
    commands = [c for t, c in record.timed_commands()[mark[0]:] if t >= started - 1]
    assert commands == ["true"] and len(record.timed_logins()) - logins_before == 1


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
