"""The fitness baseline (components/core/fitness_baseline.py): a benchmark's recorded fitness
against the host's now, on the real H200 report with a case's edits (tests/data/fitness/)."""
from __future__ import annotations

import pytest

from components.core import bench_results
from components.core import fitness as FIT
from components.core import fitness_baseline as FB

from .casedata import DATA, cases
from .test_facts import edited


def reading(side):
    """A side of a case: null (never read), or a real report (fixture) with edits, and the NCCL
    and IOMMU sections as the facts script prints them."""
    if side is None:
        return None
    xml = edited((DATA / side["fixture"]).read_text(), side.get("edit", []))
    read = FIT.parse_fitness(xml, side.get("nccl", ""), side.get("iommu", ""))
    # The serving venv's distributions (a benchmark's baseline adds the NCCL torch loads).
    return FIT.with_venv_nccl(read, side["packages"]) if "packages" in side else read


@pytest.mark.parametrize("name,case", cases("fitness"), ids=lambda x: x if isinstance(x, str) else "")
def test_fitness_case(name, case):
    then, now = reading(case["baseline"]), reading(case["now"])
    changes = FB.compare(then.as_dict() if then else None, now)  # the baseline as meta.json holds it
    expect = case["expect"]
    if expect["changes"] is None:
        assert changes is None
        assert FB.verdict("refuse", "gpu1", changes, "the baseline", "ep8") == (None, None)  # unknown is never refused
        return
    assert [c.text() for c in changes] == expect["changes"]
    if changes:
        assert FB.not_comparable(changes) == expect["not_comparable"]
        drift = FB.drift_message(case["host"], changes, case["since"])
        assert drift == expect["drift"] and FB.is_fitness_drift(drift)
    refusal, warning = FB.verdict(case.get("policy", "warn"), case.get("host", "gpu1"), changes, case.get("since", ""),
                                  case.get("stack", "ep8"))
    assert (refusal, warning) == (expect.get("refusal"), expect.get("warning"))


def test_the_baseline_is_the_newest_run_on_that_host_that_recorded_fitness():
    fit = reading({"fixture": "nvidia/h200-2gpu-nvlink/nvidia-smi-q.xml"}).as_dict()
    runs = [bench_results.parse_run("tp8", folder, meta, {}) for folder, meta in (
        ("20261201T100000Z", {"host": "10.0.0.5 (gpu1)", "fitness": fit}),
        ("20261202T100000Z", {"host": "10.0.0.6 (gpu2)", "fitness": fit}),
        ("20261203T100000Z", {"host": "10.0.0.5 (gpu1)"}),  # recorded before fitness was read
    )]
    assert FB.baseline_of(runs, "10.0.0.5 (gpu1)").folder == "20261201T100000Z"
    assert FB.baseline_of(runs, "10.0.0.7") is None
    assert runs[0].fitness == fit and runs[2].fitness is None


@pytest.mark.parametrize("value,ok", [("warn", "warn"), ("refuse", "refuse"), ("REFUSE", None), ("refuse\n", None),
                                      ("ignore", None), (True, None), (None, None)])
def test_the_policy_is_warn_or_refuse(value, ok):
    if ok:
        assert FB.check_policy(value) == ok
    else:
        with pytest.raises(ValueError, match="is not warn or refuse: warn .the default. starts on a machine whose fitness"):
            FB.check_policy(value)
