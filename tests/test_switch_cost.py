"""The switch-cost forecast (components/core/switch_cost.py), one JSON file a case."""
import pytest

from components.core import switch_cost as C
from components.core.start_phases import StartRecord

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("switch-cost"), ids=lambda x: x if isinstance(x, str) else "")
def test_forecast(name, case):
    history = [StartRecord(**r) for r in case["history"]]
    f = C.forecast(history=history, **case["args"])
    expect = case["expect"]
    assert (f.basis, f.text) == (expect["basis"], expect["text"])
    assert f.seconds == (pytest.approx(expect["seconds"], abs=0.1) if expect["seconds"] is not None else None)


def test_a_fleet_rolls_in_batches_with_the_capacity_left():
    per_host = {h: C.Forecast("history", s) for h, s in (("gpu1", 400.0), ("gpu2", 380.0), ("gpu3", 90.0), ("gpu4", None))}
    batches, text = C.roll(per_host, 2)
    assert [b.hosts for b in batches] == [("gpu1", "gpu2"), ("gpu3", "gpu4")]
    assert text.splitlines() == [
        "the roll takes unknown in 2 batch(es):",
        "batch 1 of 2 (gpu1, gpu2): ~6 m 40 s, 2 of 4 hosts serving meanwhile (50 % of the capacity)",
        "batch 2 of 2 (gpu3, gpu4): unknown (no forecast for a host), 2 of 4 hosts serving meanwhile (50 % of the capacity)"]
    _, text = C.roll({h: C.Forecast("history", 100.0) for h in ("a", "b", "c")}, 1)
    assert text.startswith("the roll takes ~5 m 00 s in 3 batch(es):") and "2 of 3 hosts serving meanwhile (66 %" in text


def test_durations_read_as_people_say_them():
    assert [C.duration(s) for s in (45, 400, 425.4, 3725)] == ["45 s", "6 m 40 s", "7 m 05 s", "1 h 02 m"]
