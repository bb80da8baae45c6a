"""Issue 36.13: stack files are read as Pulumi reads them (components/core/pulumi_yaml.py), not
as YAML 1.1: an environment key `on` is `on` (PyYAML made it true: plan wrote
`Environment=true=1`, the host got `on=1`, and `status` reported drift for ever), a value `off`
is `off`. Cases in tests/data/stack-yaml/ (a stack file's text, the settings as `plan` reads
them, or the refusal); the engine test reads each with the real `pulumi config` and requires the
same values, and the same refusals."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.__main__ import main as components_main
from components.core.errors import ConfigError
from components.core.pulumi_yaml import dump
from components.core.stack_config import _decode, from_files

from .casedata import cases

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "name: gpu-serving\nruntime: python\n"


def project(tmp_path: Path, case: dict, stack: str = "s") -> Path:
    (tmp_path / "Pulumi.yaml").write_text(PROJECT)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(case["stackFile"])
    return tmp_path


def read(tmp_path: Path, case: dict) -> dict:
    return from_files(project(tmp_path, case), "s").values


@pytest.mark.parametrize("name,case", cases("stack-yaml"), ids=lambda x: x if isinstance(x, str) else "")
def test_stack_file_reads_as_pulumi_reads_it(name, case, tmp_path):
    if "refused" in case:
        with pytest.raises(ConfigError) as info:
            read(tmp_path, case)
        assert case["refused"] in str(info.value) and "Pulumi.s.yaml" in str(info.value), str(info.value)
        return
    assert read(tmp_path, case) == case["expect"]


def test_an_environment_key_on_and_a_value_off_plan_as_the_host_gets_them(tmp_path, capsys):
    """The operator's situation: a variable named `on` and one set to `off`, in a stack of this
    project; the unit `plan` shows is the one Pulumi deploys (`on=1`, `X=off`)."""
    for f in ("Pulumi.yaml", "Pulumi.tp8.yaml"):
        (tmp_path / f).write_text((ROOT / f).read_text())
    (tmp_path / "Pulumi.tp8.yaml").write_text(
        (ROOT / "Pulumi.tp8.yaml").read_text().replace("config:\n", "config:\n  gpu-serving:serving:\n    environment:\n"
                                                       "      on: \"1\"\n      SWITCH: off\n", 1))
    assert components_main(["plan", "--stack", "tp8", "--project-dir", str(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["environment"]["on"] == "1" and plan["environment"]["SWITCH"] == "off", plan["environment"]
    assert "true" not in plan["environment"] and "False" not in plan["environment"].values()
    assert '"on=1"' in plan["unit_text"] or "on=1" in plan["unit_text"], plan["unit_text"]
    assert "SWITCH=off" in plan["unit_text"], plan["unit_text"]


def test_dump_writes_what_pulumi_reads_back(tmp_path):
    """Tests write stack files with pulumi_yaml.dump: text go-yaml would read as a number or a
    date is quoted, text it reads as text (`on`) is not."""
    doc = {"config": {"gpu-serving:serving": {"extraArgs": ["1e3", "08", "0o17", "2024-1-2", "on", "1:20"],
                                              "environment": {"on": "1", "off": "off"}}}}
    text = dump(doc)
    assert "- '1e3'" in text and "- on\n" in text and "on: '1'" in text
    assert read(tmp_path, {"stackFile": text}) == doc["config"]


@pytest.mark.engine
def test_pulumi_config_reads_every_case_as_plan_does(tmp_path):
    """The real engine's reading (`pulumi config --json`, what the program gets) of every case:
    the same values, the same files refused."""
    from tests.pulumi_env import engine_env, require_engine
    env = engine_env(pulumi_home=tmp_path / "home", backend_url=f"file://{tmp_path / 'state'}", passphrase="stack-yaml")
    pulumi = str(require_engine(env) / "pulumi")
    (tmp_path / "state").mkdir()
    work = tmp_path / "project"
    work.mkdir()

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([pulumi, *args, "--non-interactive"], cwd=work, env=env, capture_output=True, text=True,
                              timeout=120)

    (work / "Pulumi.yaml").write_text(PROJECT)
    assert run("stack", "init", "s").returncode == 0
    for name, case in cases("stack-yaml"):
        done = run("config", "--json", "--show-secrets", "--stack", "s") if (work / "Pulumi.s.yaml").write_text(
            case["stackFile"]) else None
        if "refused" in case:
            assert done.returncode != 0, (name, done.stdout)
            continue
        assert done.returncode == 0, (name, done.stderr)
        engine = {k: v["objectValue"] if "objectValue" in v else _decode(v["value"]) for k, v in json.loads(done.stdout).items()}
        assert engine == from_files(work, "s").values == case["expect"], name
