"""The rehearsal host's modules import one way, down the floors (no host is booted here):

    __main__, __init__  ->  host (the public API), degrade  ->  machine  ->  network, rootfs  ->  common

network and rootfs never import machine (nor each other); common imports no rehearsal module.
Every import counts, also one inside a function: a circle held apart by a late import is
still a circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rehearsal"

# floor of each module of the host's lifecycle; a module may import only lower floors
FLOORS = {"common": 0, "network": 1, "rootfs": 1, "checkpoint": 1, "hub": 1, "machine": 2, "host": 3, "degrade": 3,
          "__main__": 4, "__init__": 4}


def rehearsal_imports(path: Path) -> set[str]:
    """The rehearsal/*.py modules that `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:            # from .machine import x
                found.add(node.module.split(".")[0])
            elif node.level == 1:                          # from . import machine
                found.update(a.name for a in node.names)
            elif node.level == 0 and (node.module or "").startswith("rehearsal"):
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "rehearsal" and len(parts) > 1:
                    found.add(parts[1])
    return found & set(FLOORS)


def test_every_floor_exists():
    assert {p.stem for p in PACKAGE.glob("*.py")} >= set(FLOORS)


@pytest.mark.parametrize("module", sorted(FLOORS))
def test_imports_point_down(module):
    upward = {m: FLOORS[m] for m in rehearsal_imports(PACKAGE / f"{module}.py")
              if FLOORS[m] >= FLOORS[module] and m != module}
    assert not upward, (f"rehearsal/{module}.py (floor {FLOORS[module]}) imports {upward}: "
                        "move the shared piece down a floor (common.py) instead")


def test_network_and_rootfs_never_import_machine():
    for module in ("network", "rootfs"):
        assert "machine" not in rehearsal_imports(PACKAGE / f"{module}.py"), module


def test_the_checker_sees_every_form_of_import(tmp_path):
    # the test above can fail: each spelling of an import of machine is found
    for text in ("from .machine import up", "from . import machine", "import rehearsal.machine",
                 "from rehearsal.machine import up", "from rehearsal import machine",
                 "def late():\n    from .machine import up\n"):
        path = tmp_path / "network.py"
        path.write_text(text + "\n")
        assert rehearsal_imports(path) == {"machine"}, text
