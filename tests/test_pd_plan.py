"""Prefill/decode disaggregation's pure parts (issue 41): the settings, each server's unit with
its role's flags, the pair's plan (KV path, what bounds concurrency, the router in PD mode),
what is refused, and the switch to and from a fleet. Cases under tests/data/pd/ (golden units
beside them: UPDATE_GOLDEN=1 rewrites them) and tests/data/pd-switch/."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.core import pd_plan, pd_switch
from components.core.config import parse_settings
from components.core.errors import ConfigError
from components.core.plan import PD_NOT_DEPLOYED, CheckedStack, build_plans, check_stack
from components.core.stack_config import RawConfig, from_engine, from_files
from components.core.switch_cost import Forecast

from .casedata import DATA, case_config, cases, update_golden

ROOT = Path(__file__).resolve().parent.parent
PD = DATA / "pd"


def checked(stack: str, config: dict) -> CheckedStack:
    """A stack's check as check_stack makes it, from settings without files."""
    settings = parse_settings(stack, case_config({"config": config}))
    plans = build_plans(settings)
    pd = pd_plan.build(settings, plans) if settings.disaggregation is not None else None
    return CheckedStack(settings, plans, [], [], pd)


def _golden(name: str, text: str):
    path = PD / name
    if update_golden():
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs (review, then UPDATE_GOLDEN=1)"


VALID = [(n, c) for n, c in cases("pd") if "expect" in c]
REFUSED = [(n, c) for n, c in cases("pd") if "refused" in c]


@pytest.mark.parametrize("name,case", VALID, ids=[n for n, _ in VALID])
def test_each_server_carries_its_roles_flags_and_the_pair_its_plan(name, case):
    c = checked(name, case["config"])
    expect = case["expect"]
    assert [(s.role, s.host) for s in c.pd.servers] == [tuple(x) for x in expect["servers"]]
    for host, plan in c.plans:
        line = " ".join(plan.unit.exec_start)
        for flag in expect["flags"].get(host, []):
            assert f" {flag}" in line, (host, flag, line)
        for flag in expect.get("absent", {}).get(host, []):
            assert f" {flag}" not in line, (host, flag, line)
        assert f", {plan.settings.role.role} server" in plan.unit.text.splitlines()[2]
        _golden(f"{case['golden']}-{host}.service", plan.unit.text)
    _golden(f"{case['golden']}-router.service", c.pd.router_unit)
    kv = c.pd.kv.as_dict()
    for key, value in expect["kv_path"].items():
        assert kv[key] == value, (key, kv)
    for key in ("decode_kv_tokens", "requests_at_context", "running_cap"):
        if key in expect:
            assert getattr(c.pd, key) == expect[key], key
    if "router" in expect:
        argv = c.pd.router_exec_start
        start = argv.index(expect["router"][0])
        assert argv[start:start + len(expect["router"])] == expect["router"], argv
        assert "--worker-urls" not in argv
    text = " ".join(c.pd.warnings)
    assert len(c.pd.warnings) == (1 if expect["warnings"] else 0), c.pd.warnings
    for phrase in expect["warnings"]:
        assert phrase in text, text


@pytest.mark.parametrize("name,case", REFUSED, ids=[n for n, _ in REFUSED])
def test_what_the_pair_cannot_do_is_refused_naming_the_setting(name, case):
    with pytest.raises(ConfigError) as info:
        checked(name, case["config"])
    expected = case["refused"]
    named = [e for e in info.value.errors if e.setting == expected["setting"]]
    assert named, f"no error names {expected['setting']}: {info.value}"
    assert any(expected["contains"] in str(e) for e in named), str(info.value)


def test_the_kv_path_is_what_the_link_carries():
    # 25 Gbit/s = 3.125 GB/s; Kimi K2.6's MLA KV: (512 + 64) x 61 layers x 2 bytes a token.
    c = checked("pd", dict(VALID)["kimi-1p1d-tcp"]["config"])
    kv = c.pd.kv
    assert kv.bytes_per_token == (512 + 64) * 61 * 2
    assert kv.tokens_per_second == pytest.approx(25e9 / 8 / (kv.bytes_per_token * kv.copies))
    assert kv.seconds(1024) == pytest.approx(1024 * kv.wire_bytes_per_token / 3.125e9)


def test_preview_and_up_refuse_a_pd_stack_until_its_deploy_lands_and_plan_shows_it():
    # The program reads its config from the engine (from_engine): refused, naming the setting.
    raw = from_files(ROOT, "pd1p1d")
    engine = from_engine({k: v for k, v in raw.values.items()}, set())
    with pytest.raises(ConfigError) as info:
        check_stack("pd1p1d", engine, ROOT)
    assert any(e.setting == "gpu-serving:disaggregation" and PD_NOT_DEPLOYED in str(e) for e in info.value.errors)
    # The same files through `plan` (and status, watch, advise): the plan, with the pair's part.
    done = check_stack("pd1p1d", from_files(ROOT, "pd1p1d"), ROOT)
    assert done.pd is not None and [s.role for s in done.pd.servers] == ["prefill", "decode"]
    assert isinstance(RawConfig().source, str) and RawConfig().source == "files"


def test_the_shipped_pd_stack_renders_its_golden_units():
    done = check_stack("pd1p1d", from_files(ROOT, "pd1p1d"), ROOT)
    for host, plan in done.plans:
        _golden(f"pd1p1d-{host}.service", plan.unit.text)
    _golden("pd1p1d-router.service", done.pd.router_unit)


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "components", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_plan_command_shows_the_pair_and_the_switch_from_a_fleet():
    out = _run("plan", "--stack", "pd1p1d")
    assert out.returncode == 0, out.stderr
    for phrase in ("=== prefill: gpu1", "=== decode: gpu2", "--disaggregation-mode prefill", "--disaggregation-mode decode",
                   "KV path      mooncake over tcp at 25 Gbit/s", "--pd-disaggregation", PD_NOT_DEPLOYED,
                   "the KV cache crosses plain TCP"):
        assert phrase in out.stdout, phrase
    switch = _run("plan", "--stack", "pd1p1d", "--against", "tp8x2")
    assert switch.returncode == 0, switch.stderr
    assert "NOTHING SERVES" in switch.stdout and "+    --pd-disaggregation \\" in switch.stdout
    assert "gpu1: sglang-kimi-k2.6-tp8x2.service stops, sglang-kimi-k2.6-pd1p1d.service starts" in switch.stdout
    back = _run("plan", "--stack", "tp8x2", "--against", "pd1p1d", "--json")
    assert back.returncode == 0, back.stderr
    doc = json.loads(back.stdout)
    assert doc["outage_hosts"] == ["gpu1"] and doc["from"] == "pd1p1d" and doc["to"] == "tp8x2"


SWITCHES = cases("pd-switch")


@pytest.mark.parametrize("name,case", SWITCHES, ids=[n for n, _ in SWITCHES])
def test_the_switch_says_what_stops_in_which_order_and_for_how_long(name, case):
    before = pd_switch.side(checked(case["before"]["strategy"]["name"], case["before"]))
    after = pd_switch.side(checked(case["after"]["strategy"]["name"], case["after"]))
    forecasts = {h: Forecast("history", float(s), text=f"{h}: {s} s") for h, s in case["forecasts"].items()}
    p = pd_switch.plan(before, after, forecasts)
    expect = case["expect"]
    assert p.outage_hosts == expect["outage_hosts"]
    assert p.outage_seconds == expect["outage_seconds"]
    assert len(p.steps) == expect["steps"], p.steps
    text = pd_switch.render(p)
    for phrase in expect["contains"]:
        assert phrase in text, (phrase, text)
    for line in expect.get("router_diff", []):
        assert line in p.router_diff, p.router_diff
    # Every host of the target stops what it ran and starts its server, once.
    assert sorted(h.host for h in p.hosts) == sorted(after.units)
