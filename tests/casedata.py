"""Helpers shared by the data-driven tests: each case is a JSON file under tests/data/."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# The founding scenario's shared settings; a case replaces whole sections, as a stack file
# replaces a project-level value in Pulumi.
BASE_CONFIG = {
    "model": {"profile": "kimi-k2.6"},
    "serving": {"environment": {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "8"}},
}


def update_golden() -> bool:
    """Whether this run rewrites the golden files (UPDATE_GOLDEN=1: by hand, then reviewed). Refused
    when CI is set (CI=true, as CI services set it; "", 0 and false are not set): a CI run that
    rewrote them would compare each file with itself and pass whatever changed. Every golden
    test asks here (tests/test_golden_files.py checks none reads UPDATE_GOLDEN itself)."""
    if not os.environ.get("UPDATE_GOLDEN"):
        return False
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
        pytest.fail(f"UPDATE_GOLDEN is set with CI={os.environ['CI']}: golden files are rewritten by hand and "
                    "reviewed, never in CI, where every comparison would then pass. Unset UPDATE_GOLDEN (or run "
                    "outside CI, review the diff and commit it)", pytrace=False)
    return True


def cases(folder: str) -> list[tuple[str, dict]]:
    files = sorted((DATA / folder).glob("*.json"))
    assert files, f"no cases in tests/data/{folder}"
    return [(f.stem, json.loads(f.read_text())) for f in files]


def case_config(case: dict) -> dict:
    config = dict(BASE_CONFIG)
    for section, value in case["config"].items():
        if section == "serving" and "environment" not in value:
            value = {**value, "environment": BASE_CONFIG["serving"]["environment"]}
        config[section] = value
    return config
