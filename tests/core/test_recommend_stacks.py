"""components/core/recommend_stacks.py: what the recommendation of a project's stack gathers.

- A switch's cost from each host's recorded starts (core/switch_cost.py's forecast), the slowest
  host pricing the batch; without a figure for every host, the configured one (cases
  tests/data/recommend-costs/).
- The candidates: the stacks on the same machines, only those autoswitch.candidates lists.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from components.core import recommend as RC
from components.core import recommend_stacks as RS
from components.core.start_phases import StartRecord
from tests.casedata import DATA, cases

ROOT = Path(__file__).resolve().parents[2]


def starts_of(case: dict) -> dict[str, list[StartRecord]]:
    return {host: [StartRecord(**r) for r in records] for host, records in case["starts"].items()}


@pytest.mark.parametrize("name,case", cases("recommend-costs"), ids=lambda x: x if isinstance(x, str) else "")
def test_forecast_costs(name, case):
    costs = RS.forecast_costs(starts_of(case), case["source"], case["targets"])
    assert sorted(costs) == sorted(case["expect"]), case["why"]
    for stack, want in case["expect"].items():
        assert (costs[stack].basis, costs[stack].seconds) == (want["basis"], want["seconds"])
        assert want["text_contains"] in costs[stack].text


@pytest.fixture
def project(tmp_path):
    for p in ROOT.glob("Pulumi*.yaml"):
        shutil.copy(p, tmp_path / p.name)
    shutil.copytree(DATA / "compare" / "seed" / "results", tmp_path / "results")
    return tmp_path


def test_the_recommendation_prices_the_switch_from_the_hosts_starts_else_the_configured_figure(project):
    case = dict(cases("recommend-costs"))["every-host-has-starts-the-slowest-host-prices-the-batch"]
    # The project's one-host stacks: its host's starts, under the name the watch reads them by.
    starts = {"rehearsal:default": starts_of(case)["gpu2"]}
    priced = RS.build(project, "tp8", 1.0, results=Path("results/bench"), now=0.0, starts=starts)
    assert priced.action == RC.SWITCH and priced.recommended == "pp8"
    assert priced.cost is not None and (priced.cost.basis, priced.cost.seconds) == ("history", 400.0)
    configured = RS.build(project, "tp8", 1.0, results=Path("results/bench"), now=0.0)
    assert configured.cost is not None and configured.cost.basis == "configured"
    assert configured.cost_tokens is not None and priced.cost_tokens is not None
    assert priced.cost_tokens < configured.cost_tokens  # 400 s against the default 15 min


def test_autoswitch_candidates_limit_the_stacks_compared(project):
    every = {f.stack for f in RS.build(project, "tp8", 40.0, results=Path("results/bench"), now=0.0).figures}
    assert {"tp8", "pp8", "ep8"} <= every
    doc = yaml.safe_load((project / "Pulumi.yaml").read_text())
    doc["config"]["gpu-serving:autoswitch"] = {"value": {"candidates": ["tp8", "pp8"]}}
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    limited = {f.stack for f in RS.build(project, "tp8", 40.0, results=Path("results/bench"), now=0.0).figures}
    assert limited == {"tp8", "pp8"}
