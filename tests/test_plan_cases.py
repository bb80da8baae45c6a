"""Strategy rules and memory plans, one JSON file a case (tests/data/strategy, tests/data/memory)."""
import pytest

from components.core.config import parse_settings
from components.core.errors import ConfigError
from components.core.memory import plan_memory
from components.core.plan import build_plan, build_plans

from .casedata import case_config, cases



@pytest.mark.parametrize("name,case", cases("strategy"), ids=lambda x: x if isinstance(x, str) else "")
def test_strategy_case(name, case):
    config = case_config(case)
    if case.get("valid"):
        plan = build_plan(parse_settings(name, config))
        assert plan.world_size == plan.settings.host.gpu_count
        return
    if case.get("valid_nodes"):
        # A multi-node layout: every node's plan, the world spread evenly over them.
        plans = build_plans(parse_settings(name, config))
        assert [p.settings.node.rank for _, p in plans] == list(range(len(plans)))
        assert all(p.world_size == p.settings.host.gpu_count * len(plans) for _, p in plans)
        for key, value in case.get("expect", {}).items():
            assert plans[0][1].memory.as_dict()[key] == value, key
        return
    with pytest.raises(ConfigError) as info:
        build_plans(parse_settings(name, config))
    expected = case["error"]
    matching = [e for e in info.value.errors if e.setting == expected["setting"]]
    assert matching, f"no error names {expected['setting']}; got: {info.value}"
    assert any(expected["contains"] in str(e) for e in matching), str(info.value)


@pytest.mark.parametrize("name,case", cases("memory"), ids=lambda x: x if isinstance(x, str) else "")
def test_memory_case(name, case):
    plan, errors = plan_memory(parse_settings(name, case_config(case)))
    assert not errors
    expect = case["expect"]
    for key, value in expect.items():
        if key == "stage_layers":
            assert [s.layers for s in plan.stages] == value
        elif key == "warnings":
            assert len(plan.warnings) == value, plan.warnings
        else:
            assert getattr(plan, key) == value, key


def test_every_rule_has_a_passing_and_a_failing_case():
    # Issue 2: each rule of point 3 has at least one valid and one invalid data file.
    names = [name for name, _ in cases("strategy")]
    for rule in ("world-size", "tp-ep", "experts", "moe-width", "dp-attention", "a2a", "spec-decoding", "extra-args", "memory"):
        of_rule = [n for n in names if n.startswith(rule)]
        assert any(n.endswith("-valid") for n in of_rule), rule
        assert any(not n.endswith("-valid") for n in of_rule), rule
