"""Where the rehearsal hosts' Debian base is fetched from (rehearsal/rootfs.py `debian_mirror`):
REHEARSAL_DEBIAN_MIRROR, else this machine's apt sources (sources.list and the parts, one-line
and deb822 forms), else a refusal naming what was read: never a mirror of our own choosing.
Pure: each case (tests/data/debian-mirror/) writes its apt sources into a temporary directory."""
from __future__ import annotations

import pytest

from rehearsal import rootfs
from rehearsal.common import RehearsalError

from ..casedata import cases


@pytest.mark.parametrize("name, case", cases("debian-mirror"), ids=[n for n, _ in cases("debian-mirror")])
def test_the_mirror_is_the_machines_own_or_none(tmp_path, name, case):
    etc = tmp_path / "etc-apt"
    etc.mkdir()
    for rel, text in case["files"].items():  # no sources.list.d/ when a case has no part
        (etc / rel).parent.mkdir(exist_ok=True)
        (etc / rel).write_text(text)
    args = (case.get("environ", {}), etc / "sources.list", etc / "sources.list.d")
    if "mirror" in case:
        assert rootfs.debian_mirror(*args) == case["mirror"], case["why"]
        return
    with pytest.raises(RehearsalError) as refused:
        rootfs.debian_mirror(*args)
    message = str(refused.value)
    for part in case["refused"]:
        assert part in message, (part, message)
    for rel in case["files"]:
        # Every file apt reads is named as read; one apt would not read is not.
        assert (str(etc / rel) in message) != any(n in rel for n in case.get("not_read", [])), (rel, message)


def test_the_parts_apt_ignores_are_not_read(tmp_path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    for name in ("b.sources", "a.list", "c.sources.disabled-by-farm", "d.list.save", "README"):
        (parts / name).write_text("")
    assert [p.name for p in rootfs.apt_source_files(tmp_path / "sources.list", parts)] == [
        "sources.list", "a.list", "b.sources"]
