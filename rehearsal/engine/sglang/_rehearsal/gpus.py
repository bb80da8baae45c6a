"""The GPUs this process can see: nvidia-smi's list narrowed by CUDA_VISIBLE_DEVICES.

The list comes from running nvidia-smi (``$REHEARSAL_NVIDIA_SMI``, default ``nvidia-smi`` on
PATH), so on a rehearsal host it is the simulated tool's hardware profile. CUDA_VISIBLE_DEVICES
is applied as the CUDA runtime does: entries are indices or UUID prefixes, parsing stops at the
first invalid entry, an empty value hides every GPU.
"""
from __future__ import annotations

import dataclasses
import subprocess

QUERY = "index,uuid,name,memory.total,memory.used,memory.free"


@dataclasses.dataclass
class Gpu:
    index: int          # nvidia-smi's (physical) index
    uuid: str
    name: str
    total_mib: int
    used_mib: int
    free_mib: int


class GpuQueryError(Exception):
    pass


def query(env: dict) -> list[Gpu]:
    binary = env.get("REHEARSAL_NVIDIA_SMI") or "nvidia-smi"
    try:
        proc = subprocess.run([binary, "--query-gpu=" + QUERY, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise GpuQueryError(f"{binary} not found: no NVIDIA driver on this host")
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"{binary} did not answer within 30 s")
    if proc.returncode != 0:
        raise GpuQueryError(f"{binary} exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()}")
    gpus = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            raise GpuQueryError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], int(parts[3]), int(parts[4]), int(parts[5])))
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The devices CUDA would enumerate, in CUDA_VISIBLE_DEVICES order."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for token in cuda_visible_devices.split(","):
        token = token.strip()
        match = None
        if token.isdigit():
            match = next((g for g in gpus if g.index == int(token)), None)
        elif token.startswith("GPU-") and len(token) > 4:
            found = [g for g in gpus if g.uuid.startswith(token)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break  # the CUDA runtime stops at the first invalid or repeated entry
        chosen.append(match)
    return chosen


def capacity_mib(gpu: Gpu) -> int:
    """What torch reports as total memory: the driver's total less its reserved part."""
    return gpu.used_mib + gpu.free_mib
