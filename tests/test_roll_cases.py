"""The roll behind the router as a plan (components/core/roll.py) on the cases of tests/data/roll/:
what each host and the router say before the first batch in, the batches (or the refusal naming
the hosts) and the line a run prints out. Each case names the situation it stands for."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core import roll
from components.core.router import Worker

from .casedata import cases

STATUS = Path(__file__).parent / "data" / "status"


@pytest.mark.parametrize("name,case", cases("roll"), ids=[n for n, _ in cases("roll")])
def test_the_roll(name, case):
    hosts = [roll.host_from_dict(h) for h in case["hosts"]]
    router = roll.RouterNow.from_dict(case["router"])
    plan = roll.plan(hosts, router, case["target"], max_unavailable=case["maxUnavailable"])
    want = case["expect"]
    assert [list(b) for b in plan.batches] == want["batches"]
    for key in ("size", "after", "first", "rejoin"):
        if key in want:
            assert roll.plan_to_dict(plan)[key] == want[key], key
    if "refused" in want:
        assert plan.refused, plan
        for part in want["refused"]:
            assert part in plan.refused, plan.refused
        assert "\n" not in plan.refused  # one line
    else:
        assert plan.refused is None, plan.refused
        # Every declared host is chained once: those that switch, then the others.
        assert sorted(n for b in plan.chain for n in b) == sorted(h.name for h in hosts)
    line = roll.notice(plan, case["target"], "http://r:30080")
    for part in want.get("notice", []):
        assert part in line, line
    for part in want.get("notice_lacks", []):
        assert part not in line, line


def test_a_host_read_says_what_serves_and_whether_it_runs_the_declaration():
    """From a real SERVING_SCRIPT answer (the status cases' capture): tp8 serves; declared as it runs
    (secret values not compared), it needs no switch; a declared variable that differs, or another
    unit declared, does."""
    capture = json.loads((STATUS / "switch-tp8-to-ep8.json").read_text())
    argv = ["/root/venv_sglang211/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.6", "--tp-size", "8",
            "--pp-size", "1", "--ep-size", "1", "--dp-size", "1", "--max-running-requests", "64", "--host", "0.0.0.0",
            "--port", "30001"]
    env = {"NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "8", "OLD_ONLY": "s3cr3t-value"}
    tp8 = "sglang-kimi-k2.6-tp8.service"

    def read(unit, environment):
        return roll.host_now("gpu1", "http://10.0.0.11:30001", capture["stdout"], unit=unit, declared_argv=argv,
                             declared_environment=environment, secret_keys=["HF_TOKEN"])

    assert read(tp8, env) == roll.HostNow("gpu1", "http://10.0.0.11:30001", serving=tp8, as_declared=True)
    assert read(tp8, {**env, "NCCL_ALGO": "Tree"}).as_declared is False
    assert read("sglang-kimi-k2.6-ep8.service", env).as_declared is False
    down = roll.host_now("gpu2", "http://10.0.0.12:30001", None, unit=tp8, declared_argv=argv, declared_environment=env,
                         secret_keys=[], error="cannot reach root@10.0.0.12:22 over SSH")
    assert not down.reachable and down.error.startswith("cannot reach")
    nothing = roll.host_now("gpu3", "u", json.loads((STATUS / "nothing-serves.json").read_text())["stdout"], unit=tp8,
                            declared_argv=argv, declared_environment=env, secret_keys=[])
    assert nothing.reachable and nothing.serving == "" and not nothing.as_declared


def test_the_router_read_marks_what_it_routes_to():
    workers = [Worker("1", "http://a:1", "ready", True, 0, "tp8 pp1 dp1"), Worker("2", "http://b:1", "draining", True, 0, ""),
               Worker("3", "http://c:1", "ready", False, 0, "")]
    seen = roll.router_now(workers, {"http://a:1": True})
    assert seen.listed == {"http://a:1": roll.ROUTED, "http://b:1": "draining", "http://c:1": "ready (unhealthy)"}
    assert roll.RouterNow.from_dict(json.loads(json.dumps(seen.as_dict()))) == seen
    assert roll.router_now(None, {}, error="HTTP 0").answers is False


def test_the_health_probe_answer():
    assert roll.parse_probe('{"http://a:1": 200, "http://b:1": 503, "http://c:1": 0}\n') == {
        "http://a:1": True, "http://b:1": False, "http://c:1": False}
    assert roll.parse_probe("Traceback (most recent call last):") == {}
    assert roll.parse_probe("") == {}


def test_without_a_reading_the_declared_order_is_kept():
    plan = roll.unknown(["a", "b", "c"], 2)
    assert plan.chain == (("a", "b"), ("c",)) and plan.refused is None


def test_a_host_whose_address_is_not_known_stops_the_run_naming_it():
    text = roll.unresolved([("hosts[w2c]", "the rehearsal host 'w2c' is not running: start it with "
                                           "`python -m rehearsal up w2c` (or set hosts[w2c].address)")])
    assert text.startswith("nothing was changed: hosts[w2c]: the rehearsal host 'w2c' is not running")
    assert "\n" not in text


def test_a_stack_without_that_router_may_not_stop_a_fleet_member():
    """Issue 36.7: the one-host `ep8` stack switched a host that serves as a routed member of a fleet,
    with no drain and no warning. The member's unit names its router (X-GpuServing-RoutedBy, read by
    the switch preview's own read): a stack without that router is refused, naming the unit, its
    stack and the router, before anything stops; the fleet's own stacks switch it as ever."""
    from components.core.status import parse_serving

    stdout = json.loads((STATUS / "switch-tp8-to-ep8.json").read_text())["stdout"]
    routed = stdout.replace("Stack=tp8\n", "Stack=tp8\nRoutedBy=gpu-serving-router:30080\n")
    member = parse_serving(routed).serving
    assert member[0].routed_by == "gpu-serving-router:30080"
    text = roll.stops_a_routed_server(member, "sglang-kimi-k2.6-ep8.service", "", who="", where="10.213.3.2")
    assert text.startswith("the switch to sglang-kimi-k2.6-ep8.service is refused before anything stops: "
                           "sglang-kimi-k2.6-tp8.service (stack tp8) serves on 10.213.3.2 as a member of a fleet behind "
                           "SGLang's router gpu-serving-router:30080"), text
    assert "declares no router" in text and "gpu-serving:hosts" in text and "\n" not in text
    assert "declares another router" in roll.stops_a_routed_server(member, "u", "gpu-serving-router:30081", who="", where="h")
    assert roll.stops_a_routed_server(member, "u", "gpu-serving-router:30080", who="", where="h") is None
    assert roll.stops_a_routed_server(parse_serving(stdout).serving, "u", "", who="", where="h") is None


def test_a_fleet_members_unit_names_its_router_and_a_one_host_unit_does_not():
    from components.core.config import parse_settings
    from components.core.unit import ROUTED_KEY, render_unit

    fleet = parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8},
                                   "hosts": [{"name": "gpu1", "rehearsal": "a"}, {"name": "gpu2", "rehearsal": "b"}],
                                   "router": {"runsOn": "gpu1", "port": 30081}})
    for _, settings in fleet.per_host():
        assert f"\n{ROUTED_KEY}=gpu-serving-router:30081\n" in render_unit(settings).text
    one = parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8}})
    assert ROUTED_KEY not in render_unit(one).text
