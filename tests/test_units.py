"""Rendered units and environment file against golden files (tests/data/units/).

The golden files are what the shipped stacks deploy; a change to rendering shows up here as a
readable diff. Regenerate deliberately with UPDATE_GOLDEN=1.
"""
import os
from pathlib import Path

import pytest

from components.config import parse_settings
from components.plan import build_plan, plan_stack
from components.unit import render_environment, systemd_quote

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "units"


def _golden(name: str, text: str):
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("stack", ["tp8", "pp8", "ep8"])
def test_shipped_stack_renders_golden_unit(stack):
    plan = plan_stack(ROOT, stack)
    assert plan.unit.name == f"sglang-kimi-k2.6-{stack}.service"
    _golden(f"{stack}.service", plan.unit.text)


def test_environment_file_is_shared_and_golden():
    texts = {plan_stack(ROOT, s).environment_text for s in ("tp8", "pp8", "ep8")}
    assert len(texts) == 1, "every strategy of a model must render the same EnvironmentFile"
    _golden("kimi-k2.6.env", texts.pop())


def test_no_variable_written_twice():
    plan = plan_stack(ROOT, "ep8")
    keys = [line.split("=", 1)[0] for line in plan.environment_text.splitlines() if line and not line.startswith("#")]
    assert len(keys) == len(set(keys))
    # ...and none of them is repeated in the unit itself, which sets only what the file does not.
    unit_keys = [line[len("Environment="):].strip('"').split("=", 1)[0] for line in plan.unit.text.splitlines()
                 if line.startswith("Environment=")]
    assert unit_keys and len(unit_keys) == len(set(unit_keys)) and not set(unit_keys) & set(keys)
    assert plan.unit.text.count("EnvironmentFile=") == 1


def test_a_unit_names_no_other_strategy_and_carries_the_marker():
    plan = plan_stack(ROOT, "ep8")
    assert plan.unit.conflicts == [] and "Conflicts=" not in plan.unit.text
    assert "After=network-online.target\n" in plan.unit.text and "After=sglang" not in plan.unit.text
    assert "\nX-GpuServing-Stack=ep8\n" in plan.unit.text


def test_exec_start_uses_canonical_size_flags_once_each():
    argv = plan_stack(ROOT, "pp8").unit.exec_start
    for flag in ("--tp-size", "--pp-size", "--ep-size", "--dp-size", "--port", "--model-path"):
        assert argv.count(flag) == 1, flag
    assert argv[argv.index("--pp-size") + 1] == "8"
    assert not any(a in ("--tp", "--pp", "--ep", "--enable-ep-moe") for a in argv)


def test_rendering_is_deterministic():
    a = plan_stack(ROOT, "tp8")
    b = plan_stack(ROOT, "tp8")
    assert a.unit.text == b.unit.text and a.environment_text == b.environment_text


def test_user_environment_replaces_derived_value():
    s = parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8},
                               "serving": {"environment": {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}}})
    plan = build_plan(s)
    assert plan.environment["CUDA_VISIBLE_DEVICES"] == "7,6,5,4,3,2,1,0"
    assert plan.environment_text.count("CUDA_VISIBLE_DEVICES=") == 1
    assert "CUDA_VISIBLE_DEVICES" not in plan.unit.text


@pytest.mark.parametrize("arg,quoted", [
    ("--port", "--port"),
    ("a b", '"a b"'),
    ("50%", '"50%%"'),
    ("$HOME", '"$$HOME"'),
    ('say "hi"\\', '"say \\"hi\\"\\\\"'),
])
def test_systemd_quote(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_secret_values_only_in_environment_file_text():
    text = render_environment({"A": "1"}, {"HF_TOKEN": "hf_secret value"})
    assert 'HF_TOKEN="hf_secret value"' in text
