"""Issue 13: the rendered unit and environment file of every accepted configuration parse back,
through systemd's own parsing on a rehearsal host, to exactly the declared argv and variables.

Configurations: the project's stacks (tp8, pp8, ep8) and each file in
tests/data/unit-round-trip/ (`config`: sections over the project's, one level deep; `secrets`:
what the provider appends to the environment file, e.g. HF_TOKEN). Each is rendered by the real
code (components.core.plan.build_plan; the provider's own `_full` for the file with its secret
lines), installed byte for byte on the host under a test name, then:

- `systemd-analyze verify` accepts the unit;
- `systemctl show -p ExecStart` lists argv[] = the declared argv;
- the unit is started for real: its ExecStart path is a small program that writes the argv and
  the environment it was given as JSON and exits, so the process's argv is the declared argv
  and its environment is the declared variables plus only what systemd adds to any service
  (the same unit without its EnvironmentFile= line gives that part).

And a value that slipped past validation (settings built with `model_construct`/`model_copy`,
which skip it) cannot add a line: the renderers refuse it.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from components.core.config import StackSettings, parse_settings
from components.core.errors import ConfigError
from components.core.plan import build_plan, plan_stack, stack_names
from components.remote.providers import RemoteFileProvider
from components.core.specs import file_spec
from components.core.unit import render_environment, render_unit

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "unit-round-trip"
DUMP = "/run/ptrt/dump.json"
# Set by systemd for each run of a service, whatever the unit says.
PER_RUN = {"INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID"}

DUMPER = f"""#!/usr/bin/python3
# Test stand-in for the engine (tests/e2e/test_unit_round_trip.py): record argv and environ.
import json, os, sys
os.makedirs("{Path(DUMP).parent}", exist_ok=True)
with open("{DUMP}.part", "w") as out:
    json.dump({{"argv": sys.argv, "environ": dict(os.environ)}}, out)
os.replace("{DUMP}.part", "{DUMP}")
"""


def project_values() -> dict:
    config = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v["value"] for k, v in config.items()}


def case_names() -> list[str]:
    return [f"project-{s}" for s in stack_names(ROOT)] + sorted(f.stem for f in CASES.glob("*.yaml"))


def render(name: str) -> tuple[object, dict]:
    """(the plan, the secret variables) of a configuration."""
    if name.startswith("project-"):
        return plan_stack(ROOT, name.removeprefix("project-")), {}
    case = yaml.safe_load((CASES / f"{name}.yaml").read_text())
    config = project_values()
    for section, value in case["config"].items():
        base = config.get(section)
        config[section] = {**base, **value} if isinstance(base, dict) and isinstance(value, dict) else value
    settings = parse_settings(name, config)  # accepted: a ConfigError here fails the test
    # Every variable of the case in the shared file (its quoting is what the case stresses); the
    # project's stacks above put their own variables in the unit's Environment= lines.
    return build_plan(settings), case.get("secrets") or {}


@pytest.fixture(scope="module")
def host(rehearsal_host_factory):
    return rehearsal_host_factory()


def run(host, script: str, timeout: float = 120) -> str:
    proc = host.run(script, timeout=timeout)
    assert proc.returncode == 0, f"{script}\nrc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def exec_start_argv(show: str) -> list[str]:
    """argv[] of `systemctl show -p ExecStart` (words joined by one space: valid because no
    accepted argument holds whitespace, which the test checks first)."""
    assert show.count("argv[]=") == 1, show
    return show.split("argv[]=", 1)[1].split(" ; ", 1)[0].split(" ")


def start_and_dump(host, unit: str) -> dict:
    run(host, f"rm -f {DUMP} && systemctl daemon-reload && systemctl start --wait {unit}", timeout=60)
    return json.loads(run(host, f"cat {DUMP}"))


@pytest.mark.rehearsal
@pytest.mark.parametrize("name", case_names())
def test_unit_and_environment_parse_back_to_exactly_what_was_declared(host, name):
    plan, secrets = render(name)
    argv = plan.unit.exec_start
    declared = {**plan.environment, **secrets}
    env_text = RemoteFileProvider()._full(file_spec(None, plan.unit.environment_path, plan.environment_text, "0600",
                                                     secretEnvironment=secrets)).decode()
    assert not any(c.isspace() for a in argv for c in a), argv

    unit = f"ptrt-{name}.service"
    bare = f"ptrt-{name}-bare.service"  # the same unit without its environment lines
    bare_text = "".join(line for line in plan.unit.text.splitlines(keepends=True)
                        if not line.startswith(("EnvironmentFile=", "Environment=")))
    assert bare_text != plan.unit.text
    env_path = plan.unit.environment_path
    env_dir = str(Path(env_path).parent)
    bin_dir = str(Path(argv[0]).parent)
    run(host, f"mkdir -p {shlex.quote(env_dir)} {shlex.quote(bin_dir)}")
    for path, text, mode in ((f"/etc/systemd/system/{unit}", plan.unit.text, "644"),
                             (f"/etc/systemd/system/{bare}", bare_text, "644"),
                             (env_path, env_text, "600"),
                             (argv[0], DUMPER, "755")):
        q = shlex.quote(path)
        host.run(f"cat > {q} && chmod {mode} {q}", input=text, check=True)
    # Byte for byte what was rendered.
    assert host.run(f"cat {shlex.quote(f'/etc/systemd/system/{unit}')}").stdout == plan.unit.text
    assert host.run(f"cat {shlex.quote(env_path)}").stdout == env_text
    try:
        verify = host.run(f"systemd-analyze verify /etc/systemd/system/{unit}", timeout=120)
        assert verify.returncode == 0 and unit not in verify.stdout + verify.stderr, verify
        run(host, "systemctl daemon-reload")
        show = run(host, f"systemctl show -p ExecStart {unit}")
        assert exec_start_argv(show) == argv, show
        files = run(host, f"systemctl show -p EnvironmentFiles {unit}")
        assert files.strip() == f"EnvironmentFiles={env_path} (ignore_errors=no)", files

        seen = start_and_dump(host, unit)
        assert seen["argv"] == argv
        baseline = start_and_dump(host, bare)
        assert baseline["argv"] == argv
        environ = {k: v for k, v in seen["environ"].items() if k not in PER_RUN}
        systemd_own = {k: v for k, v in baseline["environ"].items() if k not in PER_RUN}
        assert environ == {**systemd_own, **declared}
        for key, value in declared.items():  # spelled out, for a readable failure
            assert seen["environ"].get(key) == value, (key, value, seen["environ"].get(key))
    finally:
        host.run(f"systemctl stop {unit} {bare}; rm -f /etc/systemd/system/{unit} "
                 f"/etc/systemd/system/{bare}; systemctl daemon-reload")


# ---------------------------------------------------------------------------------------------
# A value that slipped past validation cannot add a line (the render-time guard)


def accepted() -> StackSettings:
    return plan_stack(ROOT, "tp8").settings


def slipped(**sections) -> StackSettings:
    """tp8's settings with some fields replaced without validation (model_copy skips it)."""
    s = accepted()
    update = {name: getattr(s, name).model_copy(update=fields) for name, fields in sections.items()}
    return s.model_copy(update=update)


HOSTILE = {
    "extraArgs newline": dict(serving={"extra_args": ["--log-level", "info\nExecStartPre=/usr/bin/touch", "/tmp/pwned"]}),
    "extraArgs carriage return": dict(serving={"extra_args": ["--log-level", "info\rExecStartPre=/bin/true"]}),
    "extraArgs NUL": dict(serving={"extra_args": ["--log-level", "info\0"]}),
    "model.path newline": dict(model={"path": "/models/kimi\nExecStartPre=/bin/true"}),
    "servedName newline": dict(model={"served_name": "kimi\nExecStartPre=/bin/true"}),
    "venv.path newline": dict(venv={"path": "/root/venv\nExecStartPre=/bin/true"}),
    "environmentDir newline": dict(serving={"environment_dir": "/etc/gpu-serving\nExecStartPre=/bin/true"}),
}


# A refusal, whichever the guard raises; never a rendered text, never a crash (TypeError, ...).
REFUSAL = (ConfigError, ValueError, RuntimeError)


@pytest.mark.parametrize("what", list(HOSTILE))
def test_a_control_character_that_slipped_past_validation_is_refused_at_render(what):
    settings = slipped(**HOSTILE[what])
    with pytest.raises(REFUSAL):
        text = render_unit(settings, ["pp8"]).text
        pytest.fail(f"rendered a unit with {what}:\n{text}")


@pytest.mark.parametrize("value", ["1\nLD_PRELOAD=/tmp/evil.so", "1\rX=1", "1\0"])
def test_a_control_character_in_an_environment_value_is_refused_at_render(value):
    with pytest.raises(REFUSAL):
        text = render_environment({"OMP_NUM_THREADS": value})
        pytest.fail(f"rendered an environment file with {value!r}:\n{text}")
    with pytest.raises(REFUSAL):
        text = render_environment({f"OMP{value}": "1"})
        pytest.fail(f"rendered an environment key {value!r}:\n{text}")
