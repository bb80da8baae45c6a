"""Issue 36.14: `python -m components status` as a probe (components/core/status_verdict.py): the
exit status and summary from what it read. Cases in tests/data/status-verdict/."""
from __future__ import annotations

import re

import pytest

from components.core import status_verdict as V
from tests.casedata import cases

CASES = cases("status-verdict")


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_the_exit_status_and_the_summary(name, case):
    doc = V.summarize(case["hosts"], asked_for_a_stack=case["asked_for_a_stack"])
    assert doc["exit"] == case["exit"]
    assert doc["summary"] == case["summary"]


def test_each_finding_has_its_own_exit_status_and_none_is_zero():
    codes = (V.EXIT_DRIFT, V.EXIT_NOT_READ, V.EXIT_NOTHING_SERVES, V.EXIT_NOT_READY)
    assert len(set(codes)) == 4 and V.EXIT_AS_DECLARED == 0 and 0 not in codes
    assert sorted(V.EXIT_ORDER) == sorted(codes)
    # Every exit status is a case of its own.
    assert {c["exit"] for _, c in CASES} == {V.EXIT_AS_DECLARED, *codes}


def test_the_readme_documents_every_exit_status():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("### What serves: `python -m components status`"):]
    section = re.split(r"\n#{1,3} ", section[5:], maxsplit=1)[0]  # up to the next heading
    for code, words in ((V.EXIT_AS_DECLARED, "serves, ready"), (V.EXIT_DRIFT, "drift"), (V.EXIT_NOT_READ, "could not read"),
                        (V.EXIT_NOTHING_SERVES, "nothing serves"), (V.EXIT_NOT_READY, "not ready")):
        assert f"| {code} | " in section and words in section.split(f"| {code} | ")[1].split("\n")[0], code
