"""gpu-serving:autoswitch (components/core/autoswitch.py): the guarded apply's decision, with data
cases (tests/data/autoswitch/decide.json), and its decision-log record with the measured outcome.
The settings' refusals are in the bad-input corpus (tests/data/bad-input/autoswitch-*.yaml)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from components.core import autoswitch as A
from components.core import recommend as RC

CASES = json.loads((Path(__file__).parent / "data" / "autoswitch" / "decide.json").read_text())


def t(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def recommendation(action: str) -> RC.Recommendation:
    figures = [RC.Expected("pp8", "PP8", 40, 363.0, None, None, RC.INTERPOLATED, "interpolated"),
               RC.Expected("tp8", "TP8", 40, 826.0, None, None, RC.INTERPOLATED, "interpolated")]
    if action == RC.SWITCH:
        return RC.Recommendation("pp8", RC.SWITCH, "tp8", "TP8 826 vs PP8 363", 40.0, 1, figures, 1.5e6, 3.3e5)
    return RC.Recommendation("pp8", RC.STAY, "pp8", "PP8 gives the most", 1.0, 1, figures)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["why"][:60])
def test_decide(case):
    state = case["state"]
    decision = A.decide(recommendation(case["action"]), A.parse(case["settings"]), now=t(case["now"]),
                        behind_router=state["behind_router"], drift=state.get("drift", []),
                        failed_readiness=state.get("failed_readiness", []),
                        switches=[t(s) for s in state.get("switches", [])],
                        last_switch_at=t(state["last_switch_at"]) if state.get("last_switch_at") else None,
                        outage=state.get("outage"))
    assert decision.apply is case["apply"], decision.why
    assert case["why_contains"] in decision.why
    # Every check is named, whichever way it went.
    assert [c.name for c in decision.checks] == ["recommended", "window", "dwell", "budget", "drift", "readiness", "router",
                                                 "outage"]


def test_the_log_record_says_why_what_was_expected_and_then_what_was_measured():
    rec = recommendation(RC.SWITCH)
    decision = A.decide(rec, A.parse({"windows": ["00:00-24:00"]}), now=t("2026-12-03T23:10:00Z"), behind_router=True,
                        drift=[], failed_readiness=[], switches=[], last_switch_at=None)
    record = A.log_record(rec, decision, now=t("2026-12-03T23:10:00Z"))
    assert record["applied"] and record["from"] == "pp8" and record["to"] == "tp8"
    assert record["expected"] == {"tok_s_before": 363.0, "tok_s_after": 826.0, "basis": RC.INTERPOLATED,
                                  "net_gain_tokens": 1.5e6, "cost_tokens": 3.3e5}
    assert record["outcome"] is None
    later = A.with_outcome(record, measured_tok_s=780.0, measured_before=350.0, at=t("2026-12-04T00:10:00Z"))
    assert later["outcome"]["of_expected_percent"] == pytest.approx(94.4)
    assert later["outcome"]["gain_percent"] == pytest.approx(122.9)
    assert json.loads(json.dumps(later)) == later


def test_the_settings_give_the_recommendation_its_policy():
    policy = A.parse({"horizonMinutes": 120, "hysteresisPercent": 5, "minDwellMinutes": 30, "switchMinutes": 12}).policy()
    assert policy == RC.Policy(horizon_seconds=7200, hysteresis_percent=5, min_dwell_seconds=1800, switch_seconds=720)
    assert A.parse(None) == A.AutoswitchSettings()
