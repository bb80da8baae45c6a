"""The real Pulumi engine, offline: the CLI built by scripts/bootstrap-pulumi, our Python language
host and the dynamic-provider launcher, driven through the Automation API.

- the strategy stacks (tp8, pp8, ep8) preview for real with the project's own Pulumi.yaml and
  Pulumi.<stack>.yaml: the program runs, validates, and plans the same resources for each;
- a Python dynamic provider goes through up, a refresh preview with expect_no_changes, destroy;
- PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION is in force: a program that needs a plugin nobody
  installed fails at once, naming it, instead of trying to download it.

Every test runs against a temporary file backend and its own PULUMI_HOME. The stacks are previewed
in a copy of the project: `pulumi stack init` writes an `encryptionsalt` into Pulumi.<stack>.yaml,
and the working tree must not change under a test run (nor race with a developer's own stacks).

Needs the cached engine (scripts/bootstrap-pulumi) and .venv (scripts/setup): without them these
tests FAIL, saying which command to run. Marked `engine`.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from pulumi import automation as auto

from tests.pulumi_env import REPO, EngineMissing, engine_env, pulumi_command, require_engine, versions
from tests.test_program_mocks import DYNAMIC, TOKENS

pytestmark = pytest.mark.engine

STACKS = ("tp8", "pp8", "ep8")
VENV = REPO / ".venv"
# Copying the project for the stack previews: everything but state, caches and the venv.
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", ".pulumi-state", "__pycache__", ".pytest_cache",
                                     "build", "dist", "*.egg-info")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(env, workdir): the engine environment of scripts/env.sh, with a per-run PULUMI_HOME and a
    temporary file backend."""
    base = tmp_path_factory.mktemp("engine")
    (base / "state").mkdir()
    env = engine_env(pulumi_home=base / "pulumi-home", backend_url=f"file://{base / 'state'}")
    problem = None
    try:
        require_engine(env)
    except EngineMissing as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} does not exist: run scripts/setup (the programs run in that venv)", pytrace=False)
    return env, base


def workspace_opts(env: dict, work_dir: Path) -> auto.LocalWorkspaceOptions:
    return auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        pulumi_home=env["PULUMI_HOME"],
        env_vars=env,
        pulumi_command=pulumi_command(env),
    )


def write_project(path: Path, name: str, program: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "Pulumi.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        runtime:
          name: python
          options:
            toolchain: pip
            virtualenv: {VENV}
        """))
    (path / "__main__.py").write_text(textwrap.dedent(program))
    return path


def test_offline_environment(engine):
    env, _ = engine
    v = versions()
    assert env["PULUMI_SKIP_UPDATE_CHECK"] == "true"
    assert env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == "true"
    assert env["PATH"].split(":")[0] == env["GPU_SERVING_PULUMI_BIN"]
    cmd = pulumi_command(env)
    assert str(cmd.version) == v["PULUMI_VERSION"]
    out = subprocess.run([cmd.command, "version"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"v{v['PULUMI_VERSION']}"


@pytest.fixture(scope="module")
def project_copy(engine):
    _, base = engine
    dst = base / "project"
    shutil.copytree(REPO, dst, ignore=COPY_IGNORE, symlinks=True)
    (dst / ".venv").symlink_to(VENV)  # Pulumi.yaml: runtime.options.virtualenv: .venv
    return dst


def preview_stack(env: dict, project: Path, stack_name: str):
    stack = auto.create_or_select_stack(stack_name=stack_name, work_dir=str(project),
                                        opts=workspace_opts(env, project))
    steps: list[tuple[str, str, str]] = []  # (op, type, name)

    def on_event(event: auto.EngineEvent) -> None:
        pre = event.resource_pre_event
        if pre is not None:
            urn = pre.metadata.urn
            steps.append((str(pre.metadata.op.value), pre.metadata.type, urn.rsplit("::", 1)[-1]))

    result = stack.preview(on_event=on_event)
    return result, steps


def test_strategy_stacks_preview(engine, project_copy):
    env, _ = engine
    before = {n: (REPO / f"Pulumi.{n}.yaml").read_text() for n in STACKS}
    creates = {}
    for name in STACKS:
        assert (project_copy / f"Pulumi.{name}.yaml").exists(), f"Pulumi.{name}.yaml is missing"
        try:
            result, steps = preview_stack(env, project_copy, name)
        except auto.errors.CommandError as exc:
            pytest.fail(f"pulumi preview --stack {name} failed:\n{str(exc)[-4000:]}", pytrace=False)
        summary = {str(getattr(k, "value", k)): n for k, n in result.change_summary.items()}
        creates[name] = summary.get("create", 0)
        # A new stack: everything is created, nothing else happens.
        assert creates[name] > 0, (name, summary, result.stdout[-2000:])
        assert set(summary) <= {"create"}, (name, summary)
        created = {(t, n) for op, t, n in steps if op == "create"}
        # The program's own components and the dynamic-provider resources that carry drift.
        assert ("gpu-serving:index:ServingUnit", name) in created, (name, sorted(created))
        assert ("gpu-serving:index:GpuHost", "host") in created, (name, sorted(created))
        # Each dynamic resource under its own type token (issue 14), none under the SDK's default.
        dynamic = {n: t for t, n in created if t.startswith("pulumi-python:")}
        assert dynamic == {n: DYNAMIC + t for n, t in TOKENS.items()}, (name, sorted(created))
        # ... as the preview's own text shows them: `+ pulumi-python:dynamic/gpu-serving:SystemdService  service  create`.
        shown = [line for line in result.stdout.splitlines() if "pulumi-python:dynamic" in line]
        for n, t in TOKENS.items():
            assert any(DYNAMIC + t in line and f" {n} " in line for line in shown), (n, t, shown)
    # Each strategy is the same deployment shape with a different layout.
    assert len(set(creates.values())) == 1, creates
    # The previews ran in the copy: the repository's stack files are as they were.
    assert {n: (REPO / f"Pulumi.{n}.yaml").read_text() for n in STACKS} == before


def test_the_sdks_own_debug_lines_are_sent_only_when_asked(engine, project_copy):
    """The SDK's debug lines (a blocking call to the engine each, ~80 a program run) are not
    made unless GPU_SERVING_SDK_DEBUG is set; `pulumi preview --debug` shows them then."""
    env, _ = engine
    counts = {}
    for label, extra in (("quiet", {}), ("asked", {"GPU_SERVING_SDK_DEBUG": "1"})):
        run_env = {**env, **extra}
        stack = auto.create_or_select_stack(stack_name="tp8", work_dir=str(project_copy),
                                            opts=workspace_opts(run_env, project_copy))
        result = stack.preview(debug=True)
        counts[label] = result.stdout.count("debug: beginning rpc register resource")
        # The program ran and planned the same resources either way.
        assert result.change_summary.get(auto.OpType.CREATE, 0) > 0, result.stdout[-2000:]
    assert counts["quiet"] == 0, counts
    assert counts["asked"] >= 10, counts


DYNAMIC_PROGRAM = """\
    import pulumi
    import pulumi.dynamic as dyn

    class EchoProvider(dyn.ResourceProvider):
        def create(self, props):
            return dyn.CreateResult(id_="echo-1", outs={"text": props["text"]})

        def read(self, id_, props):
            return dyn.ReadResult(id_, props)

    class Echo(dyn.Resource):
        text: pulumi.Output[str]

        def __init__(self, name, text):
            super().__init__(EchoProvider(), name, {"text": text})

    echo = Echo("echo", pulumi.Config().get("text") or "hello")
    pulumi.export("text", echo.text)
"""


def test_dynamic_provider_up_refresh_destroy(engine):
    env, base = engine
    project = write_project(base / "dynamic", "engine-dynamic", DYNAMIC_PROGRAM)
    stack = auto.create_or_select_stack(stack_name="dev", work_dir=str(project), opts=workspace_opts(env, project))
    stack.set_config("text", auto.ConfigValue("from-config"))
    up = stack.up()
    assert up.outputs["text"].value == "from-config"
    assert up.summary.resource_changes.get("create") == 2  # the stack and the echo resource
    # refresh calls the provider's read; nothing drifted.
    refresh = stack.preview_refresh(expect_no_changes=True)
    assert refresh.change_summary.get("update", 0) == 0
    destroyed = stack.destroy()
    assert destroyed.summary.result == "succeeded"


MISSING_PLUGIN_PROGRAM = """\
    import pulumi

    # A provider that is installed nowhere: the engine must not try to download it.
    pulumi.CustomResource("random:index/randomString:RandomString", "r", {"length": 8},
                          opts=pulumi.ResourceOptions(version="4.16.7"))
"""


def test_missing_plugin_fails_fast(engine):
    env, base = engine
    project = write_project(base / "missing", "engine-missing-plugin", MISSING_PLUGIN_PROGRAM)
    pulumi = str(Path(env["GPU_SERVING_PULUMI_BIN"]) / "pulumi")
    subprocess.run([pulumi, "stack", "init", "dev", "--non-interactive"], cwd=project, env=env, check=True,
                   capture_output=True, timeout=60)
    started = time.monotonic()
    try:
        proc = subprocess.run([pulumi, "preview", "--stack", "dev", "--non-interactive"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("pulumi preview hung for 90 s on a missing plugin: automatic plugin acquisition is not off")
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    # The bound is the promise (a missing plugin fails at once, no download retry loop), with room
    # for a loaded machine; the output below says it did not try.
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert "pulumi-resource-random" in output, output
    assert "v4.16.7" in output, output
    # It did not try: no download attempt, no "could not automatically download" retry loop.
    assert "download" not in output.lower(), output
