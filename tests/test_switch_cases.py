"""The switch decision (components/core/switch.py) as data: the units a host has in, the steps out
(tests/data/switch/*.json), and the parser of the script that lists them."""
import pytest

from components.core.switch import MANAGED_UNITS_SCRIPT, decide, parse_managed_units
from components.core.unit import MARKER_KEY

from .casedata import cases

DECISIONS = [(n, c) for n, c in cases("switch") if "expect" in c]
OUTPUTS = [(n, c) for n, c in cases("switch") if "stdout" in c]


@pytest.mark.parametrize("name,case", DECISIONS, ids=[n for n, _ in DECISIONS])
def test_switch_decision(name, case):
    steps = decide(case["unit"], case["units"], restart=case["restart"], active=case.get("active", True),
                   enabled=case.get("enabled", True))
    assert steps.as_dict() == case["expect"]


@pytest.mark.parametrize("name,case", OUTPUTS, ids=[n for n, _ in OUTPUTS])
def test_managed_units_parser(name, case):
    assert parse_managed_units(case["stdout"]) == case["units"]


def test_the_script_finds_units_by_marker_and_by_the_older_header():
    # The units written before the marker carry only the header; both must be found.
    assert f"'^{MARKER_KEY}='" in MANAGED_UNITS_SCRIPT
    assert "'^# Managed by gpu-serving [(]stack '" in MANAGED_UNITS_SCRIPT
