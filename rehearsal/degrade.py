"""Degrade a rehearsal host's simulated GPUs while it runs, as a real machine degrades without a
restart: a power cap, clocks locked low, a PCIe link retrained at Gen4 x8, retired memory,
persistence mode off. ``python -m rehearsal degrade NAME --gpu 2 --power-cap 450``.

The degradations are a file in the host's own disk, /etc/rehearsal/gpu-degrade.json, which its
nvidia-smi reads on every call (rehearsal/gpu/nvidia_smi_fitness.py): they show at the next
read, survive a reboot (as a retrained link or retired memory would) and go with `--clear` or
`down`. The file is checked against the host's GPU profile before it is written: a cap outside
the GPU's range, or a link above its own, is refused here, not by the next nvidia-smi.
From inside the host, writing the same file does the same (a test may do it over SSH).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

from .common import RehearsalError, instance_dir, write_file
from .machine import GPU_DIR, InstanceConfig

GUEST_DEGRADE = "etc/rehearsal/gpu-degrade.json"


def _stand_in():
    """rehearsal/gpu/nvidia_smi.py as a module (it imports its sibling from its own directory)."""
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    spec = importlib.util.spec_from_file_location("rehearsal_nvidia_smi", GPU_DIR / "nvidia_smi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def degrade_file(name: str) -> Path:
    """The file as this machine writes it: through the mounted overlay while the host runs (a
    write into the upper directory under a mounted overlay is undefined), else into its upper dir."""
    merged = instance_dir(name) / "merged"
    base = merged if os.path.ismount(merged) else instance_dir(name) / "upper"
    return base / GUEST_DEGRADE


def current(name: str) -> dict:
    path = degrade_file(name)
    try:
        return json.loads(path.read_text())["gpus"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError) as exc:
        raise RehearsalError(f"{path}: unreadable degradation file ({exc}); `python -m rehearsal degrade {name} --clear`")


def degrade(name: str, gpus: list[str], changes: dict) -> dict:
    """Add `changes` ({degradation: value}, rehearsal/gpu/nvidia_smi_fitness.DEGRADATIONS) to the
    GPUs `gpus` (indices as strings, or ["all"]) of host `name`; returns the file's GPU table."""
    cfg = InstanceConfig.load(name)
    if cfg is None:
        raise RehearsalError(f"no rehearsal host {name!r}: `python -m rehearsal up {name}` first")
    if not cfg.profile_path:
        raise RehearsalError(f"rehearsal host {name!r} has no GPU profile: nothing to degrade")
    if not changes:
        raise RehearsalError("no degradation given (e.g. --power-cap 450, --pcie gen4x8)")
    table = current(name)
    for gpu in gpus:
        table[gpu] = {**table.get(gpu, {}), **changes}
    doc = {"schema": 1, "gpus": table}
    smi = _stand_in()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(doc, f)
        f.flush()
        old = os.environ.get("REHEARSAL_GPU_DEGRADE")
        os.environ["REHEARSAL_GPU_DEGRADE"] = f.name
        try:
            smi.load_profile(cfg.profile_path)
        except smi.ProfileError as exc:
            raise RehearsalError(str(exc).replace(f.name, f"the degradation of {name}")) from None
        finally:
            if old is None:
                os.environ.pop("REHEARSAL_GPU_DEGRADE", None)
            else:
                os.environ["REHEARSAL_GPU_DEGRADE"] = old
    write_file(degrade_file(name), json.dumps(doc, indent=2) + "\n", 0o644)
    return table


def clear(name: str) -> Optional[Path]:
    """Every degradation gone (the profile's hardware again); the file removed, if there was one."""
    path = degrade_file(name)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
