"""components/core/autoswitch_apply.py, pure: whether a switch between two of the project's stacks
rolls (the shipped stacks: a one-host pair does not; a fleet to its prefill/decode pair is an
outage), and the decision log read back whole after a torn write. The apply step itself:
tests/test_autoswitch_apply.py."""
from __future__ import annotations

import json
from pathlib import Path

from components.core import autoswitch_apply as AP
from components.core.plan import check_stack
from components.core.stack_config import from_files

ROOT = Path(__file__).resolve().parents[2]


def settings(stack: str):
    return check_stack(stack, from_files(ROOT, stack), ROOT).settings


def test_a_fleet_to_its_prefill_decode_pair_is_an_outage_and_one_host_has_no_router():
    behind, outage = AP.rolls(settings("tp8x2"), settings("pd1p1d"))
    assert behind and outage is not None and outage.startswith("pd1p1d is a prefill/decode stack")
    assert AP.rolls(settings("tp8"), settings("pp8")) == (False, None)


def test_the_log_survives_a_torn_line_and_keeps_the_newest():
    records = [{"at": float(k), "from": "pp8", "to": "tp8", "applied": False} for k in range(AP.KEEP_RECORDS + 3)]
    text = AP.render_log(records) + '{"at": 99999, "from": "pp8", "to'  # a write cut short
    back = AP.parse_log(text)
    assert [r["at"] for r in back] == [float(k) for k in range(3, AP.KEEP_RECORDS + 3)]
    assert all(json.loads(line) for line in AP.render_log(back).splitlines())


def test_the_dwell_and_the_budget_count_every_switch_started_failed_ones_too():
    log = [{"at": 1.0, "applied": True, "switch": {"started": 10.0, "ok": True}},
           {"at": 2.0, "applied": False},
           {"at": 3.0, "applied": True, "switch": {"started": 30.0, "ok": False}}]
    assert AP.switch_starts(log) == [10.0, 30.0] and AP.last_switch_at(log) == 30.0
    assert AP.last_switch_at([]) is None
