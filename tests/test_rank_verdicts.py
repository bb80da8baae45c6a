"""Multi-node readiness (issue 17): rank 0's verdict and every other rank judged by its unit and
journal only (readiness.judge_ranks), one JSON case a file (tests/data/ranks/)."""
import pytest

from components.core import readiness as R

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("ranks"), ids=lambda x: x if isinstance(x, str) else "")
def test_rank_case(name, case):
    baseline = R.UnitState(**case["baseline"])
    ranks = [R.RankState(r["rank"], r["host"], R.rank_problem(baseline, R.UnitState(**r["now"])), r["joined"])
             for r in case["ranks"]]
    status, reason, culprit = R.judge_ranks(case["rank0"]["status"], case["rank0"]["reason"], ranks)
    assert (status, reason, culprit) == (case["expect"]["status"], case["expect"]["reason"], case["expect"]["culprit"])


def test_a_rank_is_never_judged_by_http():
    # The verdict takes no HTTP answer of a rank >= 1 at all: its fields are unit state and journal.
    assert set(R.RankState.__dataclass_fields__) == {"rank", "host", "problem", "joined"}
