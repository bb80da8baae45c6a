"""Where a benchmark run keeps its things: the bench venv with the peers, and one copy of the
project per rehearsal host (its own Pulumi backend), pointed at that host, with the rehearsal
engine set to load and warm up in zero seconds so that what is timed is the tool."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the engine environment is the tests' own (tests/pulumi_env.py)
from tests.pulumi_env import engine_env as _engine_env, require_engine, settings_only_stack_files  # noqa: E402

BENCH = REPO / "bench"
REQUIREMENTS = BENCH / "requirements.txt"
IGNORE = shutil.ignore_patterns(".git", ".venv", ".pulumi-state", "__pycache__", ".pytest_cache", "tests", "bench", "docs")

# The rehearsal engine answers as soon as it has started: the tools' own overhead is measured.
ZERO_LOAD = {"REHEARSAL_LOAD_SECONDS": "0", "REHEARSAL_WARMUP_SECONDS": "0", "REHEARSAL_LOG_HEALTH": "0"}
PASSPHRASE = "gpu-serving-bench"


def cache_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_CACHE") or "/var/cache/gpu-serving")


def bench_venv() -> Path:
    return cache_root() / "bench-venv"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def ensure_bench_venv() -> Path:
    """The venv with ansible-core and pyinfra (bench/requirements.txt), made once and stamped."""
    venv = bench_venv()
    want = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:16]
    stamp = venv / ".bench-stamp"
    if (venv / "bin" / "python").exists() and stamp.exists() and stamp.read_text().strip() == want:
        return venv
    log(f"installing bench/requirements.txt into {venv}")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(cache_root() / "pip"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
                   check=True, env=env)
    stamp.write_text(want + "\n")
    return venv


@dataclass
class Project:
    """A deployable copy of the project for one rehearsal host, with its own backend."""

    host: str
    dir: Path
    env: dict

    def pulumi(self, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["pulumi", *args], cwd=self.dir, env=self.env, check=check, text=True,
                              stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)

    def plan(self, stack: str) -> dict:
        # The copy's own code: what its `pulumi up` deploys.
        out = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "components", "plan", "--stack", stack,
                              "--json"], cwd=self.dir, check=True, text=True, stdout=subprocess.PIPE)
        return json.loads(out.stdout)


def engine_env(home: Path, backend: Path) -> dict:
    env = _engine_env(pulumi_home=home, backend_url=f"file://{backend}", passphrase=PASSPHRASE)
    require_engine(env)
    env["PULUMI_SKIP_CONFIRMATIONS"] = "true"
    return env


# What `--program-ref` takes from a git commit (the rehearsal host and the runner stay as they are).
PROGRAM = ("components", "__main__.py", "Pulumi.yaml", "Pulumi.tp8.yaml", "Pulumi.ep8.yaml", "Pulumi.pp8.yaml")


EMPTY_PROGRAM = "# The engine's floor: a Pulumi program that declares nothing (bench/workspace.py).\n"


def make_empty_project(work: Path) -> Project:
    """work/empty-pulumi/project: a Python Pulumi program with no resources, run by the same CLI,
    language host, venv and project options (`refresh: always`) as gpu-serving's: what any
    `pulumi up` or `preview` costs before a program does anything."""
    root = work / "empty-pulumi"
    project = root / "project"
    if project.exists():
        shutil.rmtree(project)
    (root / "state").mkdir(parents=True, exist_ok=True)
    project.mkdir(parents=True)
    ours = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    runtime = {**ours["runtime"], "options": dict(ours["runtime"].get("options") or {})}
    # gpu-serving's own call to start its provider early: an empty program has no provider.
    runtime["options"].pop("invokeFirst", None)
    doc = {"name": "empty-pulumi", "runtime": runtime, "options": ours.get("options", {})}
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (project / "__main__.py").write_text(EMPTY_PROGRAM)
    (project / ".venv").symlink_to(REPO / ".venv")
    p = Project("empty-pulumi", project, engine_env(root / "pulumi-home", root / "state"))
    p.pulumi("stack", "select", "--create", "floor")
    p.pulumi("up", "--stack", "floor", "--yes")
    return p


def make_project(work: Path, host: str, ref: str | None = None, paths: tuple[str, ...] = PROGRAM,
                 fleet: list[str] | None = None, label: str = "", load_seconds: float = 0) -> Project:
    """work/<host>/project: the repository's program (the work tree's, or with `paths` as they
    are at git commit `ref`), Pulumi.yaml pointed at rehearsal host `host` (the engine loading for
    `load_seconds`); with `fleet`, one stack for all those rehearsal hosts (gpu-serving:hosts), in
    work/fleet-<names>/, or in work/<label>/ (a second project for the same hosts, with its own state)."""
    if fleet:
        host = label or "fleet-" + "-".join(fleet)
    root = work / host
    project = root / "project"
    if project.exists():
        shutil.rmtree(project)
    (root / "state").mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO, project, ignore=IGNORE, symlinks=True)
    if ref:
        for name in paths:
            target = project / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, *paths], check=True,
                                 stdout=subprocess.PIPE).stdout
        subprocess.run(["tar", "-x", "-C", str(project)], input=archive, check=True)
    (project / ".venv").symlink_to(REPO / ".venv")
    settings_only_stack_files(project)
    path = project / "Pulumi.yaml"
    doc = yaml.safe_load(path.read_text())
    config = doc["config"]
    if fleet:
        config["gpu-serving:hosts"] = {"value": [{"name": name, "rehearsal": name} for name in fleet]}
    else:
        config["gpu-serving:host"]["value"]["rehearsal"] = host
    config["gpu-serving:serving"]["value"]["environment"].update(ZERO_LOAD)
    if load_seconds:
        # The downtime measurement: a server that loads for a fixed time, as a real one does.
        config["gpu-serving:serving"]["value"]["environment"]["REHEARSAL_LOAD_SECONDS"] = f"{load_seconds:g}"
    # The rehearsal host's cgroup v1 hierarchy fails a unit start now and then (219/CGROUP); the
    # runner discards such runs, and a short RestartSec keeps the time they waste short. Every
    # tool deploys this same rendered unit.
    config["gpu-serving:serving"]["value"]["restartSec"] = 2
    # The peer tools switch by systemd Conflicts= in the unit they all deploy (gpu-serving itself
    # stops the serving strategy at switch time and names no other strategy unless asked to).
    config["gpu-serving:serving"]["value"]["conflictsWith"] = ["tp8", "ep8"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = engine_env(root / "pulumi-home", root / "state")
    p = Project(host, project, env)
    for stack in ("tp8", "ep8"):
        p.pulumi("stack", "select", "--create", stack)
    return p
