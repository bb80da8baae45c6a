"""A deployable copy of the project, pointed at a rehearsal host booted for this test session,
driven by the real Pulumi engine through the Automation API."""
from __future__ import annotations

import copy
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from tests.pulumi_env import (REPO, EngineMissing, engine_env, pulumi_command, require_engine,
                              settings_only_stack_files)

VENV = REPO / ".venv"
IGNORE = shutil.ignore_patterns(".git", ".venv", ".pulumi-state", "__pycache__", ".pytest_cache", "tests", "bench", "docs")

# Fast rehearsal: the engine loads in a second; deadlines sized for that.
FAST_ENV = {"REHEARSAL_LOAD_SECONDS": "1", "REHEARSAL_WARMUP_SECONDS": "0.5"}
FAST_READINESS = {"timeoutSeconds": 90, "pollInitialSeconds": 0.5, "pollMaxSeconds": 2, "settleSeconds": 1,
                  "generationTimeoutSeconds": 20}


@dataclass
class Deployment:
    env: dict
    project: Path
    host: object  # rehearsal.HostInfo

    def stack(self, name: str, extra_env: dict | None = None) -> auto.Stack:
        """The stack, run with the deployment's environment (and `extra_env` on top)."""
        env = {**self.env, **(extra_env or {})}
        ws = auto.LocalWorkspaceOptions(work_dir=str(self.project), pulumi_home=env["PULUMI_HOME"],
                                        env_vars=env, pulumi_command=pulumi_command(env))
        return auto.create_or_select_stack(stack_name=name, work_dir=str(self.project), opts=ws)

    def sh(self, cmd: str) -> str:
        out = self.host.run(cmd, timeout=60)
        return out.stdout

    def components(self, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
        """`python -m components ARGS` from the project folder, as an operator runs it."""
        env = {**self.env, "PATH": f"{VENV / 'bin'}:{self.env.get('PATH', '')}"}
        return subprocess.run([str(VENV / "bin" / "python"), "-m", "components", *args], cwd=self.project, env=env,
                              capture_output=True, text=True, timeout=timeout)

    def edit_project(self, mutate) -> None:
        path = self.project / "Pulumi.yaml"
        doc = yaml.safe_load(path.read_text())
        mutate(doc["config"])
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def write_stack_file(self, name: str, strategy: dict, extra: dict | None = None) -> None:
        config = {"gpu-serving:strategy": strategy, **(extra or {})}
        (self.project / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))

    def write_fault_stack(self, name: str, fault: str, readiness: dict | None = None) -> None:
        """An EP8 stack whose engine has `fault`, with its own environment file (environmentDir)
        so the fault never reaches the strategy it falls back to."""
        project = yaml.safe_load((self.project / "Pulumi.yaml").read_text())["config"]
        serving = copy.deepcopy(project["gpu-serving:serving"]["value"])
        serving["environment"] = {**serving["environment"], **FAST_ENV, "REHEARSAL_FAULT": fault}
        serving["environmentDir"] = f"/etc/gpu-serving/{name}"
        self.write_stack_file(name, {"tpSize": 8, "epSize": 8}, {
            "gpu-serving:serving": serving,
            "gpu-serving:readiness": {**FAST_READINESS, **(readiness or {})},
        })


def make_deployment(tmp: Path, host, source: Path = REPO, name: str = "project") -> Deployment:
    """A copy of the program in `source` (default: this working tree) at tmp/<name>, with its
    state in tmp/state: two copies made with the same tmp share stacks (same project name)."""
    (tmp / "state").mkdir(parents=True, exist_ok=True)
    env = engine_env(pulumi_home=tmp / "pulumi-home", backend_url=f"file://{tmp / 'state'}", passphrase="e2e-test")
    try:
        require_engine(env)
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"{VENV} missing: run scripts/setup", pytrace=False)
    project = tmp / name
    shutil.copytree(source, project, ignore=IGNORE, symlinks=True)
    (project / ".venv").symlink_to(VENV)
    settings_only_stack_files(project)
    d = Deployment(env, project, host)

    def point_at_test_host(config):
        config["gpu-serving:host"]["value"]["rehearsal"] = host.name
        config["gpu-serving:serving"]["value"]["environment"].update(FAST_ENV)
        config["gpu-serving:readiness"] = {"value": FAST_READINESS}
    d.edit_project(point_at_test_host)
    return d


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    return make_deployment(tmp_path_factory.mktemp("e2e"), host)
