"""When the CLI dies mid-run, nothing of its run is left behind.

`pulumi preview --stack tp8 --diff | head -3` kills the CLI with SIGPIPE at its fourth line, and a
kill -9 of the CLI (a timeout, an impatient scheduler) ends it just as abruptly: neither closes
its plugins. The language host, the program it runs and the dynamic-provider process must then
end by themselves (scripts/pulumi-build/language-python: the host watches its parent, the
runner waits on a pidfd of its own), instead of waiting for ever, parented to init.

The real CLI, our language host and the launcher, on a stack whose dynamic provider's `check`
of one resource blocks: the run is stopped while the program waits for that resource and the
provider is in the call. Every process of a run carries a unique environment marker
(GS_ENGINE_GONE_RUN), which is how the test finds them, and the only processes it ever signals.
Needs the cached engine (scripts/bootstrap-pulumi). Marked `engine`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.pulumi_env import EngineMissing, engine_env, require_engine
from tests.integration.test_engine import write_project

pytestmark = pytest.mark.engine

MARKER = "GS_ENGINE_GONE_RUN"

PROGRAM = """\
    import os
    import time
    from pathlib import Path

    import pulumi.dynamic as dyn

    class Blocking(dyn.ResourceProvider):
        def check(self, olds, news):
            if news.get("block"):
                Path(os.environ["GS_ENGINE_GONE_STARTED"]).write_text("in the provider's check")
                time.sleep(600)
            return dyn.CheckResult(news, [])

        def create(self, props):
            return dyn.CreateResult(id_="x", outs=props)

    class Item(dyn.Resource):
        def __init__(self, name, block):
            super().__init__(Blocking(), name, {"block": block})

    # Enough quick ones that `--diff` prints well past three lines before the blocking one.
    for i in range(6):
        Item(f"quick{i}", False)
    Item("blocking", True)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(env, project dir): a one-stack project on a temporary backend."""
    base = tmp_path_factory.mktemp("engine-gone")
    (base / "state").mkdir()
    env = engine_env(pulumi_home=base / "pulumi-home", backend_url=f"file://{base / 'state'}")
    try:
        require_engine(env)
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    project = write_project(base / "project", "engine-gone", textwrap.dedent(PROGRAM))
    subprocess.run([pulumi(env), "stack", "init", "dev", "--non-interactive"], cwd=project, env=env, check=True,
                   capture_output=True, timeout=120)
    return env, project


def pulumi(env: dict) -> str:
    return str(Path(env["GPU_SERVING_PULUMI_BIN"]) / "pulumi")


def processes_of(run: str) -> dict[int, str]:
    """PID -> role of every process that carries this run's marker."""
    needle = f"{MARKER}={run}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie has ended; only its reaping is pending
            found[int(entry.name)] = role(argv)
    return found


def role(argv: list[str]) -> str:
    if any(Path(a).name == "pulumi-language-python" for a in argv[:1]):
        return "language host"
    if "pulumi.dynamic" in argv:
        return "dynamic provider"
    if "--script" in argv or any(a.endswith("pulumi-language-python-exec") for a in argv):
        return "program"
    if Path(argv[0]).name == "pulumi":
        return "cli"
    return " ".join(argv)[:120]


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}", pytrace=False)


def left_after(run: str, seconds: float) -> dict[int, str]:
    """What of the run is still there after `seconds` (at once when nothing is)."""
    deadline = time.monotonic() + seconds
    while True:
        left = processes_of(run)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def clean_up(run: str) -> None:
    for pid in processes_of(run):  # only processes carrying this run's marker
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_env(env: dict, tmp_path: Path) -> tuple[dict, str, Path]:
    run = uuid.uuid4().hex
    started = tmp_path / "blocking-check-started"
    return {**env, MARKER: run, "GS_ENGINE_GONE_STARTED": str(started)}, run, started


def test_cli_killed_mid_run_leaves_nothing(stack, tmp_path):
    env, project = stack
    env, run, started = run_env(env, tmp_path)
    cli = subprocess.Popen([pulumi(env), "preview", "--stack", "dev", "--non-interactive"], cwd=project, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(started.exists, 120, "the provider's blocking check")
        roles = set(processes_of(run).values())
        assert {"cli", "language host", "program", "dynamic provider"} <= roles, roles
        cli.kill()  # SIGKILL: the CLI closes nothing
        cli.wait(timeout=10)
        left = left_after(run, 5)
        assert not left, f"left running after the CLI was killed: {left}"
    finally:
        if cli.poll() is None:
            cli.kill()
        clean_up(run)


def test_cli_ended_by_a_closed_pipe_leaves_nothing(stack, tmp_path):
    """`pulumi preview --diff | head -3`, as a shell runs it."""
    env, project = stack
    env, run, started = run_env(env, tmp_path)
    shell = subprocess.Popen(["bash", "-c", f'"{pulumi(env)}" preview --stack dev --diff --non-interactive | head -3'],
                             cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen: set[str] = set()
    try:
        # The pipeline ends when the CLI does: at its first write after head has gone.
        while shell.poll() is None:
            seen |= set(processes_of(run).values())
            time.sleep(0.05)
        assert len(shell.stdout.read().splitlines()) == 3
        assert {"language host", "dynamic provider"} <= seen, seen  # the run was under way
        left = left_after(run, 5)
        assert not left, f"left running after the CLI died of a closed pipe: {left}"
    finally:
        if shell.poll() is None:
            shell.kill()
        clean_up(run)
