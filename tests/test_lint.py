"""The repo passes its own linters, the same checks .ci/run does first (scripts/lint), so a
local `scripts/test` run finds an unused import, an over-long line or a type error in
components/core too: ruff with ruff.toml, then mypy with mypy.ini."""
from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")
MYPY = Path(sys.executable).with_name("mypy")
CORE = "mypy-components.core.*"


def test_ruff_configuration_sets_the_line_length_and_rules():
    cfg = tomllib.loads((REPO / "ruff.toml").read_text())
    assert cfg["line-length"] == 140
    assert set(cfg["lint"]["select"]) >= {"E", "W", "F"}


def test_the_repo_passes_ruff():
    proc = subprocess.run([str(RUFF), "check", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_finds_what_it_is_configured_to_find(tmp_path):
    """The check above can fail: an unused import and a 141-column line are both reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = '" + "a" * 135 + "'\n")
    proc = subprocess.run([str(RUFF), "check", "--config", str(REPO / "ruff.toml"), "--output-format", "concise",
                           "--no-cache", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "F401" in proc.stdout and "E501" in proc.stdout


def test_scripts_lint_runs_mypy_over_components_after_ruff():
    lines = [line for line in (REPO / "scripts/lint").read_text().splitlines() if line.startswith((".venv/", "exec "))]
    assert [line.split()[-1] if "mypy" in line else line.split()[0] for line in lines] == [".venv/bin/ruff", "components"]
    assert "mypy==" in (REPO / "requirements-dev.txt").read_text()  # scripts/setup installs it


def test_the_components_pass_mypy():
    """What scripts/lint runs: `mypy -p components` with mypy.ini (core strict)."""
    proc = subprocess.run([str(MYPY), "-p", "components"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _strict_flags() -> dict[str, bool]:
    """The flags mypy's --strict turns on (its own --help), as config keys and their values."""
    text = subprocess.run([str(MYPY), "--help"], capture_output=True, text=True, timeout=60).stdout
    listed = re.search(r"--strict\s+Strict mode; enables the following flags:(.*?)(?:\n  --)", text, re.S)
    assert listed, "mypy --help no longer lists what --strict enables"
    flags = re.findall(r"--([a-z-]+)", re.sub(r"-\n\s*", "-", listed.group(1)).replace("\n", " "))
    out = {}
    for flag in flags:
        key = flag.replace("-", "_")
        out[key[3:] if key.startswith("no_") else key] = not key.startswith("no_")
    return out


def test_core_is_checked_with_every_flag_of_strict():
    """mypy.ini spells --strict out for components/core (a module section's `strict = True` would
    turn it on everywhere); every flag strict enables is there, and set as strict sets it."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "mypy.ini")
    core = {k: cfg.getboolean(CORE, k) for k in cfg[CORE]}
    strict = _strict_flags()
    assert len(strict) >= 10, strict
    global_only = {"warn_unused_configs", "warn_redundant_casts"}  # mypy takes them in [mypy] only
    for key, value in strict.items():
        section = cfg["mypy"] if key in global_only else core
        assert key in section and (cfg.getboolean("mypy", key) if key in global_only else section[key]) is value, key
    assert "strict" not in cfg["mypy"] and "strict" not in cfg[CORE]


def test_mypy_finds_what_it_is_configured_to_find(tmp_path):
    """The check above can fail: an unannotated function in core is refused, the same one
    elsewhere in components/ passes (checked with mypy's defaults), a type error fails anywhere."""
    (tmp_path / "components" / "core").mkdir(parents=True)
    (tmp_path / "components" / "__init__.py").write_text("")
    (tmp_path / "components" / "core" / "__init__.py").write_text("")
    untyped = "def double(x):\n    return x * 2\n"
    (tmp_path / "components" / "core" / "planted.py").write_text(untyped)
    (tmp_path / "components" / "planted.py").write_text(untyped + "\n\ndef wrong() -> int:\n    return 'text'\n")
    proc = subprocess.run([str(MYPY), "--config-file", str(REPO / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"),
                           "-p", "components"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert any(line.startswith("components/core/planted.py:1:") and "no-untyped-def" in line for line in errors), errors
    assert any(line.startswith("components/planted.py:6:") and "return-value" in line for line in errors), errors
    assert not any(line.startswith("components/planted.py:1:") for line in errors), errors
