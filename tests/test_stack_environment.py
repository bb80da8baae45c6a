"""What reaches the shared environment file and what stays in a strategy's own unit, as data
(tests/data/stack-environment/*.json): `project` is Pulumi.yaml's gpu-serving:serving, `stack`
the stack file's (null: none)."""
from pathlib import Path
import shutil

import pytest
import yaml

from components.core.config import parse_settings
from components.core.errors import ConfigError
from components.core.plan import build_plan, merge_serving, plan_stack, project_environment_dir

from .casedata import cases

ROOT = Path(__file__).resolve().parent.parent


def _unit_environment(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            key, _, value = line[len("Environment="):].strip('"').partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("name,case", cases("stack-environment"), ids=lambda x: x if isinstance(x, str) else "")
def test_stack_environment_case(name, case):
    project = case["project"]
    config = {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8},
              "serving": merge_serving(project, case["stack"])}
    settings = parse_settings(name, config)
    if "error" in case:
        with pytest.raises(ConfigError) as info:
            build_plan(settings, dict(project.get("environment") or {}), project_environment_dir({"serving": project}))
        matching = [e for e in info.value.errors if e.setting == case["error"]["setting"]]
        assert matching and case["error"]["contains"] in str(matching[0]), str(info.value)
        return
    plan = build_plan(settings, dict(project.get("environment") or {}), project_environment_dir({"serving": project}))
    expect = case["expect"]
    assert plan.shared_environment == expect["shared"]
    unit_env = _unit_environment(plan.unit.text)
    assert {k: unit_env.get(k) for k in expect["unit_has"]} == expect["unit_has"]
    assert not set(expect["unit_lacks"]) & set(unit_env)
    # Every variable once: in the shared file or in the unit, never in both.
    assert not set(unit_env) & set(plan.shared_environment)
    assert {**plan.shared_environment, **unit_env} == plan.environment
    assert settings.serving.port == expect["port"]
    assert settings.serving.mem_fraction_static == expect["mem_fraction_static"]


def _project_copy(tmp_path: Path) -> Path:
    for f in ROOT.glob("Pulumi*.yaml"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def test_a_new_or_removed_layout_file_changes_no_unit(tmp_path):
    project = _project_copy(tmp_path)
    before = {s: plan_stack(project, s).unit.text for s in ("tp8", "pp8", "ep8")}
    (project / "Pulumi.tp4pp2.yaml").write_text(yaml.safe_dump({"config": {"gpu-serving:strategy": {"tpSize": 4, "ppSize": 2}}}))
    assert {s: plan_stack(project, s).unit.text for s in before} == before
    (project / "Pulumi.ep8.yaml").unlink()
    assert {s: plan_stack(project, s).unit.text for s in ("tp8", "pp8")} == {s: before[s] for s in ("tp8", "pp8")}


def test_a_stack_with_its_own_serving_block_writes_the_same_shared_file(tmp_path):
    project = _project_copy(tmp_path)
    (project / "Pulumi.fault.yaml").write_text(yaml.safe_dump({"config": {
        "gpu-serving:strategy": {"tpSize": 8, "epSize": 8},
        "gpu-serving:serving": {"environment": {"REHEARSAL_FAULT": "crash_during_load"}}}}))
    fault, tp8 = plan_stack(project, "fault"), plan_stack(project, "tp8")
    assert fault.environment_text == tp8.environment_text
    assert "REHEARSAL_FAULT" not in fault.environment_text and 'REHEARSAL_FAULT=crash_during_load' in fault.unit.text
    assert fault.environment["NCCL_ALGO"] == "Ring"


def test_conflicts_with_is_an_explicit_opt_in():
    s = parse_settings("ep8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8, "epSize": 8},
                               "serving": {"conflictsWith": ["tp8", "ep8"]}})
    plan = build_plan(s)
    assert plan.unit.conflicts == ["sglang-kimi-k2.6-tp8.service"]
    assert "Conflicts=sglang-kimi-k2.6-tp8.service\nAfter=sglang-kimi-k2.6-tp8.service\n" in plan.unit.text
