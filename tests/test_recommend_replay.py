"""Trace replay of the recommendation (components/core/recommend.py), pure and fast: a load trace
(tests/data/recommend/*.json) ticks through the watch's window (core/workload.py) and the
recommendation over the seed's measured curves (tests/data/compare/seed); with `apply`, each
recommended switch is taken, as `watch --apply` would, and the next ticks see the new stack."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core import compare
from components.core import recommend as RC
from components.core import workload as W

DATA = Path(__file__).parent / "data"
CASES = sorted((DATA / "recommend").glob("*.json"))


def policy_of(doc: dict) -> RC.Policy:
    return RC.Policy(horizon_seconds=doc["horizonMinutes"] * 60, hysteresis_percent=doc["hysteresisPercent"],
                     min_dwell_seconds=doc["minDwellMinutes"] * 60, switch_seconds=doc["switchMinutes"] * 60)


def ticks(case: dict):
    """(minute, concurrency) per tick; a segment's list of concurrencies alternates tick by tick."""
    minute, step = 0, case["tick_minutes"]
    for segment in case["trace"]:
        levels = segment["concurrency"] if isinstance(segment["concurrency"], list) else [segment["concurrency"]]
        for k in range(segment["minutes"] // step):
            yield minute, levels[k % len(levels)]
            minute += step


def replay(case: dict):
    curves = RC.curves_from(compare.load(DATA / case["results"], ["tp8", "pp8"]))
    policy = policy_of(case["policy"])
    serving, last_switch, window = case["start"], None, []
    log = []
    for minute, c in ticks(case):
        now = minute * 60.0
        obs = W.Observation(at=now, seconds=case["tick_minutes"] * 60.0, hosts=1, in_flight=c, concurrency=c,
                            request_rate=None, input_len=None, output_len=None, basis="gauges")
        window = W.keep(window, obs, case["window_minutes"] * 60)
        summary = W.summarize(window)
        rec = RC.recommend(serving, curves, summary.concurrency, policy=policy, now=now, last_switch_at=last_switch)
        if rec.action == RC.SWITCH and case["apply"]:
            serving, last_switch = rec.recommended, now
        log.append((minute, serving, rec))
    return log


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_trace_replay(path):
    case = json.loads(path.read_text())
    expect = case["expect"]
    log = replay(case)
    switches = [m for m, _, rec in log if rec.action == RC.SWITCH]
    serving_at = {m: s for m, s, _ in log}
    for point in expect.get("serving", []):
        assert serving_at[point["minute"]] == point["stack"], [(m, s, r.line()) for m, s, r in log if r.action == RC.SWITCH]
    if "switches" in expect:
        assert len(switches) == expect["switches"], [(m, r.line()) for m, _, r in log if r.action == RC.SWITCH]
    if "min_switches" in expect:
        assert len(switches) >= expect["min_switches"], len(switches)
    if "max_switches_per_dwell" in expect:
        dwell = case["policy"]["minDwellMinutes"]
        worst = max((sum(1 for s in switches if t <= s < t + dwell) for t in switches), default=0)
        assert worst <= expect["max_switches_per_dwell"], switches
    if "reason_contains" in expect:
        assert any(expect["reason_contains"] in rec.reason for _, _, rec in log), log[-1][2].reason
    for stack, basis in expect.get("recommended_at_least_once", {}).items():
        assert any(rec.recommended == stack and rec.action == RC.SWITCH and
                   next(f for f in rec.figures if f.stack == stack).basis == basis for _, _, rec in log), stack


def test_the_seed_curves_interpolate_between_measured_levels():
    curves = {c.stack: c for c in RC.curves_from(compare.load(DATA / "compare/seed/results/bench", ["tp8", "pp8"]))}
    at32 = RC.expected(curves["tp8"], 32)
    assert at32.basis == RC.MEASURED and at32.tok_s == pytest.approx(808, rel=0.01)
    at24 = RC.expected(curves["tp8"], 24)
    assert at24.basis == RC.INTERPOLATED and 455 < at24.tok_s < 808 and "C=16 and C=32" in at24.detail
    # Three hosts behind the router share 96 requests: 32 each, three times the throughput.
    assert RC.expected(curves["tp8"], 96, hosts=3).tok_s == pytest.approx(3 * at32.tok_s)
    # Beyond the measured levels, the advisor's estimate, labelled; else the nearest level, labelled.
    beyond = RC.Curve("pp8", "PP8", curves["pp8"].measured, {64: 396.0, 128: 420.0})
    assert RC.expected(beyond, 100).basis == RC.ESTIMATE and "advisor's estimate" in RC.expected(beyond, 100).detail
    assert RC.expected(curves["pp8"], 100).basis == RC.NEAREST


def test_a_stack_with_only_estimates_is_labelled_and_compared():
    curves = RC.curves_from(compare.load(DATA / "compare/seed/results/bench", ["tp8", "pp8"]),
                            estimates={"ep8": {1: 20.0, 64: 2000.0}}, strategies={"ep8": "EP8"})
    rec = RC.recommend("tp8", curves, 40, policy=RC.Policy(switch_seconds=60))
    assert rec.action == RC.SWITCH and rec.recommended == "ep8"
    assert "advisor's estimate" in rec.reason
    figures = {f.stack: f for f in rec.figures}
    assert figures["ep8"].basis == RC.ESTIMATE and figures["tp8"].basis == RC.INTERPOLATED


def test_no_load_observed_recommends_nothing():
    rec = RC.recommend("tp8", [], None)
    assert rec.action == RC.STAY and "no load observed" in rec.reason
