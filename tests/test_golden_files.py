"""The golden files (units, docs/flags.md, the watch's Prometheus text and systemd pair) are
rewritten only by hand: UPDATE_GOLDEN=1 is refused when CI is set, with a message saying why,
and every golden test asks casedata.update_golden rather than reading the variable itself."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .casedata import update_golden

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_update_golden_is_refused_when_ci_is_set(monkeypatch, ci):
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=rf"UPDATE_GOLDEN is set with CI={ci}: golden files are rewritten by "
                                                    "hand and reviewed, never in CI"):
        update_golden()


@pytest.mark.parametrize("ci", [None, "", "0", "false"])
def test_update_golden_by_hand_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)
    assert update_golden() is False
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    assert update_golden() is True


def test_no_golden_test_reads_update_golden_itself():
    """A test that read os.environ["UPDATE_GOLDEN"] itself would rewrite its files in CI too."""
    reads = re.compile(r"environ[^\n]*UPDATE_GOLDEN|getenv\([^)]*UPDATE_GOLDEN")
    own = [p.relative_to(TESTS).as_posix() for p in sorted(TESTS.rglob("*.py"))
           if p.name != "casedata.py" and p != Path(__file__).resolve() and reads.search(p.read_text())]
    assert own == [], f"read UPDATE_GOLDEN through tests/casedata.py's update_golden(): {own}"
    users = [p.name for p in sorted(TESTS.glob("test_*.py")) if "update_golden()" in p.read_text()]
    # The golden tests there are (not blind: a scan that found none would pass anything).
    assert {"test_flags.py", "test_units.py", "test_multinode_plan.py", "test_pd_plan.py", "test_router.py",
            "test_watch_cases.py"} <= set(users), users
