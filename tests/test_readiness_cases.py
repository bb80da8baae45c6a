"""Readiness verdicts and layout comparison, one JSON file a case (tests/data/readiness, layout)."""
import pytest

from components import readiness as R

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("readiness"), ids=lambda x: x if isinstance(x, str) else "")
def test_verdict_sequence(name, case):
    observations = [R.Observation(elapsed=o["elapsed"], unit=R.UnitState(**o["unit"]), health=o["health"],
                                  logged_ready=o.get("logged_ready", False)) for o in case["observations"]]
    baseline = observations[0].unit if not case.get("ever_healthy") else R.UnitState("active", "running", 100, 0)
    phases, verdict = [], None
    for obs in observations:
        verdict = R.judge(baseline, obs, case["deadline"], case.get("ever_healthy", False), case.get("unhealthy_after"))
        phases.append(verdict.phase)
        if verdict.outcome:
            break
    expect = case["expect"]
    assert verdict.outcome == expect["outcome"], verdict
    if "phases" in expect:
        assert phases == expect["phases"]
    if "reason_contains" in expect:
        assert expect["reason_contains"] in verdict.reason


@pytest.mark.parametrize("name,case", cases("layout"), ids=lambda x: x if isinstance(x, str) else "")
def test_layout_comparison(name, case):
    assert R.compare_layout(case["declared"], case["server_info"]) == case["mismatches"]


def test_backoff_grows_to_the_cap():
    pauses, p = [], 0.0
    for _ in range(10):
        p = R.next_poll(p, 2, 30)
        pauses.append(p)
    assert pauses[0] == 2 and pauses[-1] == 30 and pauses == sorted(pauses)
