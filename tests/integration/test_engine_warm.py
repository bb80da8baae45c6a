"""Warm start through the real engine: with `runtime.options.warmStart` in Pulumi.yaml, our
language host runs the program, and the engine's launcher the dynamic provider, in forks of the
project's warm process; the first run (none yet) is cold and starts it; GPU_SERVING_WARM_START=0
keeps every run cold; a CLI killed mid-run leaves no fork behind.

Each process says where it ran: "warm" when the warm module is loaded and was loaded by its parent
process (the warm process it was forked from), else "cold". The program says it as a stack output,
the provider in its resource's outputs (its update runs on every `up`). The real CLI, our language
host and the launcher; the runner is the cached engine's (scripts/bootstrap-pulumi). Marked `engine`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.test_engine_gone import pulumi, wait_for
from tests.pulumi_env import REPO, EngineMissing, engine_env, require_engine
from tests.warm_support import children_of, warm_processes

pytestmark = pytest.mark.engine

WARM_MODULE = """\
import os

import pulumi  # noqa: F401
import pulumi.dynamic  # noqa: F401

LOADED_IN = os.getpid()
"""

PROGRAM = """\
import os
import sys
import time
import uuid
from pathlib import Path

import pulumi
import pulumi.dynamic as dyn


def where():
    warm = sys.modules.get("warmprog")
    if warm is None or warm.LOADED_IN != os.getppid():
        return "cold"
    return "warm, edited" if getattr(warm, "EDITED", False) else "warm"


class Where(dyn.ResourceProvider):
    def check(self, olds, news):
        if news.get("block"):
            Path(os.environ["GS_WARM_STARTED"]).write_text("in the provider's check")
            time.sleep(600)
        return dyn.CheckResult(news, [])

    def create(self, props):
        return dyn.CreateResult(id_="x", outs={**props, "provider": where()})

    def diff(self, id, olds, news):
        return dyn.DiffResult(changes=olds.get("run") != news.get("run"))

    def update(self, id, olds, news):
        return dyn.UpdateResult(outs={**news, "provider": where()})


class Item(dyn.Resource):
    def __init__(self, name, props):
        super().__init__(Where(), name, props)


r = Item("where", {"run": uuid.uuid4().hex, "block": os.environ.get("GS_WARM_BLOCK") == "1", "provider": None})
pulumi.export("program", where())
pulumi.export("provider", r.provider)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(env, project dir, socket dir): a one-stack project with warmStart, its own warm processes."""
    base = tmp_path_factory.mktemp("engine-warm")
    (base / "state").mkdir()
    sockets = Path(f"/tmp/gsw-ew{os.getpid()}")
    env = engine_env(pulumi_home=base / "pulumi-home", backend_url=f"file://{base / 'state'}")
    env.update(GPU_SERVING_WARM_DIR=str(sockets))
    env.pop("GPU_SERVING_WARM_START", None)
    try:
        require_engine(env)
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    project = base / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: engine-warm
        runtime:
          name: python
          options:
            toolchain: pip
            virtualenv: {REPO / '.venv'}
            warmStart: warmprog
        """))
    (project / "__main__.py").write_text(PROGRAM)
    (project / "warmprog.py").write_text(WARM_MODULE)
    subprocess.run([pulumi(env), "stack", "init", "dev", "--non-interactive"], cwd=project, env=env, check=True,
                   capture_output=True, timeout=120)
    yield env, project, sockets
    for pid in warm_processes(sockets):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(sockets)], check=False)


def listening(sockets: Path, gone: tuple[int, ...] = ()):
    """The warm processes, once one listens (its socket is there: its imports are done) and none
    of `gone` (a stale one, on its way out) is left."""
    procs = warm_processes(sockets)
    return procs if list(sockets.glob("*.sock")) and procs and not set(gone) & set(procs) else None


def up(env, project, *flags, **extra) -> dict:
    """The stack outputs after `pulumi up` (its update's program run, the later of its two)."""
    r = subprocess.run([pulumi(env), "up", "--stack", "dev", "--yes", "--non-interactive", *flags], cwd=project,
                       env={**env, **extra}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = subprocess.run([pulumi(env), "stack", "output", "--stack", "dev", "--json"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_the_program_and_the_provider_run_warm_once_the_warm_process_is_up(stack):
    env, project, sockets = stack
    # One program run (no preview): none is up yet, so the first of its two processes to ask
    # (program and provider start side by side) runs cold and starts it; the other may find it
    # up already. (With the preview, the update's run finds it up: ready ~1 s after it started.)
    first = up(env, project, "--skip-preview")
    assert "cold" in first.values() and set(first.values()) <= {"cold", "warm"}, first
    wait_for(lambda: listening(sockets), 30, "the warm process")
    assert up(env, project) == {"program": "warm", "provider": "warm"}
    assert up(env, project, GPU_SERVING_WARM_START="0") == {"program": "cold", "provider": "cold"}
    assert up(env, project) == {"program": "warm", "provider": "warm"}
    assert len(warm_processes(sockets)) == 1  # one for the program and the provider of this project


def test_an_edited_program_module_never_runs_from_before_the_edit(stack):
    """The first process of the run after the edit finds the warm process stale: it runs cold and
    starts a fresh one, which the other process (program and provider start side by side) may
    already find up; either way each runs the edited module, and the next `up` runs both warm
    with it."""
    env, project, sockets = stack
    up(env, project)
    stale = tuple(wait_for(lambda: listening(sockets), 30, "the warm process"))
    (project / "warmprog.py").write_text(WARM_MODULE + "EDITED = True\n")
    after = up(env, project, "--skip-preview")
    assert set(after.values()) <= {"cold", "warm, edited"} and "cold" in after.values(), after
    wait_for(lambda: listening(sockets, gone=stale), 30, "a fresh warm process")
    assert up(env, project) == {"program": "warm, edited", "provider": "warm, edited"}


def test_cli_killed_mid_run_leaves_no_fork_of_the_warm_process(stack, tmp_path):
    env, project, sockets = stack
    up(env, project)
    # One (two started at once by the program and the provider: the one that lost the socket ends).
    [zygote] = wait_for(lambda: len(listening(sockets) or ()) == 1 and listening(sockets), 30, "one warm process")
    started = tmp_path / "started"
    cli = subprocess.Popen([pulumi(env), "preview", "--stack", "dev", "--non-interactive"], cwd=project,
                           env={**env, "GS_WARM_BLOCK": "1", "GS_WARM_STARTED": str(started)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(started.exists, 120, "the provider's blocking check")
        assert len(children_of(zygote)) == 2, "the program and the provider are not forks of the warm process"
        cli.kill()  # SIGKILL: the CLI closes nothing
        cli.wait(timeout=10)
        deadline = time.monotonic() + 5
        while children_of(zygote) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children_of(zygote) == [], "a run forked from the warm process outlived the killed CLI"
    finally:
        if cli.poll() is None:
            cli.kill()
