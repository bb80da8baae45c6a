"""The docs stay a front door and a set of topic pages that hold together: README.md stays short
(the topics live in docs/, one page each), and every relative link of README.md and docs/*.md
reaches a file that exists and, for `#anchor`, a heading whose GitHub anchor it is.
Anchor cases in tests/data/docs/; the reader is tests/docs_links.py."""
from __future__ import annotations

import subprocess

import pytest

from tests import docs_links as D
from tests.casedata import cases

README_MAX_LINES = 450
CASES = cases("docs")


def test_the_readme_stays_a_front_door():
    lines = (D.REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move a topic to its page in docs/ "
        "(docs/CONVENTIONS.md, \"Where topics live\") and link it from the README")


def test_every_relative_link_of_the_docs_reaches_a_file_and_a_heading():
    assert D.broken() == []


def test_the_docs_link_their_pages():
    # The reader is not blind on the real docs: the README links every topic page it moved out,
    # and anchors into other pages are among what it checks.
    readme = {link.target for link in D.links(D.REPO / "README.md")}
    for page in ("readiness", "choosing-a-strategy", "configuration", "fleets-and-router", "multi-node",
                 "teams-and-watch", "real-hosts", "rehearsal-host", "benchmarks", "performance-internals"):
        assert f"docs/{page}.md" in readme, page
    every = [link for path in D.documents() for link in D.links(path)]
    assert any(".md#" in link.target for link in every)


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_headings_get_githubs_anchors(name, case):
    text = case.get("text") or "\n\n".join(h if h.startswith("#") else f"## {h}" for h in case["headings"])
    assert D.anchors(text) == case["anchors"], case["about"]


def test_a_missing_file_or_heading_is_named(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section: `with code`\n")
    page.write_text("\n".join([
        "# Page",
        "[ok](other.md#a-section-with-code) [ok too](#page) [web](https://example.org/x.md)",
        "[gone](missing.md) [no heading](other.md#no-such-section) [here](#nowhere)",
        "`[in code](missing-too.md)`",
        "```",
        "[in a block](missing-three.md)",
        "```",
        "![picture](img/none.png)",
    ]) + "\n")
    found = {link.target: D.problem(link) for link in D.links(page)}
    assert found == {
        "other.md#a-section-with-code": None,
        "#page": None,
        "missing.md": "missing.md does not exist",
        "other.md#no-such-section": "other.md has no heading whose anchor is #no-such-section",
        "#nowhere": "page.md has no heading whose anchor is #nowhere",
        "img/none.png": "img/none.png does not exist",
    }


def test_no_committed_stack_file_carries_a_passphrase_salt():
    """A salt made with the default passphrase, committed, stops a team's `stack select --create`
    at 'incorrect passphrase' (issue 36.11); the e2e runs write one into the working copy, so a
    careless `git add` brings it back. Read as git's index holds each file (what a clone gets)."""
    listed = subprocess.run(["git", "-C", str(D.REPO), "ls-files", "--", "Pulumi.*.yaml"],
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert listed, "no stack file tracked"
    salted = [name for name in listed
              if "encryptionsalt:" in subprocess.run(["git", "-C", str(D.REPO), "show", f":{name}"], capture_output=True,
                                                     text=True, timeout=60, check=True).stdout]
    assert salted == []
