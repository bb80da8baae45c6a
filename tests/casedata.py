"""Helpers shared by the data-driven tests: each case is a JSON file under tests/data/."""
from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data"

# The founding scenario's shared settings; a case replaces whole sections, as a stack file
# replaces a project-level value in Pulumi.
BASE_CONFIG = {
    "model": {"profile": "kimi-k2.6"},
    "serving": {"environment": {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "8"}},
}


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
