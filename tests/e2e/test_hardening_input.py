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
import json
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from components.core.pulumi_yaml import dump
from tests import hardening_support as H
from tests import corpus_support as CS

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

TP8 = "sglang-kimi-k2.6-tp8.service"
# Every invalid case of tests/data/bad-input/, whatever it holds (the `accept: true` ones are
# ordinary settings a check once refused: a preview of them would read the host, as it should).
# `planOnly` cases are resolved by Pulumi itself before any program runs (the case says how).
CASES = {n: c for n, c in CS.refused_cases() if not c.get("planOnly")}
# `pulumi up` too for the first case of each kind (the file name's first word: arith, port, ...).
UP_TOO = {min(n for n in CASES if n.split("-", 1)[0] == kind) for kind in {n.split("-", 1)[0] for n in CASES}}
WORKERS = 3  # engine runs at once: each is ~2 s of CPU, mostly Python start-up
# Pulumi's own rule for stack names: a case whose stack name breaks it never reaches the program.
PULUMI_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
# Pulumi refuses some shapes itself, before any program or provider runs: a stack file it cannot
# read (not YAML, not a mapping, a key without a namespace, alias expansion), a value it cannot
# decrypt, a declared secret in clear, a bad stack name.
PULUMI_OWN_REFUSALS = ("error: getting stack configuration:", "error: validating stack config:",
                       "a stack name may only contain alphanumeric, hyphens, underscores, or periods")
PROGRAM_RAN = "Previewing update ("  # ... or "Updating (": the engine started the program
NS = "gpu-serving"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    H.install_command_log(host)
    d = make_deployment(tmp_path_factory.mktemp("hardening-input"), host)
    result = d.stack("tp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    return d


def stack_file(d, case: dict) -> dict:
    """The corpus case's `config` as a stack file's config (tests/corpus_support.py): its sections
    under the namespace, tp8's layout unless it states one, and (sections replace whole objects)
    this module's rehearsal host kept."""
    config = {f"{NS}:{k}": copy.deepcopy(v) for k, v in (case.get("config") or {}).items()}
    config.setdefault(f"{NS}:strategy", {"tpSize": 8})
    host = config.get(f"{NS}:host")
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

    @property
    def program_ran(self) -> bool:
        return PROGRAM_RAN in self.output or "Updating (" in self.output


@dataclass
class Batch:
    runs: dict = field(default_factory=dict)      # case -> [Run]
    commands: list = field(default_factory=list)  # (when, command) recorded during the batch
    logins: list = field(default_factory=list)    # when, of each login during the batch
    seconds: float = 0.0

    def during(self, runs: list[Run]) -> tuple[list[str], list[float]]:
        """Commands and logins whose time falls in one of these runs (with a margin)."""
        def inside(t: float) -> bool:
            return any(r.started - 1 <= t <= r.ended + 1 for r in runs)
        return [c for t, c in self.commands if inside(t)], [t for t in self.logins if inside(t)]


class Place:
    """A copy of the deployment's project with a file backend of its own: the corpus cases that
    run there can all use their own stack names (most say "bad") without meeting another place's.
    A preview stores no resource, so a stack carries nothing from one case to the next."""

    def __init__(self, d, root: Path):
        self.d = d
        self.project = root / "project"
        shutil.copytree(d.project, self.project, symlinks=True,
                        ignore=shutil.ignore_patterns("Pulumi.bad*.yaml", "Pulumi.alt.yaml"))
        (root / "state").mkdir()
        self.env = {**d.env, "PULUMI_BACKEND_URL": f"file://{root / 'state'}"}
        self.project_text = (self.project / "Pulumi.yaml").read_text()
        self.own_stacks = {p.name for p in self.project.glob("Pulumi.*.yaml")}
        self.salts: dict[str, dict] = {}

    def pulumi(self, *args: str) -> subprocess.CompletedProcess:
        binary = Path(self.env["GPU_SERVING_PULUMI_BIN"]) / "pulumi"
        end = args.index("--") if "--" in args else len(args)  # flags before a `--` value
        args = (*args[:end], "--non-interactive", "--color", "never", *args[end:])
        return subprocess.run([str(binary), *args], cwd=self.project,
                              env=self.env, capture_output=True, text=True, timeout=600)

    def stack(self, stack: str) -> None:
        """Create the stack once; keep the salt `stack init` writes for every rewrite."""
        if stack not in self.salts:
            init = self.pulumi("stack", "init", stack)
            assert init.returncode == 0, init.stderr
            doc = yaml.safe_load((self.project / f"Pulumi.{stack}.yaml").read_text())
            self.salts[stack] = {"encryptionsalt": doc["encryptionsalt"]} if isinstance(doc, dict) and "encryptionsalt" in doc else {}

    def write(self, name: str) -> str:
        """The case's files (tests/corpus_support.py's format): its stack file (`config` or the
        whole `stackFile`), `projectConfig` added to Pulumi.yaml, `otherStacks`, and `secrets`
        set with `pulumi config set --secret`. Returns the stack name."""
        case = CASES[name]
        stack = str(case.get("stack", "bad"))
        doc = CS.load(self.project_text)
        doc["config"].update(copy.deepcopy(case.get("projectConfig") or {}))
        (self.project / "Pulumi.yaml").write_text(dump(doc))
        for path in self.project.glob("Pulumi.*.yaml"):
            if path.name not in self.own_stacks:
                path.unlink()
        for other, text in (case.get("otherStacks") or {}).items():
            (self.project / f"Pulumi.{other}.yaml").write_text(text)
        if not PULUMI_STACK_NAME.fullmatch(stack):
            return stack  # Pulumi refuses the name: there is no stack to write
        self.stack(stack)
        path = self.project / f"Pulumi.{stack}.yaml"
        if "stackFile" in case:
            path.write_text(case["stackFile"])
            return stack
        config = stack_file(self.d, case)
        secrets = {key: config.pop(f"{NS}:{key}") for key in case.get("secrets") or () if f"{NS}:{key}" in config}
        path.write_text(dump({"config": config, **self.salts[stack]}))
        for key, value in secrets.items():
            text = value if isinstance(value, str) else json.dumps(value)
            done = self.pulumi("config", "set", "--secret", "--stack", stack, f"{NS}:{key}", "--", text)
            assert done.returncode == 0, done.stderr
        return stack

    def run(self, name: str, operation: str) -> Run:
        stack = self.write(name)
        args = ["preview"] if operation == "preview" else ["up", "--yes", "--skip-preview"]
        started = time.time()
        proc = self.pulumi(*args, "--stack", stack)
        return Run(operation, proc.returncode, proc.stdout + "\n" + proc.stderr, started, time.time())


@pytest.fixture(scope="module")
def corpus_through_pulumi(deployed, tmp_path_factory) -> Batch:
    """Every corpus case through the real `pulumi preview` against this module's recorded
    rehearsal host, WORKERS at once, each worker in a place of its own (`Place`). Then `pulumi up`
    for one case of each kind, one after the other, each in a new place (a failed `up` may have
    stored resources; and one at a time, what reaches the host is that case's). The host's
    command log and sshd journal are read once at the end; each command or login is put on the
    case whose run it falls in."""
    d = deployed
    base = tmp_path_factory.mktemp("corpus")
    batch = Batch()
    record = H.HostRecord(d.host)
    mark = record.mark()
    logins_before = len(record.timed_logins())
    t0 = time.monotonic()
    queue = sorted(CASES)
    lock = threading.Lock()

    def worker(i: int) -> None:
        place = Place(d, base / f"w{i}")
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop(0)
            batch.runs[name] = [place.run(name, "preview")]

    with ThreadPoolExecutor(WORKERS) as pool:
        for future in [pool.submit(worker, i) for i in range(WORKERS)]:
            future.result()
    for i, name in enumerate(sorted(UP_TOO)):
        batch.runs[name].append(Place(d, base / f"up{i}").run(name, "up"))
    batch.seconds = time.monotonic() - t0
    record.mark()  # let journald write what sshd logged
    batch.commands = record.timed_commands()[mark[0]:]
    batch.logins = record.timed_logins()[logins_before:]
    return batch


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_corpus_case_is_refused_by_pulumi_with_no_command_on_the_host(corpus_through_pulumi, name):
    """Refused, naming the setting (the program's own check), or by Pulumi itself before the
    program runs (a stack file it cannot read, a stack name it does not allow); never a traceback;
    not one command and not one login on the host during the run."""
    batch = corpus_through_pulumi
    case = CASES[name]
    runs = batch.runs[name]
    assert [r.operation for r in runs] == (["preview", "up"] if name in UP_TOO else ["preview"])
    how = []
    for run in runs:
        text = run.output
        assert run.returncode != 0, f"{name}: pulumi {run.operation} exited 0\n{text[-3000:]}"
        if run.program_ran:
            assert case["expect"]["setting"] in text and case["expect"]["contains"] in text, \
                f"{name} ({run.operation}): expected {case['expect']}\n{text[-3000:]}"
            how.append(run.operation)
        else:
            assert any(r in text for r in PULUMI_OWN_REFUSALS), f"{name} ({run.operation}): {text[-3000:]}"
            how.append("Pulumi's own check")
        assert "Traceback" not in text, f"{name} ({run.operation}): {text[-3000:]}"
        commands, logins = batch.during([run])
        assert commands == [] and logins == [], \
            f"{name}: pulumi {run.operation} reached the host: {len(logins)} logins, commands {commands}\n{text[-2000:]}"
    H.refused(name, through_pulumi=True, operations=tuple(how))


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


def test_deepep_on_a_pcie_host_is_refused_by_preview_and_up_before_the_host_is_touched(deployed):
    """Issue 36.1: `{tpSize: 8, epSize: 8, moeA2aBackend: deepep}` on the default (PCIe) host was
    accepted by preview and deployed "ready" by up on the rehearsal host; on a real box it stops
    the serving strategy, loads for minutes and fails. Now both refuse it, naming the rule advise
    names, with no command on the host and tp8 still serving (corpus case arith-deepep-on-a-pcie-host
    runs in the batch too; the rehearsal engine's own failure: tests/standins)."""
    d = deployed
    path = d.project / "Pulumi.ep8.yaml"
    original = path.read_text()
    path.write_text(dump({"config": {"gpu-serving:strategy": {"tpSize": 8, "epSize": 8, "moeA2aBackend": "deepep"}}}))
    before = host_state(d)
    record = H.HostRecord(d.host)
    mark = record.mark()
    try:
        for op in (d.stack("ep8").preview, d.stack("ep8").up):
            text = failing(op)
            assert "gpu-serving:strategy.moeA2aBackend: the deepep all-to-all needs NVLink between GPUs" in text, text[-3000:]
            assert "Traceback" not in text
        commands, logins = record.since(mark)
        assert commands == [] and logins == 0, (commands, logins)
        assert host_state(d) == before
    finally:
        path.write_text(original)
    H.refused("deepep-on-a-pcie-host", through_pulumi=True)


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
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    states = d.sh(f"systemctl is-active {TP8} sglang-kimi-k2.6-alt.service; "
                  f"systemctl is-enabled {TP8} sglang-kimi-k2.6-alt.service").split()
    assert states == ["inactive", "active", "disabled", "enabled"], states
    H.fault_survived("a foreign process on the serving port")
