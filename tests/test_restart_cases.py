"""The line a preview prints before an `up` restarts the model that serves (components/core/
restart.py, issue 36.3), as data: the stored state and the declaration in, the line (or none)
out (tests/data/restart/*.json). A secret's value never appears in it."""
import json

import pytest

from components.core.restart import restart_notice

from .casedata import cases

CASES = cases("restart")


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_restart_notice(name, case):
    said = restart_notice(case["olds"], case["news"], label=case["label"], host=case["host"],
                          running_now=lambda: case["running_now"])
    assert said == case["expect"]
    secrets = [v for props in (case["olds"] or {}, case["news"]) for v in (props.get("secretEnvironment") or {}).values()]
    assert not any(s in (said or "") for s in secrets)


def test_every_restart_the_switch_plan_makes_of_a_serving_unit_is_said():
    """The notice and the switch's own decision (switch.why_restart) agree: for each case in which
    the unit serves, a line exactly when the update restarts it."""
    from components.core.switch import why_restart
    for name, case in CASES:
        olds = case["olds"]
        if not olds or olds.get("runningServer") != "as declared" and not olds["runningServer"].startswith("the running"):
            continue
        if case["news"].get("active") is False:
            continue
        restarts = why_restart(olds, case["news"], lambda: case["running_now"]) is not None
        assert restarts == (case["expect"] is not None), (name, json.dumps(case)[:300])
