"""`readiness.fitness` in the switch (components/remote/fitness_gate.py, called by the switch
executor once every node is planned): over the fake transport of tests/test_switch_executor.py,
a drifted host under `refuse` is refused before any command that changes it; `warn` starts and
says what changed; a host never benchmarked is read with one `cat` and started."""
from __future__ import annotations

import pytest

from components.core import readiness as R
from components.remote import ssh

from ..casedata import cases
from ..core.test_fitness_read import answer
from ..test_switch_executor import PLANS, Host, run_switch  # noqa: F401 - run_switch is the fixture

CASE = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
DRIFTED = answer(dict(cases("fitness-read"))["power-cap-and-link-refused"])


def test_refuse_stops_the_switch_before_any_command_that_changes_the_host(run_switch):
    plan, changes, outs, error, _ = run_switch(CASE, more={"readiness": {"fitness": "refuse"}, "stack": "ep8"},
                                               host=Host(CASE, fitness=DRIFTED))
    assert plan.starts is not None and isinstance(error, ssh.RemoteError) and outs is None
    assert changes == []  # nothing stopped, nothing started, nothing enabled: the old server keeps its MainPID
    message = str(error)
    assert message.startswith("readiness.fitness is refuse and root@10.213.0.2:22's fitness drifted since the benchmark "
                              "of 2026-12-01 (tp8): GPU 0 (00000000:00:06.0): PCIe link Gen5 x16 -> Gen5 x8; "
                              "GPU 1 (00000000:00:07.0): power limit 700 W -> 450 W. Nothing was stopped: stack ep8 was "
                              "not started."), message
    assert run_switch.host.reads == ["fitness if-baseline"]


def test_warn_starts_and_says_what_changed(run_switch, capsys):
    plan, changes, outs, error, _ = run_switch(CASE, more={"stack": "ep8"}, host=Host(CASE, fitness=DRIFTED))
    assert error is None and outs["readinessReport"]["status"] == R.READY
    assert changes == [str(s) for s in plan.steps]  # the switch as planned
    said = capsys.readouterr().err
    assert ("warning: root@10.213.0.2:22's fitness drifted since the benchmark of 2026-12-01 (tp8): GPU 0 (00000000:00:06.0): "
            "PCIe link Gen5 x16 -> Gen5 x8; GPU 1 (00000000:00:07.0): power limit 700 W -> 450 W; starting anyway "
            "(readiness.fitness: warn)") in said


@pytest.mark.parametrize("policy", ["warn", "refuse"])
def test_a_host_never_benchmarked_starts_under_either_policy(run_switch, capsys, policy):
    plan, changes, outs, error, _ = run_switch(CASE, more={"readiness": {"fitness": policy}})
    assert error is None and changes == [str(s) for s in plan.steps]
    assert run_switch.host.reads == ["fitness if-baseline"] and "fitness" not in capsys.readouterr().err


def test_nothing_is_read_when_nothing_starts(run_switch):
    case = dict(PLANS)["serving-unchanged-is-a-noop"]
    _, _, _, error, _ = run_switch(case, more={"readiness": {"fitness": "refuse"}}, host=Host(case, fitness=DRIFTED))
    assert error is None and run_switch.host.reads == []
