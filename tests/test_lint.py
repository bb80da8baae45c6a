"""The repo passes its own linter (ruff.toml): the same check .ci/run does first, so a local
`scripts/test` run finds an unused import or an over-long line too."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_configuration_sets_the_line_length_and_rules():
    cfg = tomllib.loads((REPO / "ruff.toml").read_text())
    assert cfg["line-length"] == 140
    assert set(cfg["lint"]["select"]) >= {"E", "W", "F"}


def test_the_repo_passes_ruff():
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_finds_what_it_is_configured_to_find(tmp_path):
    """The check above can fail: an unused import and a 141-column line are both reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = '" + "a" * 135 + "'\n")
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", "--config", str(REPO / "ruff.toml"), "--output-format", "concise",
                           "--no-cache", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "F401" in proc.stdout and "E501" in proc.stdout
