"""The Prometheus scrape configuration and target files (components/core/scrape.py): cases under
tests/data/scrape/ (settings and running rehearsal addresses in, the file_sd target groups out),
and the real promtool from Debian (scripts/install-host-deps) accepting what
`python -m components metrics --scrape-config` writes for this project."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.__main__ import main
from components.core import scrape
from components.core.config import parse_settings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "scrape"
CASES = sorted(DATA.glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_stack_targets(path):
    case = json.loads(path.read_text())
    targets, notes = scrape.targets_of(parse_settings("tp8", case["config"]), case["addresses"])
    assert json.loads(scrape.render_targets(targets)) == case["targets"]
    assert len(notes) == len(case["notes"])
    for want, got in zip(case["notes"], notes):
        assert want in got


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run scripts/install-host-deps (Debian's prometheus package)", pytrace=False)
    return tool


def test_promtool_accepts_the_written_config_and_target_files(tmp_path):
    out = tmp_path / "prometheus"
    assert main(["metrics", "--scrape-config", "--out", str(out), "--project-dir", str(ROOT)]) == 0
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == [scrape.JOB, scrape.WATCH_JOB]
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == [f"{out / 'targets'}/*.json"]
    # One target file per stack of the project; a fleet case's targets in one of them too, so
    # promtool reads a non-empty file_sd file.
    stacks = sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml"))
    assert sorted(p.stem for p in (out / "targets").glob("*.json")) == stacks
    fleet = json.loads((DATA / "fleet-behind-router.json").read_text())
    (out / "targets" / "fleet.json").write_text(json.dumps(fleet["targets"]))
    done = subprocess.run([promtool(), "check", "config", str(out / "prometheus.yml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_refuses_a_broken_target_file(tmp_path):
    # The check above can fail: promtool reads the target files, not only the YAML.
    out = tmp_path / "prometheus"
    (out / "targets").mkdir(parents=True)
    (out / "prometheus.yml").write_text(scrape.render_config(str(out / "targets"), watch_exporter=None))
    (out / "targets" / "tp8.json").write_text('[{"targets": ["10.0.0.1:30001"], "labels": {"role": 5}}]')
    done = subprocess.run([promtool(), "check", "config", str(out / "prometheus.yml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0, done.stdout + done.stderr
