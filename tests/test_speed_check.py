"""The speed check's verdict (components/core/speed_check.py), one JSON file a case."""
from datetime import datetime

import pytest

from components.core import speed_check as S
from components.core.bench_results import Run, parse_level

from .casedata import cases


def run(doc) -> Run:
    levels = {lv["max_concurrency"]: parse_level(lv, doc["folder"]) for lv in doc["levels"]}
    time = datetime.fromisoformat(doc["time"].replace("Z", "+00:00"))
    return Run(doc["stack"], doc["folder"], time, doc["strategy"], doc["layout"], doc["host"], doc["model"],
               "0.5.23", doc["rehearsal"], levels)


@pytest.mark.parametrize("name,case", cases("speed-check"), ids=lambda x: x if isinstance(x, str) else "")
def test_verdict(name, case):
    base = S.baseline([run(d) for d in case["runs"]], host="10.213.3.2", layout="tp 8, pp 1, ep 8, dp 1",
                      model="kimi-k2.6", rehearsal=False)
    probe = {lv["max_concurrency"]: parse_level(lv, "probe") for lv in case["probe"]}
    verdict = S.judge(probe, base)
    expect = case["expect"]
    assert verdict.status == expect["status"], verdict.reason
    for text in expect["reason_contains"]:
        assert text in verdict.reason, verdict.reason
    if "baseline" in expect:
        assert verdict.baseline == expect["baseline"]
    assert S.action(verdict, "warn") == expect["action_warn"]
    assert S.action(verdict, "rollback") == expect["action_rollback"]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="minSpeedRatio"):
        S.judge({}, None, 1.5)
    with pytest.raises(ValueError, match="onPerfRegression must be warn or rollback"):
        S.action(S.SpeedVerdict("ok", ""), "ignore")
