"""The bad-input corpus (tests/data/bad-input/) as projects on disk and as the engine's config.

A case is one YAML file:
- `config`: what a stack file says, sections without the namespace (they replace the project's
  sections of Pulumi.yaml, as Pulumi does); tp8's layout is added unless it states a strategy;
- or `stackFile`: the whole text of Pulumi.<stack>.yaml, for shapes `config` cannot express;
- `projectConfig`: entries added to the config of the repository's Pulumi.yaml (raw, namespaced);
- `otherStacks`: {name: text of Pulumi.<name>.yaml}, beside the repository's tp8, pp8, ep8;
- `secrets`: keys of `config` given with `pulumi config set --secret`: encrypted in the stack
  file (`plan` never sees the value), decrypted for the program;
- `stack` (default "bad"), `why`, and `expect`: the setting the error names and a phrase of it;
- `accept: true`: an ordinary setting a check once refused (must be accepted; no `expect`);
- `planOnly`: why only `plan` can refuse it (Pulumi resolves the file itself before any program
  runs); such a case is left out of the engine batch of tests/e2e/test_hardening_input.py.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import yaml

from components.core.pulumi_yaml import PulumiLoader, dump
from components.core.stack_config import SECRET, from_files

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "data" / "bad-input"
NS = "gpu-serving"


def cases() -> list[tuple[str, dict]]:
    # Read as Pulumi reads a stack file (`config` is what one says), written back with pulumi_yaml.dump.
    return [(f.stem, load(f.read_text())) for f in sorted(CORPUS.glob("*.yaml"))]


def load(text: str):
    return yaml.load(text, Loader=PulumiLoader)  # noqa: S506 - a SafeLoader subclass


def refused_cases() -> list[tuple[str, dict]]:
    """The invalid configurations: every case but the `accept: true` ones."""
    return [(n, c) for n, c in cases() if not c.get("accept")]


def accepted_cases() -> list[tuple[str, dict]]:
    """overrefusal-*: ordinary settings a check once refused (`accept: true`)."""
    return [(n, c) for n, c in cases() if c.get("accept")]


def stack_of(case: dict) -> str:
    return case.get("stack", "bad")


def write_project(base: Path, case: dict) -> Path:
    """A project directory holding the case: the repository's Pulumi.yaml and stack files, the
    case's stack file and any other stacks it names."""
    project = base / "project"
    project.mkdir(parents=True, exist_ok=True)
    doc = load((ROOT / "Pulumi.yaml").read_text())
    doc["config"].update(copy.deepcopy(case.get("projectConfig") or {}))
    (project / "Pulumi.yaml").write_text(dump(doc))
    for name in ("tp8", "pp8", "ep8"):
        shutil.copy(ROOT / f"Pulumi.{name}.yaml", project / f"Pulumi.{name}.yaml")
    for name, text in (case.get("otherStacks") or {}).items():
        (project / f"Pulumi.{name}.yaml").write_text(text)
    path = project / f"Pulumi.{stack_of(case)}.yaml"
    if "stackFile" in case:
        path.write_text(case["stackFile"])
    else:
        config = {f"{NS}:{k}": copy.deepcopy(v) for k, v in case["config"].items()}
        config.setdefault(f"{NS}:strategy", {"tpSize": 8})
        for key in case.get("secrets") or ():
            config[f"{NS}:{key}"] = {"secure": "v1:c2VjcmV0LW5vdC1zaG93bg=="}
        path.write_text(dump({"config": config}))
    return project


def engine_config(project: Path, case: dict) -> tuple[dict[str, str], list[str]]:
    """What the engine hands the program for this project and stack (PULUMI_CONFIG and its
    secret keys): every key, a text each (objects as JSON), secrets decrypted."""
    raw = from_files(project, stack_of(case))
    out = {}
    for key, value in raw.values.items():
        if value is SECRET:
            # The engine decrypts; a case states the clear value only when its shape matters.
            value = (case.get("config") or {}).get(key.split(":", 1)[1], "decrypted-value")
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out, sorted(raw.secret_keys)
