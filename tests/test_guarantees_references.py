"""docs/guarantees.md names the test that breaks when each promise stops being true: every name
it gives must be a test that exists (a renamed or never-written test leaves a promise unguarded
while the doc still claims it). Read from the files' AST: no import, nothing runs."""
from __future__ import annotations

import re

from tests import guarantee_refs as G


def test_every_test_the_guarantees_name_exists():
    resolved = G.resolve_doc()
    unresolved = [f"docs/guarantees.md:{r.ref.line}: `{r.ref.text}`: {r.problem}" for r in resolved if r.problem]
    assert not unresolved, "tests named in docs/guarantees.md that do not exist:\n" + "\n".join(unresolved)


def test_every_span_that_looks_like_a_test_is_read_as_one():
    # A form the reader does not know (`test_x.py:: test_y`, `test_x.py#test_y`) would be
    # skipped, not checked: any backticked text naming a test file or `::` must parse.
    skipped = []
    for number, line in enumerate(G.DOC.read_text().splitlines(), 1):
        for span in G._SPAN.findall(line):
            looks = re.search(r"(^|/)test_\w*\.py|::[Tt]est", span)
            if looks and not G._REF.match(span.strip()):
                skipped.append(f"{number}: `{span}`")
    assert not skipped, "test names in docs/guarantees.md in a form tests/guarantee_refs.py does not read:\n" + "\n".join(skipped)


def test_the_reader_resolves_each_form_the_doc_uses_and_names_what_is_missing():
    # Real tests of this repository in each written form, and one missing test per form.
    doc = "\n".join([
        "| a | `tests/test_layers.py::test_the_floors_point_one_way_and_hold_no_circle` |",
        "| b | `test_guarantees_references.py::test_every_test_the_guarantees_name_exists`, "
        "`::test_every_span_that_looks_like_a_test_is_read_as_one` |",
        "| c | `e2e/test_prefetch_refresh.py::test_reads_started_ahead_*`, `test_bad_input_corpus.py` |",
        "| d | `test_guarantees_references.py::test_every_test_the_guarantees_name_exists[x-1]` |",
        "| e | `tests/e2e/test_hardening_{input,secrets}.py` `test_router.py` |",
        "| f | `test_layers.py::test_no_such_test`, `::test_nor_this`, `tests/e2e/test_nowhere.py` |",
        "| g | `::test_orphan` |",
        "| h | `test_guarantees_references.py::Missing::test_every_test_the_guarantees_name_exists` |",
    ])
    by_line: dict[int, list[G.Resolved]] = {}
    for r in (G.resolve(ref) for ref in G.references(doc)):
        by_line.setdefault(r.ref.line, []).append(r)

    assert [r.node_ids for r in by_line[1]] == [("tests/test_layers.py::test_the_floors_point_one_way_and_hold_no_circle",)]
    assert [r.node_ids for r in by_line[2]] == [
        ("tests/test_guarantees_references.py::test_every_test_the_guarantees_name_exists",),
        ("tests/test_guarantees_references.py::test_every_span_that_looks_like_a_test_is_read_as_one",)]
    assert by_line[3][0].node_ids == ("tests/e2e/test_prefetch_refresh.py::test_reads_started_ahead_serve_the_engines_reads",)
    assert by_line[3][1].node_ids == ("tests/test_bad_input_corpus.py",)
    assert by_line[4][0].node_ids == ("tests/test_guarantees_references.py::test_every_test_the_guarantees_name_exists",)
    # A bare name is tests/'s own file before a sub-folder's (tests/e2e/test_router.py exists too).
    assert [r.node_ids for r in by_line[5]] == [
        ("tests/e2e/test_hardening_input.py",), ("tests/e2e/test_hardening_secrets.py",), ("tests/test_router.py",)]
    assert [r.problem for r in by_line[6]] == [
        "tests/test_layers.py has no test test_no_such_test", "tests/test_layers.py has no test test_nor_this",
        "no test file tests/e2e/test_nowhere.py"]
    assert [r.problem for r in by_line[7]] == ["no file named before it on its line"]
    assert by_line[8][0].problem.endswith("has no test Missing::test_every_test_the_guarantees_name_exists")


def test_the_doc_names_tests_of_every_kind():
    # The reader is not blind on the real doc: it finds the fast, integration and e2e tests the
    # tables name (each folder's own tests, not only a count).
    ids = G.named_tests()
    for folder in ("tests/test_", "tests/e2e/", "tests/integration/", "tests/rehearsal/", "tests/standins/"):
        assert any(i.startswith(folder) for i in ids), folder
    assert len(ids) == len(set(ids))


def test_every_data_case_the_guarantees_name_exists():
    # Data cases prove promises too: a corpus case (`corpus \`name\``, a file of
    # tests/data/bad-input/; `name-*` for every file starting so) or a path under tests/data/
    # (a folder, a file, a glob, brace alternatives) that matches nothing guards nothing.
    missing, checked = [], 0
    for number, line in enumerate(G.DOC.read_text().splitlines(), 1):
        patterns = [f"tests/data/bad-input/{name}.yaml" for name in re.findall(r"corpus `([^`\n]+)`", line)]
        patterns += [span.strip() for span in G._SPAN.findall(line) if span.strip().startswith("tests/data/")]
        for pattern in patterns:
            for alternative in G._braces(pattern):
                checked += 1
                if not (alternative.endswith("/") and (G.REPO / alternative).is_dir()) and not list(G.REPO.glob(alternative)):
                    missing.append(f"docs/guarantees.md:{number}: `{alternative}`")
    assert not missing, "data cases named in docs/guarantees.md that match no file:\n" + "\n".join(missing)
    assert checked > 20  # not blind: the doc names that many
