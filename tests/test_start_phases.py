"""A start's phases from the journal (components/core/start_phases.py), one JSON file a case."""
import pytest

from components.core import start_phases as P

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("start-phases"), ids=lambda x: x if isinstance(x, str) else "")
def test_phases(name, case):
    entries = P.entries_from_journal_json(case["journal"])
    record = P.phases(entries, host="gpu1", stack="pp8", layout="pp8", started_at=case["started_at"])
    expect = case["expect"]
    assert record.total == expect["total"] and record.load_reported == expect["load_reported"]
    assert record.phases == pytest.approx(expect["phases"], abs=0.01)


def test_the_store_keeps_the_newest_per_host_and_layout():
    text = ""
    for i in range(5):
        text = P.add_record(text, P.StartRecord("gpu1", "pp8", "pp8", 1000.0 + i, 400.0 + i, {"load": 300.0}), keep=3)
    text = P.add_record(text, P.StartRecord("gpu1", "tp8", "tp8", 999.0, 90.0), keep=3)
    kept = P.parse_records(text + "not json\n")
    assert [(r.layout, r.started_at) for r in kept] == [("tp8", 999.0), ("pp8", 1002.0), ("pp8", 1003.0), ("pp8", 1004.0)]
