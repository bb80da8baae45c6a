"""Rendered units and environment file against golden files (tests/data/units/).

The golden files are what the shipped stacks deploy; a change to rendering shows up here as a
readable diff. Regenerate deliberately with UPDATE_GOLDEN=1.
"""
from pathlib import Path

import pytest

from components.core.config import parse_settings
from components.core.plan import build_plan, plan_stack
from components.core.unit import render_environment, systemd_quote

from .casedata import update_golden

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "units"


def _golden(name: str, text: str):
    path = GOLDEN / name
    if update_golden():
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


# ---------------------------------------------------------------------------------------------
# The rendering guard (issue 13): whatever reaches the renderers, hostile text never becomes a
# unit line. The settings here bypass validation (model_copy does not validate), as a future
# setting without a check, or a settings object built in code, would.

from components.core.errors import ConfigError  # noqa: E402
from components.core.unit import render_unit  # noqa: E402


def _valid():
    return parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8}})


def _bypassing(section: str, **values):
    s = _valid()
    return s.model_copy(update={section: getattr(s, section).model_copy(update=values)})


def _refusal(fn, *args) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    text = str(info.value)
    assert all(line.isprintable() for line in text.splitlines()) and len(text) < 2000, text[:2000]
    return info.value


@pytest.mark.parametrize("section,values,setting", [
    ("serving", {"extra_args": ["--log-level", "info\nExecStartPre=/usr/bin/touch /tmp/pwned"]}, "gpu-serving:serving.extraArgs[1]"),
    ("serving", {"extra_args": ["--log-level", "info\r"]}, "gpu-serving:serving.extraArgs[1]"),
    ("serving", {"extra_args": ["--x", "a\0b"]}, "gpu-serving:serving.extraArgs[1]"),
    ("model", {"path": "/models/k\n--tp-size 1"}, "gpu-serving:model.path"),
    ("model", {"served_name": "kimi\x1b[2J"}, "gpu-serving:model.servedName"),
    ("model", {"served_name": "kimi%n"}, "gpu-serving:model.servedName"),  # Description= expands specifiers
    ("model", {"served_name": "kimi\\"}, "gpu-serving:model.servedName"),  # would join the next line
    ("venv", {"path": "/root/venv\n"}, "gpu-serving:venv.path"),
    ("venv", {"path": "-/root/venv"}, "gpu-serving:venv.path"),  # ExecStart's - prefix
    ("serving", {"host": "0.0.0.0\n"}, "gpu-serving:serving.host"),
    ("serving", {"environment_dir": "-/etc/x"}, "gpu-serving:serving.environmentDir"),
    ("serving", {"environment_dir": "/etc/x y"}, "gpu-serving:serving.environmentDir"),
    ("strategy", {"name": "tp8\nExecStartPre=/bin/id"}, "gpu-serving:strategy.name"),
])
def test_render_unit_refuses_hostile_text_that_bypassed_validation(section, values, setting):
    err = _refusal(render_unit, _bypassing(section, **values), [])
    assert [e.setting for e in err.errors] == [setting], err


def test_render_unit_refuses_a_hostile_sibling_name():
    err = _refusal(render_unit, _valid(), ["pp8\nExecStartPre=/bin/id"])
    assert err.errors[0].setting == "gpu-serving:serving.conflictsWith"


def test_render_unit_escapes_what_systemd_would_expand_in_exec_start():
    # Not refused at render time: quoted and escaped, so systemd passes it through literally.
    unit = render_unit(_bypassing("serving", extra_args=["--x", "%h$HOME${PATH} a\"b\\"]), [])
    assert '"%%h$$HOME$${PATH} a\\"b\\\\"' in unit.text
    assert unit.exec_start[-1] == "%h$HOME${PATH} a\"b\\"


@pytest.mark.parametrize("env,secrets,setting", [
    ({"A": "x\nLD_PRELOAD=/tmp/x.so"}, None, "environment variable 'A'"),
    ({"A": "x\r"}, None, "environment variable 'A'"),
    ({"A": "${PATH}"}, None, "environment variable 'A'"),
    ({"A": 'x"'}, None, "environment variable 'A'"),
    ({"A\nB": "1"}, None, "environment variable 'A\\nB'"),
    ({"1A": "1"}, None, "environment variable '1A'"),
    ({}, {"HF_TOKEN": "hf_Q7xkT2mP9vL4nR8sW3yZ\nLD_PRELOAD=/x.so"}, "gpu-serving:hfToken"),
    ({}, {"HF_TOKEN": "short\"secret"}, "gpu-serving:hfToken"),
])
def test_render_environment_refuses_hostile_text(env, secrets, setting):
    err = _refusal(render_environment, env, secrets)
    assert err.errors[0].setting == setting, err
    for value in (secrets or {}).values():
        # A secret's value, or any piece of it, is never in the refusal.
        assert value.split("\n")[0] not in str(err) and value.split('"')[0] not in str(err)


def test_render_environment_refuses_derived_paths_from_hostile_settings():
    s = _bypassing("cuda", home="/usr/local/cuda\nLD_PRELOAD=/tmp/x.so")
    from components.core.unit import environment
    err = _refusal(render_environment, environment(s))
    assert "CUDA_HOME" in err.errors[0].setting


def test_build_plan_refuses_hostile_text_that_bypassed_validation():
    err = _refusal(build_plan, _bypassing("serving", extra_args=["--log-level", "info\n"]), [])
    assert any(e.setting.startswith("gpu-serving:serving.extraArgs") for e in err.errors)


def test_the_emitted_line_check_catches_what_no_value_check_saw():
    from components.core.unit import _check_emitted
    for line in ("Description=a%hb", "ExecStart=/x $HOME", "Description=x\\", "Description=a\x1bb"):
        with pytest.raises(ConfigError):
            _check_emitted(["[Unit]", line], "the unit x")
    _check_emitted(["ExecStart=/x \\", '    "%%h" "$$HOME"'], "the unit x")
