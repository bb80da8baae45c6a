"""The fitness side of the rehearsal nvidia-smi: the profile keys behind power limits, clocks,
ECC memory and the PCIe link, their query fields, and the degradations a test or an operator
applies to a running rehearsal host (a power cap, clocks locked low, a link retrained at Gen4
x8, retired memory, persistence off), as a real machine degrades without a restart.

Stdlib only: nvidia_smi.py imports it from the same directory (both are bind-mounted read-only
at /usr/lib/rehearsal on a rehearsal host).

Degradations live in their own file, `$REHEARSAL_GPU_DEGRADE` (default
/etc/rehearsal/gpu-degrade.json), read on every call like the profile; `python -m rehearsal
degrade` writes it into a host (rehearsal/degrade.py):

    {"schema": 1, "gpus": {"2": {"power_cap_w": 450, "pcie": "gen4x8"}, "all": {"persistence_off": true}}}
"""
from __future__ import annotations

import json
import os
import re

DEFAULT_DEGRADE = "/etc/rehearsal/gpu-degrade.json"

# Profile keys (every GPU gets them unless its profile entry says otherwise). None: derived
# from another key at load (the default power limit is the profile's limit, the applications
# clocks are the maximum clocks, the pending ECC mode is the current one).
FITNESS_DEFAULTS = {
    "power_default_limit_w": None,
    "clocks_applications_graphics_mhz": None,
    "clocks_applications_mem_mhz": None,
    "clock_event_reasons_active": [],  # e.g. ["applications_clocks_setting", "sw_power_cap"]
    "ecc_pending": None,
    # Hopper and later report memory errors as remapped rows; page retirement is N/A there.
    "retired_pages_sbe": "N/A",
    "retired_pages_dbe": "N/A",
    "retired_pages_pending": "N/A",
    "remapped_rows_corr": 0,
    "remapped_rows_unc": 0,
    "remapped_rows_pending": "No",
    "remapped_rows_failure": "No",
}
# <clocks_event_reason_*> elements of the report, in the driver 580 order.
EVENT_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                 "hw_power_brake_slowdown", "sync_boost", "sw_thermal_slowdown", "display_clocks_setting")


def derive(gpu: dict) -> dict:
    """Fill the keys FITNESS_DEFAULTS leaves None, from the GPU's own values (before degradation)."""
    if gpu.get("power_default_limit_w") is None:
        gpu["power_default_limit_w"] = gpu["power_limit_w"]
    if gpu.get("clocks_applications_graphics_mhz") is None:
        gpu["clocks_applications_graphics_mhz"] = gpu["clocks_max_graphics_mhz"]
    if gpu.get("clocks_applications_mem_mhz") is None:
        gpu["clocks_applications_mem_mhz"] = gpu["clocks_max_mem_mhz"]
    if gpu.get("ecc_pending") is None:
        gpu["ecc_pending"] = gpu["ecc_mode"]
    return gpu


# --------------------------------------------------------------------------- degradations

class DegradeError(Exception):
    """A degradation file or value the stand-in cannot apply; the message names it."""


def _power_cap(gpu: dict, watts) -> None:
    w = float(watts)
    if not float(gpu["power_min_limit_w"]) <= w <= float(gpu["power_max_limit_w"]):
        raise DegradeError(f"power_cap_w {watts!r} is outside the GPU's range {gpu['power_min_limit_w']:g}-"
                           f"{gpu['power_max_limit_w']:g} W (nvidia-smi -pl refuses it too)")
    gpu["power_limit_w"] = w
    gpu["power_draw_w"] = min(float(gpu["power_draw_w"]), w)
    gpu["power_draw_average_w"] = min(float(gpu["power_draw_average_w"]), w)


def _clocks_locked(gpu: dict, mhz) -> None:
    m = int(mhz)
    if not 0 < m <= int(gpu["clocks_max_graphics_mhz"]):
        raise DegradeError(f"clocks_locked_mhz {mhz!r} is not between 1 and the GPU's {gpu['clocks_max_graphics_mhz']} MHz")
    gpu["clocks_applications_graphics_mhz"] = m
    gpu["clocks_graphics_mhz"] = min(int(gpu["clocks_graphics_mhz"]), m)
    gpu["clocks_sm_mhz"] = min(int(gpu["clocks_sm_mhz"]), m)
    reasons = list(gpu["clock_event_reasons_active"])
    gpu["clock_event_reasons_active"] = reasons + [r for r in ("applications_clocks_setting",) if r not in reasons]


_LINK = re.compile(r"gen([1-6])x(1|2|4|8|16|32)")


def _pcie(gpu: dict, link) -> None:
    m = _LINK.fullmatch(str(link).lower())
    if not m:
        raise DegradeError(f"pcie {link!r} is not a link like 'gen4x8'")
    gen, width = int(m.group(1)), int(m.group(2))
    if gen > int(gpu["pcie_gen_max"]) or width > int(gpu["pcie_width_max"]):
        raise DegradeError(f"pcie {link!r} is above the GPU's Gen{gpu['pcie_gen_max']} x{gpu['pcie_width_max']}")
    gpu["pcie_gen_current"], gpu["pcie_width_current"] = gen, width


def _ecc_retired(gpu: dict, count) -> None:
    n = int(count)
    if n < 0:
        raise DegradeError(f"ecc_retired_pages {count!r} is negative")
    if gpu["retired_pages_dbe"] == "N/A":  # a GPU that remaps rows (Hopper, Blackwell)
        gpu["remapped_rows_unc"] = n
        gpu["remapped_rows_pending"] = "Yes" if n else "No"
    else:
        gpu["retired_pages_dbe"] = n
        gpu["retired_pages_pending"] = "Yes" if n else "No"


def _persistence_off(gpu: dict, off) -> None:
    if not isinstance(off, bool):
        raise DegradeError(f"persistence_off {off!r} is not true or false")
    gpu["persistence_mode"] = "Disabled" if off else "Enabled"


# Each degradation in the operator's words, and what it changes in the GPU's answers.
DEGRADATIONS = {
    "power_cap_w": _power_cap,  # `nvidia-smi -pl W`: the enforced limit below the default
    "clocks_locked_mhz": _clocks_locked,  # `nvidia-smi -ac`/`-lgc`: clocks held at MHz
    "pcie": _pcie,  # the link retrained below the slot's, e.g. "gen4x8"
    "ecc_retired_pages": _ecc_retired,  # memory retired (or rows remapped) after ECC errors, pending a reboot
    "persistence_off": _persistence_off,  # `nvidia-smi -pm 0`
}


def load_degradations(path: str) -> dict:
    """{"all" | "<index>": {degradation: value}}; {} without a file."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DegradeError(f"cannot read the degradation file {path}: {exc}")
    if not isinstance(doc, dict) or doc.get("schema") != 1 or not isinstance(doc.get("gpus"), dict):
        raise DegradeError(f"{path}: expected {{\"schema\": 1, \"gpus\": {{\"<index>|all\": {{...}}}}}}")
    for which, changes in doc["gpus"].items():
        if which != "all" and not str(which).isdigit():
            raise DegradeError(f"{path}: GPU {which!r} is neither an index nor \"all\"")
        unknown = sorted(set(changes) - set(DEGRADATIONS)) if isinstance(changes, dict) else ["(not an object)"]
        if unknown:
            raise DegradeError(f"{path}: GPU {which}: unknown degradation(s) {', '.join(unknown)}; "
                               f"known: {', '.join(DEGRADATIONS)}")
    return doc["gpus"]


def apply_degradations(gpus: list[dict], path: str) -> list[dict]:
    """The profile's GPUs with the file's degradations applied ("all" first, then per index)."""
    table = load_degradations(path)
    for which in [k for k in table if k != "all"]:
        if int(which) not in {g["index"] for g in gpus}:
            raise DegradeError(f"{path}: GPU {which} is not in the profile (indices {[g['index'] for g in gpus]})")
    for gpu in gpus:
        for changes in (table.get("all") or {}, table.get(str(gpu["index"])) or {}):
            for name, value in changes.items():
                try:
                    DEGRADATIONS[name](gpu, value)
                except DegradeError as exc:
                    raise DegradeError(f"{path}: GPU {gpu['index']}: {exc}")
                except (TypeError, ValueError) as exc:
                    raise DegradeError(f"{path}: GPU {gpu['index']}: {name} {value!r}: {exc}")
    return gpus


def degrade_path() -> str:
    return os.environ.get("REHEARSAL_GPU_DEGRADE", DEFAULT_DEGRADE)


# --------------------------------------------------------------------------- the answers

def xml_values(gpu: dict) -> dict:
    """The template's fitness placeholders."""
    active = set(gpu["clock_event_reasons_active"])
    values = {f"reason_{r}": "Active" if r in active else "Not Active" for r in EVENT_REASONS}
    values["power_default"] = "%.2f W" % float(gpu["power_default_limit_w"])
    return values


def _plain(value, nounits):
    return "[N/A]" if value is None or value == "N/A" else str(value)


def _mhz(value, nounits):
    return "[N/A]" if value in (None, "N/A") else (str(value) if nounits else "%s MHz" % value)


def _watts(value, nounits):
    return "[N/A]" if value in (None, "N/A") else ("%.2f" % float(value) if nounits else "%.2f W" % float(value))


def _reason(name):
    return lambda g, c: "Active" if name in g["clock_event_reasons_active"] else "Not Active"


# --query-gpu fields of `nvidia-smi --help-query-gpu` this module answers (name -> (header unit,
# formatter, getter)); nvidia_smi.py adds them to its own table.
QUERY_GPU_FIELDS = {
    "power.default_limit": ("W", _watts, lambda g, c: g["power_default_limit_w"]),
    "clocks.applications.graphics": ("MHz", _mhz, lambda g, c: g["clocks_applications_graphics_mhz"]),
    "clocks.applications.memory": ("MHz", _mhz, lambda g, c: g["clocks_applications_mem_mhz"]),
    "clocks.default_applications.graphics": ("MHz", _mhz, lambda g, c: g["clocks_max_graphics_mhz"]),
    "clocks.default_applications.memory": ("MHz", _mhz, lambda g, c: g["clocks_max_mem_mhz"]),
    "retired_pages.single_bit_ecc.count": (None, _plain, lambda g, c: g["retired_pages_sbe"]),
    "retired_pages.double_bit.count": (None, _plain, lambda g, c: g["retired_pages_dbe"]),
    "retired_pages.pending": (None, _plain, lambda g, c: g["retired_pages_pending"]),
    **{f"clocks_event_reasons.{r}": (None, _plain, _reason(r)) for r in EVENT_REASONS if r != "display_clocks_setting"},
}
QUERY_GPU_ALIASES = {
    "clocks.applications.gr": "clocks.applications.graphics", "clocks.applications.mem": "clocks.applications.memory",
    "clocks.default_applications.gr": "clocks.default_applications.graphics",
    "clocks.default_applications.mem": "clocks.default_applications.memory",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count", "retired_pages.dbe": "retired_pages.double_bit.count",
    # the names before driver 535
    **{f"clocks_throttle_reasons.{r}": f"clocks_event_reasons.{r}" for r in EVENT_REASONS if r != "display_clocks_setting"},
}
