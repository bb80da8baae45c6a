"""`watch --apply`'s step (components/autoswitch_apply.py), on a two-host fleet behind the router
with the seed's curves, its real decision log and lock in a state directory: the switch is
applied only inside a window, never over drift, failed readiness, an unreachable host or a host
out of the router; the day's budget and the dwell come from the log; a failed switch is recorded
and counted; a second watch holding the lock keeps this one from deciding; the outcome is
measured once. Cases tests/data/autoswitch/apply/; the `up` is the test's own function recording
its calls (the real one, through the Automation API, is tests/e2e/test_router_roll.py's)."""
from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from components import autoswitch_apply as apply_step
from components.core import autoswitch_apply as AP
from components.core import recommend_stacks as RS
from components.core import watch as W
from components.traffic_watch import TrafficTick
from tests.casedata import DATA

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((DATA / "autoswitch" / "apply").glob("*.json"))
DAY = "2025-12-03"
HOSTS = {"gpu1": "rehearsal:r1", "gpu2": "rehearsal:r2"}


@pytest.fixture
def fleet(tmp_path):
    """tp8, pp8 and ep8 on two hosts behind the router on gpu1, with the seed's measured curves."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("Pulumi.yaml", "Pulumi.tp8.yaml", "Pulumi.pp8.yaml", "Pulumi.ep8.yaml"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(DATA / "compare" / "seed" / "results", project / "results")
    edit(project, {"gpu-serving:hosts": [{"name": n, "rehearsal": t.split(":")[1]} for n, t in HOSTS.items()],
                   "gpu-serving:router": {"runsOn": "gpu1"}})
    return project


def edit(project: Path, values: dict) -> None:
    path = project / "Pulumi.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"].update({k: {"value": v} for k, v in values.items()})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def tick_document(serving: str, overrides: dict, watched: tuple = ("pp8", "tp8")) -> dict:
    """The watch's tick: `serving` on both hosts, clean and ready, in the router; the other stack superseded."""
    stacks = []
    for stack in watched:
        hosts = []
        for entry, target in HOSTS.items():
            here = stack == serving
            h = {"host": target, "entry": entry, "state": "clean" if here else "superseded", "drifted": [], "switched": [],
                 "serving_here": here, "superseded": not here, "readiness": "ready" if here else None,
                 "ready": True if here else None, "router": {"in_router": True, "text": "in the router"} if here else None,
                 "error": None}
            h.update(overrides.get(stack, {}).get(entry, {}))
            hosts.append(h)
        stacks.append({"stack": stack, "error": None, "hosts": hosts})
    return {"version": 1, "checked_at_seconds": 0, "stacks": stacks}


def run(case: dict, fleet: Path, state: Path):
    now = datetime.fromisoformat(f"{DAY}T{case['now']}:00+00:00").timestamp()
    edit(fleet, {"gpu-serving:autoswitch": case["settings"]})
    serving = case.get("serving", "pp8")
    rec = RS.build(fleet, serving, 32.0, results=Path("results/bench"), now=now)
    group = {"stack": serving, "hosts": list(HOSTS.values()), "window": case.get("window", []),
             "summary": {"concurrency": 32.0, "output_tok_s": 680.0, "ticks": 3}}
    traffic = TrafficTick(doc={"groups": [group]}, recommendations={serving: rec})
    state.mkdir(parents=True, exist_ok=True)
    if case.get("log"):
        (state / AP.LOG_FILE).write_text(AP.render_log(case["log"]))
    before = {"autoswitch": {"groups": [{"stack": serving, "key": case["previous_key"]}]}} if "previous_key" in case else None
    calls: list[str] = []

    def up(project_dir, stack, log):
        calls.append(stack)
        log(f"watch: autoswitch: up {stack}: (the test's up)")
        return None if case["up"] == "ok" else "error: hosts[gpu1]: readiness timed_out"
    lines: list[str] = []
    doc = tick_document(serving, case.get("hosts", {}), tuple(case.get("watched", ("pp8", "tp8"))))
    if case.get("lock_held"):
        with apply_step.held(state / AP.LOCK_FILE) as mine:
            assert mine
            result = apply_step.step(fleet, doc, traffic, before, state, apply=case.get("apply", True), up=up,
                                     log=lines.append, now=now)
    else:
        result = apply_step.step(fleet, doc, traffic, before, state, apply=case.get("apply", True), up=up,
                                 log=lines.append, now=now)
    return result, calls, lines, rec


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_apply_step(path, fleet, tmp_path):
    case = json.loads(path.read_text())
    expect = case["expect"]
    state = tmp_path / "state"
    result, calls, lines, rec = run(case, fleet, state)
    assert calls == expect["up"], (case["why"], lines)
    records = AP.parse_log((state / AP.LOG_FILE).read_text()) if (state / AP.LOG_FILE).exists() else []
    new = records[len(case.get("log", [])):]
    assert len(new) == expect["new_records"], (case["why"], lines, new)
    if new:
        record = new[-1]
        assert record["applied"] is expect["applied"], record["why"]
        assert expect.get("why_contains", "") in record["why"]
        # What was expected, and what the watch saw when it decided: the record's numbers.
        assert record["expected"]["tok_s_after"] and record["expected"]["basis"] and record["observed"]["concurrency"] == 32.0
        assert [c["name"] for c in record["checks"]][:8] == ["recommended", "window", "dwell", "budget", "drift", "readiness",
                                                              "router", "outage"]
        if "switch_ok" in expect:
            assert record["switch"]["ok"] is expect["switch_ok"] and record["switch"]["finished"] >= record["switch"]["started"]
            assert (record["switch"]["error"] is None) is expect["switch_ok"]
    for want in expect.get("lines", []):
        assert any(want in line for line in lines), (want, lines)
    if not expect.get("lines", True):
        assert lines == []
    for want in expect.get("prometheus", []):
        assert want in result.prometheus, result.prometheus
    assert ("lock" in result.section) is bool(expect.get("lock"))
    if "section_why_contains" in expect:
        assert [g["to"] for g in result.section["groups"]] == ["tp8"]
        assert expect["section_why_contains"] in result.section["groups"][0]["decision"]["why"]
    if "outcome" in expect:
        outcome = records[0]["outcome"]
        for key, value in expect["outcome"].items():
            assert outcome[key] == pytest.approx(value), (key, outcome)
        # Measured once: the next tick leaves it as it is and says nothing.
        again, _, more, _ = run({**case, "log": records}, fleet, tmp_path / "again")
        assert AP.parse_log((tmp_path / "again" / AP.LOG_FILE).read_text())[0]["outcome"] == outcome
        assert not any("measured" in line for line in more), more
    # status.json's section keeps the group's decision, whichever way it went.
    json.dumps(result.section)


def test_the_recommendation_the_cases_apply_is_a_switch_to_tp8(fleet):
    """What every case above starts from: 32 requests over the two hosts on pp8, TP8 gains."""
    rec = RS.build(fleet, "pp8", 32.0, results=Path("results/bench"), now=0.0)
    assert rec.action == "switch" and rec.recommended == "tp8", rec.reason


def test_the_systemd_pair_of_an_applying_watch():
    files = W.render_systemd(checkout="/opt/gpu-serving", stacks=["tp8", "pp8"], every_seconds=600,
                             state_dir="/var/lib/gpu-serving-watch", env_file="/etc/gpu-serving/watch.env", apply=True)
    service = files["gpu-serving-watch.service"]
    assert "watch --once --stacks tp8,pp8 --state-dir /var/lib/gpu-serving-watch --apply" in service
    assert "never changes a host" not in service and "may switch to the recommended stack" in service
    # A roll cut short by systemd would leave a host out of the router: the up keeps its own deadlines.
    assert "TimeoutStartSec=infinity" in service
    plain = W.render_systemd(checkout="/opt/gpu-serving", stacks=["tp8"], every_seconds=600,
                             state_dir="/var/lib/gpu-serving-watch", env_file="/etc/gpu-serving/watch.env")
    assert "--apply" not in plain["gpu-serving-watch.service"] and "TimeoutStartSec=600" in plain["gpu-serving-watch.service"]
