"""The machines a stack touches that are not rehearsal hosts (components/core/targets.py, issue
36.4): scripts/deploy switches a rehearsal stack at once but asks, or refuses without --yes,
before it changes a real machine. Cases in tests/data/targets/*.json; and the script's refusal
outside a terminal, before any host, stack or engine run."""
import os
import shutil
import subprocess

import pytest
import yaml

from components.core.config import parse_settings
from components.core.targets import real_machines
from tests.pulumi_env import REPO, committed_stack_files

from .casedata import case_config, cases

CASES = cases("targets")
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_real_machines(name, case):
    assert real_machines(parse_settings("ep8", case_config(case))) == case["expect"]


def test_scripts_deploy_outside_a_terminal_refuses_a_real_host_and_changes_nothing(tmp_path):
    """`scripts/deploy ep8` with the stack pointed at a real machine, from a script (no terminal,
    no --yes): refused, naming the machine and what to run instead, before it boots, creates or
    connects to anything (the backend has no stack afterwards)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", ".pulumi-state", "__pycache__", ".pytest_cache", "tests"))
    (checkout / ".venv").symlink_to(REPO / ".venv")
    committed_stack_files(checkout)
    doc = yaml.safe_load((checkout / "Pulumi.yaml").read_text())
    # An address in the rehearsal range that no host has here: never contacted (refused first).
    doc["config"]["gpu-serving:host"]["value"] = {
        **{k: v for k, v in doc["config"]["gpu-serving:host"]["value"].items() if k != "rehearsal"},
        "address": "10.213.255.254", "hostKey": HOST_KEY, "privateKeyPath": str(tmp_path / "id_ed25519")}
    (checkout / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{state}", "PULUMI_CONFIG_PASSPHRASE": "deploy-test",
           "PULUMI_HOME": str(tmp_path / "pulumi-home")}
    done = subprocess.run(["bash", str(checkout / "scripts" / "deploy"), "ep8"], cwd=checkout, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "stack ep8 deploys to machines that are not rehearsal hosts:\n  host (root@10.213.255.254:22)" in done.stderr
    assert "nothing was changed" in done.stderr and "scripts/deploy ep8 --yes" in done.stderr, done.stderr
    assert "Updating" not in done.stdout and not any(state.rglob("*.json")), done.stdout[-2000:]
