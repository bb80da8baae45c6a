"""The switch plan (components/core/switch.py) as data: what the host has and what the stack
declares in, the ordered steps out (tests/data/switch/*.json), with the steps that undo a failed
start; the restart decision (switch/restart/), the port holder (switch/listeners/) and the parser
of the script that lists the units."""
import pytest

from components.core.switch import (
    ACTIONS,
    MANAGED_UNITS_SCRIPT,
    Step,
    foreign_listener,
    own_drop_ins,
    parse_managed_units,
    plan,
    why_restart,
)
from components.core.unit import MARKER_KEY

from .casedata import cases

PLANS = [(n, c) for n, c in cases("switch") if "declared" in c]
OUTPUTS = [(n, c) for n, c in cases("switch") if "stdout" in c]
RESTARTS = cases("switch/restart")
LISTENERS = cases("switch/listeners")


def _plan(case):
    d, h = case["declared"], case["host"]
    return plan(d["unit"], h["units"], restart=d["restart"], active=d["active"], enabled=d["enabled"],
                port_holder=h["port_holder"], port=d["port"], host=h["label"])


@pytest.mark.parametrize("name,case", PLANS, ids=[n for n, _ in PLANS])
def test_switch_plan(name, case):
    assert _plan(case).as_dict() == case["expect"]


def test_every_case_file_is_a_plan_or_a_listing():
    # A case file of another shape would be skipped by both tests above without a word.
    assert len(PLANS) + len(OUTPUTS) == len(cases("switch"))


def test_no_commands_cases_say_why():
    noops = [(n, c) for n, c in PLANS if not c["expect"]["steps"]]
    assert len(noops) >= 3
    for name, case in noops:
        assert case["expect"]["reason"], name
        assert case["expect"]["refused"] or "nothing to" in case["expect"]["reason"], name


@pytest.mark.parametrize("name,case", PLANS, ids=[n for n, _ in PLANS])
def test_plan_invariants(name, case):
    """What every plan keeps, whatever the host: the target starts after every other strategy
    stopped and before anything is enabled; only the target is enabled; a failure stops the target
    first and puts the files back before anything starts again."""
    p, unit = _plan(case), case["declared"]["unit"]
    kinds = [s.action for s in p.steps]
    assert all(s.action in ACTIONS for s in p.steps + p.on_failure)
    # One reload at most, first or right after the unit's drop-ins went (which always reload).
    lead = kinds.count("remove-drop-ins")
    assert kinds[:lead] == ["remove-drop-ins"] * lead and lead <= 1
    assert kinds.count("daemon-reload") <= 1 and kinds[lead + 1:].count("daemon-reload") == 0
    assert not lead or kinds[lead] == "daemon-reload"
    assert all(s.units == (unit,) for s in p.steps if s.action in ("enable", "start", "restart"))
    assert all(unit not in s.units for s in p.steps if s.action == "disable")
    if p.starts:
        at = p.steps.index(p.starts)
        assert all(i < at for i, s in enumerate(p.steps) if s.action == "stop")
        assert all(i > at for i, s in enumerate(p.steps) if s.action in ("enable", "disable"))
        assert p.on_failure[0] == Step("stop", (unit,))
        restore = p.on_failure.index(Step("restore-files"))
        assert all(i > restore for i, s in enumerate(p.on_failure) if s.action == "start")
        assert (p.rollback_to is None) == (not any(s.action == "start" for s in p.on_failure))
    else:
        assert p.on_failure == [] and p.rollback_to is None
    if p.refused:
        assert p.steps == [] and "nothing was stopped" in p.refused


def test_progress_line_names_what_stops():
    by_name = dict(PLANS)
    assert _plan(by_name["switch-stops-the-serving-one-and-disables-the-rest"]).progress == \
        "starting (stops sglang-kimi-k2.6-tp8.service)"
    assert _plan(by_name["started-by-hand-beside-the-serving-one-is-stopped"]).progress == \
        "serving (stops sglang-kimi-k2.6-ep8.service)"
    assert _plan(by_name["first-deploy-nothing-else"]).progress == "starting"
    assert _plan(by_name["serving-unchanged-is-a-noop"]).progress is None
    assert _plan(by_name["declared-stopped"]).progress is None


def test_an_unknown_step_is_refused():
    with pytest.raises(ValueError, match="unknown switch step 'reboot'"):
        Step("reboot")


@pytest.mark.parametrize("name,case", RESTARTS, ids=[n for n, _ in RESTARTS])
def test_why_restart(name, case):
    asked = []

    def running_now():
        asked.append(True)
        return case["running_now"]

    assert why_restart(case["olds"], case["news"], running_now) == case["expect"]
    # The process is read only for a state written by an earlier version (one more round trip).
    assert bool(asked) == case["reads_the_process"]


@pytest.mark.parametrize("name,case", LISTENERS, ids=[n for n, _ in LISTENERS])
def test_port_holder(name, case):
    assert foreign_listener(case["ss"], case["cgroups"], case["ours"]) == case["expect"]


@pytest.mark.parametrize("name,case", OUTPUTS, ids=[n for n, _ in OUTPUTS])
def test_managed_units_parser(name, case):
    assert parse_managed_units(case["stdout"]) == case["units"]


def test_the_script_finds_units_by_marker_and_by_the_older_header():
    # The units written before the marker carry only the header; both must be found.
    assert f"'^{MARKER_KEY}='" in MANAGED_UNITS_SCRIPT
    assert "'^# Managed by gpu-serving [(]stack '" in MANAGED_UNITS_SCRIPT


UNIT = "sglang-kimi-k2.6-ep8.service"


@pytest.mark.parametrize("path, own", [
    (f"/etc/systemd/system/{UNIT}.d/override.conf", True),            # systemctl edit
    (f"/run/systemd/system/{UNIT}.d/override.conf", True),            # systemctl edit --runtime
    (f"/etc/systemd/system.control/{UNIT}.d/50-CPUQuota.conf", True),  # systemctl set-property
    (f"/run/systemd/system.control/{UNIT}.d/50-MemoryMax.conf", True),
    ("/usr/lib/systemd/system/service.d/10-timeout-abort.conf", False),  # the OS's, for every service
    ("/etc/systemd/system/service.d/site.conf", False),                  # the site's, for every service
    ("/etc/systemd/system/sglang-.service.d/site.conf", False),          # every sglang- unit
    (f"/usr/lib/systemd/system/{UNIT}.d/vendor.conf", False),            # not under /etc or /run
    ("/etc/systemd/system/sglang-kimi-k2.6-tp8.service.d/override.conf", False),  # another strategy's
    (f"/etc/systemd/system/{UNIT}.d/notes.txt", False),              # systemd reads only *.conf
    (f"/etc/systemd/system/{UNIT}.d/../{UNIT}.d/x.conf", False),
    (f"{UNIT}.d/override.conf", False),                              # never a relative path
])
def test_own_drop_ins_are_the_units_own_under_etc_or_run(path, own):
    assert own_drop_ins(UNIT, path) == ([path] if own else [])


def test_own_drop_ins_reads_systemctls_space_separated_list():
    a, b = f"/etc/systemd/system/{UNIT}.d/a.conf", f"/etc/systemd/system/{UNIT}.d/b.conf"
    listed = f"/usr/lib/systemd/system/service.d/10-timeout-abort.conf {b} {a} {a}"
    assert own_drop_ins(UNIT, listed) == [a, b]
    assert own_drop_ins(UNIT, "") == []
