"""Issue 36.8: what systemd applies to a serving unit beyond its file (components/core/dropins.py).
Cases in tests/data/dropins/: the drift check's read (reads.SERVICE_SCRIPT) recorded on a
rehearsal host with the drop-in in place, and the lines it must give."""
from __future__ import annotations

import pytest

from components.core import dropins
from components.core.facts import parse_systemctl_show, split_sections
from tests.casedata import cases

CASES = cases("dropins")


def read(case: dict) -> tuple[list[str], list[str]]:
    head, _, rest = case["stdout"].partition("\n@@cmdline\n")
    state = next(iter(parse_systemctl_show(head).values()))
    return dropins.read_changes(case["unit"], state.get("DropInPaths", ""), split_sections("@@cmdline\n" + rest),
                                declared=case["declared"], hidden=frozenset(case["hidden"]))


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_each_drop_in_and_the_environment_it_makes(name, case):
    foreign, environment = read(case)
    assert foreign == case["foreignDropIns"]
    assert environment == case["effectiveEnvironment"]


def test_a_credential_in_a_drop_in_is_never_shown():
    case = dict(CASES)["prefix-drop-in-with-a-credential"]
    assert "0123456789abcdef0123456789abcdef" in case["stdout"]
    foreign, environment = read(case)
    assert foreign and environment
    assert "0123456789abcdef" not in " ".join(foreign + environment)


def test_a_drop_in_directory_names_this_unit_or_a_prefix_of_it():
    unit = "sglang-kimi-k2.6-tp8.service"
    mine = ["/usr/lib/systemd/system/sglang-kimi-k2.6-tp8.service.d/a.conf", "/lib/systemd/system/sglang-.service.d/a.conf",
            "/usr/local/lib/systemd/system/sglang-kimi-.service.d/a.conf"]
    theirs = ["/usr/lib/systemd/system/service.d/a.conf", "/usr/lib/systemd/system/sglang-kimi-k2.6-ep8.service.d/a.conf",
              "/usr/lib/systemd/system/other-.service.d/a.conf", "/usr/lib/systemd/system/sglang-.socket.d/a.conf"]
    for path in mine:
        assert dropins._for_this_unit(unit, path), path
    for path in theirs:
        assert not dropins._for_this_unit(unit, path), path


def test_a_missing_systemd_answer_compares_nothing():
    # An answer without the unit's environment (systemctl failed): no line made up from it.
    case = dict(CASES)["clean-unit-without-drop-ins"]
    stdout = case["stdout"].replace("@@unit-environment\nEnvironment=", "@@unit-environment\nX=")
    assert read({**case, "stdout": stdout}) == ([], [])
