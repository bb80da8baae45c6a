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


def test_a_rank_that_has_not_joined_is_named_while_rank_0_loads():
    # Issue 36.9: named at the first look, not after rank 0's deadline; one that stopped before
    # joining ends the wait (rank 0 can never be ready without it).
    note, pointless = R.ranks_waited_for(["rank 1 on node1 (10.213.1.2)"], [])
    assert note.startswith("waiting for rank 1 on node1 (10.213.1.2) to join") and R.JOINED_LINE in note
    assert pointless is None
    note, pointless = R.ranks_waited_for(["rank 1 on node1 (a)"], ["rank 2 on node2 (b): its unit is failed (exit-code, exit status 1)"])
    assert "rank 2 on node2 (b)" in note and "rank 1" not in note
    assert pointless == "rank 2 on node2 (b): its unit is failed (exit-code, exit status 1), before it joined rank 0"
    assert R.ranks_waited_for([], []) == ("every rank joined", None)


def test_status_judges_a_running_rank_by_its_journal_not_its_http_answer():
    assert R.rank_now(1, 2, joined=True) == (R.READY, "")
    status, reason = R.rank_now(1, 2, joined=False)
    assert status == R.LOADING and "rank 1 of 2 has not joined rank 0" in reason and R.JOINED_LINE in reason
