"""The floors of components/, one way down (issue 14.1).

- components/core/: pure logic (settings, SGLang's rules, memory, units, facts, readiness
  verdicts, the switch plan, the read requests). Imports only core, never pulumi or paramiko:
  all of it runs, and is tested, without an engine or a host.
- components/remote/: talks to hosts (SSH, the dynamic providers). Imports core and remote.
- components/*.py: the Pulumi components and the program. May import anything below.
- components/cli/: the commands of `python -m components`, one module each, on top: nothing in
  components/ imports it but components/__main__.py, the entry (on the same floor).

Every import counts, also one inside a function. A function-local import of a project module is
allowed only when it is listed in LAZY with why: such an import used to hold a circle apart,
and a circle must not come back that way.

The product does not know its test double (issue 37.3): only ADAPTER imports the `rehearsal`
package (in any form: `import`, `from`, importlib) or spells how a rehearsal host is found or
started (TEST_HOST_TEXT in a string). The settings' words (`host.rehearsal`,
`aptRepository: rehearsal`, ...) are the product's and stay.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "components"

# (importer, imported): why the import waits until the function runs.
LAZY = {
    # Every command module is loaded for every command (components/cli/__init__.py builds the
    # parser from all of them): what only one command needs waits until it runs.
    ("components.cli.status", "components.remote.status"): "`plan` and `switch` never connect: no SSH side loaded",
    ("components.cli.serving_bench", "components.remote.bench"):
        "only `bench` runs the serving benchmark: no SSH side and no pulumi.dynamic for the others",
    ("components.cli.serving_bench", "components.remote.ssh"): "only `bench` reaches a host (its RemoteError)",
    ("components.cli.compare", "components.remote.fitness_now"): "only `compare` with fitness-recorded runs reads the hosts",
    ("components.cli.advise", "components.remote.fitness_now"): "only `advise` with fitness-recorded results reads the hosts",
    ("components.watch", "components.remote.status"): "every command loads components.watch: only a tick needs the SSH side",
    ("components.watch", "components.traffic_watch"): "every command loads components.watch: only a tick reads the traffic",
    ("components.traffic_watch", "components.remote.ssh"): "loaded by a watch tick only (the SSH side)",
    ("components.traffic_watch", "components.remote.status"): "loaded by a watch tick only (the SSH side)",
    # The program imports remote/ahead.py for its two tokens: the provider's side stays unloaded there.
    ("components.remote.ahead", "components.remote.providers"): "loaded ahead by the provider process only (warm_up)",
    ("components.remote.ahead", "components.remote.ssh"): "the provider process connects; the program never does",
    ("components.remote.ahead", "components.core.reads"): "the requests are built in the provider process only",
    ("components.remote.ahead", "components.remote.handoff"): "the provider process hands reads over; the program never does",
    ("components.remote.ahead", "components.remote.fleet_read"): "the provider process reads the fleet; the program never does",
    ("components.remote.ahead", "components.core.specs"): "the host facts' spec is read in the provider process only",
    ("components.remote.ahead", "components.remote.common"): "the provider process checks the connection; the program never does",
}
OUTSIDE_CORE = ("pulumi", "paramiko")
# The one module that knows the rehearsal host: how one is found, built, and started.
ADAPTER = "components.remote.rehearsal_adapter"
TEST_HOST = "rehearsal"
# Text that knows where a rehearsal host keeps its record, or how one is started.
TEST_HOST_TEXT = ("/run/gpu-serving/rehearsal", "host.json", "python -m rehearsal")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, bool, int]]:
    """(absolute module, inside a function, line) for every import of the file. `from X import
    y` counts as X.y when X.y is a module of the package, else as X."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if is_module(sub) else target, in_function, child.lineno))
            visit(child, nested)

    visit(tree, False)
    return found


def couplings_to_the_test_host(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each place the file knows the test host: an import of `rehearsal` (also
    inside a function, or by importlib.import_module / __import__), a string with TEST_HOST_TEXT."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__"):
                names = [node.args[0].value]
        found += [(node.lineno, f"imports {n}") for n in names if n == TEST_HOST or n.startswith(TEST_HOST + ".")]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, f"spells {text!r}") for text in TEST_HOST_TEXT if text in node.value]
    return found


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


ENTRY = "components.__main__"


def floor(module: str) -> int:
    """0 core, 1 remote, 2 the components and the program, 3 the commands and their entry."""
    if module == "components.core" or module.startswith("components.core."):
        return 0
    if module == "components.remote" or module.startswith("components.remote."):
        return 1
    if module in ("components.cli", ENTRY) or module.startswith("components.cli."):
        return 3
    return 2


def project_graph(files: list[Path]) -> dict[str, list[tuple[str, bool, int]]]:
    return {module_name(f): [(m, local, line) for m, local, line in imports_of(f)
                             if m == "components" or m.startswith("components.")] for f in files}


def problems(files: list[Path]) -> list[str]:
    """Every arrow pointing up, every outside package core must not use, every unlisted
    function-local project import, every knowledge of the rehearsal host outside ADAPTER, and
    every circle."""
    found = []
    graph = project_graph(files)
    for f in files:
        mod = module_name(f)
        for target, local, line in imports_of(f):
            if floor(mod) == 0 and target.split(".")[0] in OUTSIDE_CORE:
                found.append(f"{mod}:{line} imports {target}: core stays free of {' and '.join(OUTSIDE_CORE)}")
        for target, local, line in graph[mod]:
            if target in ("components", "components.core", "components.remote"):
                continue  # the package itself (a `from . import x` resolves to x above)
            if floor(target) > floor(mod):
                found.append(f"{mod}:{line} imports {target}: an arrow pointing up")
            if local and (mod, target) not in LAZY:
                found.append(f"{mod}:{line} imports {target} inside a function (not in LAZY)")
        if mod != ADAPTER:
            found += [f"{mod}:{line} {what}: only {ADAPTER} knows the rehearsal host"
                      for line, what in couplings_to_the_test_host(f)]
    found += [f"circle: {' -> '.join(c)}" for c in circles({m: {t for t, _, _ in e} for m, e in graph.items()})]
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One path for each circle found by a depth-first walk."""
    out, state, stack = [], {}, []

    def walk(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                out.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return out


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_floors_point_one_way_and_hold_no_circle():
    assert problems(package_files()) == []


def test_each_floor_holds_what_it_should():
    floors = {module_name(f): floor(module_name(f)) for f in package_files()}
    core = {m for m, fl in floors.items() if fl == 0}
    # The pure halves the issue names live in core; the providers and the transport in remote.
    for name in ("errors", "profiles", "config", "strategy", "memory", "unit", "plan", "facts", "readiness",
                 "reads", "switch", "status", "cuda", "venv", "stack_config"):
        assert f"components.core.{name}" in core, name
    assert {"components.remote.ssh", "components.remote.providers", "components.remote.installers"} <= set(floors)
    # Dynamic provider classes are pickled into deployed stacks by module path: they stay here.
    from components.remote import installers, providers
    for cls in ("HostFactsProvider", "RemoteFileProvider", "ServiceProvider", "ReadinessProvider"):
        assert getattr(providers, cls).__module__ == "components.remote.providers"
    for cls in ("CudaToolkitProvider", "PythonVenvProvider"):
        assert getattr(installers, cls).__module__ == "components.remote.installers"
    from components.remote import bench
    assert bench.BenchmarkProvider.__module__ == "components.remote.bench"
    # Every command of `python -m components` is a module of the top floor.
    from components import cli
    assert all(floor(m.__name__) == 3 for m in cli.COMMANDS)
    assert {"components.cli.plan", "components.cli.status", "components.cli.serving_bench"} <= {m.__name__ for m in cli.COMMANDS}


def test_plan_starts_without_the_ssh_side_or_the_engine():
    """What the LAZY reasons promise: every command module is loaded for every command, yet
    `plan` runs without executing paramiko (remote/ssh.py registers it lazily), any of pulumi, or
    the SSH side of `status` and `bench`."""
    code = ("import contextlib, io, json, sys\n"
            "from components.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    code = main(['plan', '--stack', 'tp8'])\n"
            "heavy = [m for m in sys.modules if m.split('.')[0] == 'pulumi' or m.startswith('paramiko.')\n"
            "         or m in ('components.remote.status', 'components.remote.bench', 'components.traffic_watch')]\n"
            "print(json.dumps([code, sorted(heavy)]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [0, []]


def test_every_lazy_import_listed_is_still_there():
    """A LAZY entry without its import is a stale excuse: remove it."""
    graph = project_graph(package_files())
    present = {(m, t) for m, edges in graph.items() for t, local, _ in edges if local}
    assert set(LAZY) <= present, set(LAZY) - present


@pytest.mark.parametrize("source, expected", [
    ({"core/a.py": "from ..remote import b\n", "remote/b.py": ""}, "an arrow pointing up"),
    ({"core/a.py": "import pulumi\n"}, "core stays free of pulumi"),
    ({"core/a.py": "def f():\n    from . import b\n", "core/b.py": ""}, "inside a function"),
    ({"core/a.py": "from . import b\n", "core/b.py": "from . import a\n"}, "circle: components.core.a"),
    ({"watch.py": "from .cli import plan\n", "cli/plan.py": ""}, "components.watch:1 imports components.cli.plan: an arrow"),
    ({"remote/a.py": "from ..cli import main\n", "cli/__init__.py": "def main(): pass\n"}, "imports components.cli: an arrow"),
])
def test_the_check_catches_what_it_is_for(tmp_path, monkeypatch, source, expected):
    """The checker on a made-up package: each kind of fault is reported."""
    root = tmp_path / "components"
    for sub in ("", "core", "remote", "cli"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    for rel, text in source.items():
        (root / rel).write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    found = problems(sorted(root.rglob("*.py")))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("text, what", [
    ("import rehearsal.host\n", "imports rehearsal.host"),
    ("def f():\n    from rehearsal.cuda import build_repo\n", "imports rehearsal.cuda"),
    ("import importlib\nhost = importlib.import_module('rehearsal.host')\n", "imports rehearsal.host"),
    ("m = __import__('rehearsal')\n", "imports rehearsal"),
    ("def f(name):\n    return f'{name}/host.json'\n", "spells 'host.json'"),
    ('"""Start it with python -m rehearsal up."""\n', "spells 'python -m rehearsal'"),
])
def test_the_test_host_rule_sees_each_form(tmp_path, text, what):
    path = tmp_path / "a.py"
    path.write_text(text)
    assert [w for _, w in couplings_to_the_test_host(path)] == [what]


def test_the_test_host_rule_catches_a_coupling_outside_the_adapter(tmp_path, monkeypatch):
    """Planted: a core module importing rehearsal and a remote module with the rehearsal hosts'
    path are both reported; the adapter, doing both, is not. The settings word is no coupling."""
    root = tmp_path / "components"
    for sub in ("", "core", "remote"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    (root / "core/a.py").write_text("from rehearsal import host\nREHEARSAL = 'rehearsal'\n")
    (root / "remote/b.py").write_text("RUN = '/run/gpu-serving/rehearsal'\n")
    (root / "remote/rehearsal_adapter.py").write_text(
        "RUN = '/run/gpu-serving/rehearsal'\n\n\ndef wheel():\n    from rehearsal.engine_wheel import build\n    return build\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    found = problems(sorted(root.rglob("*.py")))
    assert found == ["components.core.a:1 imports rehearsal: only components.remote.rehearsal_adapter knows the rehearsal host",
                     "components.remote.b:1 spells '/run/gpu-serving/rehearsal': only components.remote.rehearsal_adapter "
                     "knows the rehearsal host"], found
