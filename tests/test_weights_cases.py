"""The checkpoint's pure verdicts as data (tests/data/weights/): what a host's copy lacks and what
`up` fetches for it (check/), the full verify's verdict (verify/), the staging plan over a
fleet (staging/), the manifest from the Hub's file metadata (hub-manifest/). Adding a case is
adding a file."""
from __future__ import annotations

import json

import pytest

from components.core import weights as W
from components.core import weights_staging as S

from .casedata import cases

CHECKS = cases("weights/check")
VERIFIES = cases("weights/verify")
STAGINGS = cases("weights/staging")
HUB = cases("weights/hub-manifest")


def _manifest(props):
    return W.Manifest.from_props(props) if props else None


@pytest.mark.parametrize("name,case", CHECKS, ids=[n for n, _ in CHECKS])
def test_copy_check(name, case):
    read = W.parse_read(json.dumps(case["read"]))
    manifest = _manifest(case["manifest"])
    verified = {p: W.Seen(*v) for p, v in case["verified"].items()} if case["verified"] else None
    problems = W.check_copy(read, manifest, verified)
    expect = case["expect"]
    assert [p.as_dict() for p in problems] == expect["problems"]
    assert W.drift_lines(case["host"], problems) == expect["drift"]
    if manifest is not None:
        fix = W.repair(manifest, problems)
        assert fix.as_dict() == expect["repair"]
        assert W.space_refusal(case["host"], fix, read) == expect["space"]


@pytest.mark.parametrize("name,case", VERIFIES, ids=[n for n, _ in VERIFIES])
def test_full_verify(name, case):
    manifest = _manifest(case["manifest"])
    problems = W.verify_problems(manifest, case["answers"])
    assert [p.as_dict() for p in problems] == case["expect"]["problems"]
    assert W.repair(manifest, problems).as_dict() == case["expect"]["repair"]


def _plan(case):
    targets = {h: S.Target(tuple(v.get("files", ())), v.get("bytes", 0), v.get("refusal")) for h, v in case["hosts"].items()}
    if "failed" in case:
        return S.after_failure(case["source"], targets, set(case["done"]), set(case["failed"]), fanout=case["fanout"],
                               source_host=case["sourceHost"])
    return S.plan(case["source"], targets, fanout=case["fanout"], source_host=case["sourceHost"])


@pytest.mark.parametrize("name,case", STAGINGS, ids=[n for n, _ in STAGINGS])
def test_staging_plan(name, case):
    assert _plan(case).as_dict() == case["expect"]


@pytest.mark.parametrize("name,case", STAGINGS, ids=[n for n, _ in STAGINGS])
def test_staging_invariants(name, case):
    """Whatever the fleet: the source is read at most once, every host that lacks files gets one
    link, from a host that is already attached (or holds it), never from itself or a failed host;
    a refusal or a no-op says why and copies nothing."""
    p = _plan(case)
    failed = set(case.get("failed", ()))
    done = set(case.get("done", ()))
    needing = [h for h, v in case["hosts"].items() if v.get("files") and h not in failed and h not in done]
    if p.refused:
        assert p.links == [] and "nothing was copied" in p.refused
        return
    assert p.source_reads <= 1
    assert [link.target for link in p.links] == needing
    attached = {h for h, v in case["hosts"].items() if (not v.get("files") or h in done) and h not in failed}
    for link in p.links:
        assert link.origin != link.target and link.origin not in failed
        assert link.origin == S.SOURCE or link.origin in attached, link
        attached.add(link.target)
    if not p.links:
        assert "nothing to copy" in p.reason
    fanout = case["fanout"]
    for origin in {link.origin for link in p.links}:
        streams = sum(1 for link in p.links if link.origin == origin)
        assert streams <= (1 if origin == S.SOURCE else fanout), origin


@pytest.mark.parametrize("name,case", HUB, ids=[n for n, _ in HUB])
def test_manifest_from_the_hubs_metadata(name, case):
    try:
        m = W.manifest_from_hub(case["source"], case["entries"])
    except ValueError as exc:
        assert case["expect"] == {"error": str(exc)}
        return
    assert {"props": m.to_props(), "summary": m.summary()} == case["expect"]
    assert W.Manifest.from_props(m.to_props()) == m


def test_every_case_has_a_reason():
    for _, case in CHECKS + VERIFIES + STAGINGS + HUB:
        assert case["why"]


def test_a_manifest_refuses_what_would_reach_a_host_badly():
    for path in ("/etc/passwd", "a/../b", "a b", "a;b", "x\n", ".", "", "\u0661"):
        with pytest.raises(ValueError):
            W.FileEntry(path, 1)
    with pytest.raises(ValueError):
        W.FileEntry("a", -1)
    with pytest.raises(ValueError):
        W.FileEntry("a", 1, "ABC")
    with pytest.raises(ValueError):
        W.Manifest("x", (W.FileEntry("b", 1), W.FileEntry("a", 1)))


def test_hashes_found_by_a_verify_fill_in_only_what_was_unknown():
    m = W.Manifest("hub:o/n@" + "0" * 40, (W.FileEntry("config.json", 3), W.FileEntry("m.safetensors", 5, "a" * 64)))
    filled = m.with_hashes({"config.json": "b" * 64, "m.safetensors": "c" * 64})
    assert [f.sha256 for f in filled.files] == ["b" * 64, "a" * 64]
