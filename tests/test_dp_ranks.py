"""The per-DP-rank verdict (components/core/dp_ranks.py), one JSON file a case."""
import pytest

from components.core import dp_ranks as D
from components.core.readiness import OUTCOMES

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("dp-ranks"), ids=lambda x: x if isinstance(x, str) else "")
def test_verdict(name, case):
    probes = [D.RankProbe(**p) for p in case["probes"]]
    verdict = D.judge(case["dp_size"], probes, case.get("internal_states"))
    assert (verdict.outcome, verdict.reason, list(verdict.dead)) == (
        case["expect"]["outcome"], case["expect"]["reason"], case["expect"]["dead"])
    assert verdict.outcome in OUTCOMES


def test_the_probe_is_routed():
    assert D.probe_request(3)["routed_dp_rank"] == 3
