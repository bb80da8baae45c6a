"""The tests docs/guarantees.md names, read from the doc and found in the test files.

The doc names a test in backticks, in these forms (all seen in it):
- `tests/e2e/test_x.py::test_y`, `e2e/test_x.py::test_y` or `test_x.py::test_y` (a bare file name is
  looked up under tests/, then in its sub-folders: e2e, integration, rehearsal, standins);
- `::test_z` after one of those on the same line: another test of the last file named there;
- `test_x.py::Class::test_y` for a method;
- a name ending in `*` or `...`: every test of the file that starts with what comes before it;
- a parameter id in brackets (`test_y[...]`): the function `test_y`;
- `tests/e2e/test_{a,b}.py`: brace alternatives, each a file;
- `test_x.py` alone: the file.
The names are resolved by reading the files' AST (no import, so this is fast and runs nothing).
`scripts/test-guarantees-alone` runs each test found here in a pytest process of its own.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
DOC = REPO / "docs" / "guarantees.md"
# Where a bare `test_x.py` is looked for after tests/ itself, in this order.
SUBFOLDERS = ("e2e", "integration", "rehearsal", "standins")

_SPAN = re.compile(r"`([^`\n]+)`")
# One reference: an optional file (with folders) and an optional `::` part.
_REF = re.compile(r"^(?P<file>(?:[\w.{},-]+/)*test_[\w{},-]*\.py)?(?P<names>(?:::[\w*.\[\]-]+)+)?$")


@dataclasses.dataclass(frozen=True)
class Ref:
    line: int  # line number in the doc
    text: str  # as written in the doc
    file: str  # the file as the doc names it (after any brace alternative is taken)
    names: tuple[str, ...]  # () for a file alone; ("test_y",) or ("Class", "test_y")


@dataclasses.dataclass(frozen=True)
class Resolved:
    ref: Ref
    path: Path | None  # the test file, or None when none was found
    node_ids: tuple[str, ...]  # pytest node ids (relative to the repository), () when unresolved
    problem: str  # "" when resolved


def _braces(text: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", text)
    if not m:
        return [text]
    return [alt for part in m.group(1).split(",") for alt in _braces(text[: m.start()] + part + text[m.end():])]


def references(doc_text: str) -> list[Ref]:
    """Every test reference in the doc, in order."""
    refs: list[Ref] = []
    for number, line in enumerate(doc_text.splitlines(), 1):
        last_file = ""
        for span in _SPAN.findall(line):
            m = _REF.match(span.strip())
            if not m or not (m.group("file") or m.group("names")):
                continue
            names = tuple(n for n in (m.group("names") or "").split("::") if n)
            if m.group("file"):
                files = _braces(m.group("file"))
                last_file = files[-1]
            else:
                # `::test_z`: a test of the last file named on this line (none: unresolved below).
                files = [last_file]
            for f in files:
                refs.append(Ref(number, span, f, names))
    return refs


def find_file(name: str) -> Path | None:
    """The test file a reference names: a path under the repository or tests/, or a bare name."""
    if not name:
        return None
    for base in (REPO, TESTS):
        if (base / name).is_file():
            return base / name
    if "/" not in name:
        for sub in SUBFOLDERS:
            if (TESTS / sub / name).is_file():
                return TESTS / sub / name
    return None


def _tests_in(path: Path) -> dict[tuple[str, ...], str]:
    """Every test pytest would collect by name from the file: module functions `test*` and
    methods `test*` of classes `Test*` (keyed ("f",) and ("Class", "f")), with their node id."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(REPO).as_posix()
    found: dict[tuple[str, ...], str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found[(node.name,)] = f"{rel}::{node.name}"
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    found[(node.name, item.name)] = f"{rel}::{node.name}::{item.name}"
    return found


def resolve(ref: Ref) -> Resolved:
    path = find_file(ref.file)
    if path is None:
        why = "no file named before it on its line" if not ref.file else f"no test file {ref.file}"
        return Resolved(ref, None, (), why)
    rel = path.relative_to(REPO).as_posix()
    if not ref.names:
        return Resolved(ref, path, (rel,), "")
    tests = _tests_in(path)
    *owner, last = ref.names
    last = re.sub(r"\[.*\]$", "", last)
    prefix = None
    if last.endswith("*"):
        prefix = last[:-1]
    elif last.endswith("..."):
        prefix = last[:-3]
    if prefix is not None:
        ids = tuple(nid for key, nid in tests.items() if list(key[:-1]) == owner and key[-1].startswith(prefix))
    else:
        ids = (tests[(*owner, last)],) if (*owner, last) in tests else ()
    if not ids:
        return Resolved(ref, path, (), f"{rel} has no test {'::'.join((*owner, last))}")
    return Resolved(ref, path, ids, "")


def resolve_doc(doc: Path = DOC) -> list[Resolved]:
    return [resolve(r) for r in references(doc.read_text())]


def named_tests(doc: Path = DOC) -> list[str]:
    """The node ids of the tests the doc names by name (not whole files), once each, in order."""
    seen: dict[str, None] = {}
    for r in resolve_doc(doc):
        if r.ref.names:
            for nid in r.node_ids:
                seen.setdefault(nid, None)
    return list(seen)


if __name__ == "__main__":
    # `python -m tests.guarantee_refs`: one node id a line, for scripts/test-guarantees-alone.
    print("\n".join(named_tests()))
