"""The fitness baseline: the machine's fitness facts recorded beside a benchmark's figures
(meta.json `fitness`), compared with what the host reads now. A difference means the figures
measured another machine: `compare` and `advise` mark them "not comparable: <what changed>",
the drift check reports **fitness drift** (its own kind: `pulumi up` cannot repair hardware or a
driver), and `readiness.fitness` (warn | refuse) decides whether a start goes ahead.

The baseline every checkout and provider sees lives with the machine: each benchmark run writes
its fitness beside the figures (meta.json) and, on the host, `BASELINE_FILE` (`baseline_document`),
which the drift check's facts read and the switch's check read with what the GPUs say now (never
drift itself: no resource declares it; a new benchmark replaces it).

Pure; cases under tests/data/fitness/.

Only what a setting or the hardware decides is compared, never a reading that moves with load:
the current clocks, the power draw and the clock event reasons change from one second to the
next; the link's current generation too, unless both readings were taken at P0 (an idle GPU
trains its link down to save power).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

from .errors import shown
from .fitness import GpuFitness, HostFitness

# The drift check's words for this kind (as "superseded: " is for a switch by another stack).
FITNESS_DRIFT = "fitness drift: "
NOT_COMPARABLE = "not comparable: "
POLICIES = ("warn", "refuse")
# Power limits are set in whole watts; the report prints two decimals.
POWER_TOLERANCE_W = 0.5
# The host's baseline: the fitness its newest benchmark recorded (written by `bench`, read by the
# drift check and the switch). Under /var/lib: kept across reboots, as the machine's record is.
BASELINE_FILE = "/var/lib/gpu-serving/fitness-baseline.json"
BASELINE_SCHEMA = 1


@dataclass(frozen=True)
class Change:
    """One fitness fact that differs from the baseline: where (a GPU, or the host), what, the
    value then and now, and what puts it back (empty: nothing does but a new baseline)."""
    where: str
    what: str
    before: str
    after: str
    remedy: str = ""

    def text(self) -> str:
        return f"{self.where}: {self.what} {self.before} -> {self.after}"


Fitness = Union[HostFitness, dict[str, Any], None]


def _fitness(f: Fitness) -> Optional[HostFitness]:
    return f if isinstance(f, HostFitness) or f is None else HostFitness.from_dict(f)


def _w(v: Optional[float]) -> str:
    return "unknown" if v is None else f"{v:g} W"


def _mhz(v: Optional[int]) -> str:
    return "unknown" if v is None else f"{v} MHz"


def _link(gen: Optional[int], width: Optional[int]) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _gpu_changes(then: GpuFitness, now: GpuFitness) -> list[Change]:
    where, i = now.label, now.index
    out: list[Change] = []

    def add(what: str, before: object, after: object, remedy: str = "") -> None:
        out.append(Change(where, what, str(before), str(after), remedy))

    if then.name and now.name and then.name != now.name:
        add("model", then.name, now.name)
    if then.power_limit_w is not None and now.power_limit_w is not None \
            and abs(then.power_limit_w - now.power_limit_w) > POWER_TOLERANCE_W:
        add("power limit", _w(then.power_limit_w), _w(now.power_limit_w), f"nvidia-smi -i {i} -pl {then.power_limit_w:g}")
    for what, a, b, remedy in (
            ("applications clocks", then.applications_graphics_mhz, now.applications_graphics_mhz, f"nvidia-smi -i {i} -rac"),
            ("applications memory clock", then.applications_mem_mhz, now.applications_mem_mhz, f"nvidia-smi -i {i} -rac"),
            ("max SM clock", then.clocks_max_sm_mhz, now.clocks_max_sm_mhz, ""),
            ("max memory clock", then.clocks_max_mem_mhz, now.clocks_max_mem_mhz, "")):
        if a is not None and b is not None and a != b:
            add(what, _mhz(a), _mhz(b), remedy)
    if then.persistence_mode and now.persistence_mode and then.persistence_mode != now.persistence_mode:
        add("persistence mode", then.persistence_mode, now.persistence_mode,
            f"nvidia-smi -i {i} -pm {1 if then.persistence_mode == 'Enabled' else 0}")
    if then.ecc_mode and now.ecc_mode and then.ecc_mode != now.ecc_mode:
        add("ECC", then.ecc_mode, now.ecc_mode, f"nvidia-smi -i {i} -e {1 if then.ecc_mode == 'Enabled' else 0}, then reboot")
    for what, a, b in (("retired pages (single-bit)", then.retired_pages_sbe, now.retired_pages_sbe),
                       ("retired pages (double-bit)", then.retired_pages_dbe, now.retired_pages_dbe),
                       ("remapped rows (correctable)", then.remapped_rows_correctable, now.remapped_rows_correctable),
                       ("remapped rows (uncorrectable)", then.remapped_rows_uncorrectable, now.remapped_rows_uncorrectable)):
        if a is not None and b is not None and a != b:
            add(what, a, b, "a reboot applies pending retirements; keep watching the count (the GPU may need service)")
    for what, a, b in (("retirement pending a reboot", then.retired_pages_pending, now.retired_pages_pending),
                       ("row remapping pending a reboot", then.remapped_rows_pending, now.remapped_rows_pending),
                       ("row remapping failed", then.remapped_rows_failure, now.remapped_rows_failure)):
        if a is not None and b is not None and a != b:
            add(what, "yes" if a else "no", "yes" if b else "no")
    if (then.pcie_gen_max, then.pcie_width_max) != (now.pcie_gen_max, now.pcie_width_max) \
            and None not in (then.pcie_gen_max, then.pcie_width_max, now.pcie_gen_max, now.pcie_width_max):
        add("PCIe slot", _link(then.pcie_gen_max, then.pcie_width_max), _link(now.pcie_gen_max, now.pcie_width_max),
            "check the slot and its BIOS settings")
    gen_counts = then.perf_state == now.perf_state == "P0"
    link_then = (then.pcie_gen_current if gen_counts else None, then.pcie_width_current)
    link_now = (now.pcie_gen_current if gen_counts else None, now.pcie_width_current)
    if then.pcie_width_current is not None and now.pcie_width_current is not None and link_then != link_now:
        add("PCIe link", _link(then.pcie_gen_current, then.pcie_width_current),
            _link(now.pcie_gen_current, now.pcie_width_current), "reseat the card or check the riser; a reboot retrains the link")
    return out


def compare(baseline: Fitness, now: Fitness) -> Optional[list[Change]]:
    """What changed from the baseline to now; [] when nothing did; None when either side was
    never read (a run recorded before gpu-serving read fitness, a host not reached): unknown,
    which is neither "comparable" nor "not comparable"."""
    then, cur = _fitness(baseline), _fitness(now)
    if then is None or cur is None or not then.gpus or not cur.gpus:
        return None
    out: list[Change] = []
    # NCCL only when both readings found it in the same place: the serving venv's (pip's, which
    # torch prefers) is the stack's own declaration (venv.packages), the system's is the machine's;
    # a reading of one against the other would be a change of what was read, not of the host.
    same_nccl = (then.nccl_source or "system") == (cur.nccl_source or "system")
    for what, a, b in (("driver", then.driver_version, cur.driver_version),
                       ("CUDA (driver API)", then.cuda_version, cur.cuda_version),
                       ("NCCL", then.nccl_version if same_nccl else None, cur.nccl_version)):
        if a and b and a != b:
            out.append(Change("host", what, a, b))
    if then.iommu is not None and cur.iommu is not None and then.iommu != cur.iommu:
        out.append(Change("host", "IOMMU", "on" if then.iommu else "off", "on" if cur.iommu else "off",
                          "the kernel command line (intel_iommu/amd_iommu, iommu=pt), then reboot"))
    if then.acs_redirecting is not None and cur.acs_redirecting is not None and then.acs_redirecting != cur.acs_redirecting:
        out.append(Change("host", "PCIe bridges redirecting peer-to-peer (ACS)", str(then.acs_redirecting),
                          str(cur.acs_redirecting), "ACS is set by the BIOS or setpci at boot"))
    key = (lambda g: g.uuid) if all(g.uuid for g in (*then.gpus, *cur.gpus)) else (lambda g: str(g.index))
    before, after = {key(g): g for g in then.gpus}, {key(g): g for g in cur.gpus}
    new_by_slot = {g.bus_id: g for k, g in after.items() if k not in before and g.bus_id}
    swapped = set()
    for k, g in before.items():
        if k in after:
            continue
        other = new_by_slot.get(g.bus_id)
        if other is not None:  # another card in the same slot
            swapped.add(key(other))
            out.append(Change(g.label, "card", f"{g.name} {g.uuid}".strip(), f"{other.name} {other.uuid}".strip()))
        else:
            out.append(Change(g.label, "GPU", f"{g.name} {g.uuid}".strip(), "gone"))
    for k, g in after.items():
        if k in before:
            out += _gpu_changes(before[k], g)
        elif k not in swapped:
            out.append(Change(g.label, "GPU", "absent", f"{g.name} {g.uuid}".strip()))
    return out


def not_comparable(changes: Iterable[Change]) -> str:
    """The mark a figure measured on another machine carries (compare, advise, status)."""
    return NOT_COMPARABLE + "; ".join(c.text() for c in changes)


def drift_message(host: str, changes: list[Change], baseline: str) -> str:
    """The drift check's line: fitness drift on a host since a baseline, each change from what to
    what on which GPU, and why `up` does not repair it."""
    remedies = list(dict.fromkeys(f"{c.where}: {c.remedy}" for c in changes if c.remedy))
    return (f"{FITNESS_DRIFT}{host} since {baseline}: " + "; ".join(c.text() for c in changes)
            + ". Not repairable by `pulumi up` (the machine changed, not a file)"
            + (": " + "; ".join(remedies) if remedies else "")
            + "; or benchmark again (`python -m components bench`) to make this the baseline.")


def is_fitness_drift(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(FITNESS_DRIFT)


def check_policy(value: Any) -> str:
    """`readiness.fitness`: warn (the default) or refuse; the message says what each does."""
    if isinstance(value, str) and value in POLICIES:
        return value
    raise ValueError(f"{shown(value)} is not warn or refuse: warn (the default) starts on a machine whose fitness drifted "
                     "from its benchmark baseline and says what changed; refuse stops the switch before anything stops")


def verdict(policy: str, host: str, changes: Optional[list[Change]], baseline: str, stack: str) -> tuple[Optional[str], Optional[str]]:
    """(refusal, warning) of a start on `host` under `readiness.fitness` = policy; (None, None)
    when nothing changed or nothing is known. A refusal is said before anything stops."""
    if not changes:
        return None, None
    what = "; ".join(c.text() for c in changes)
    if policy == "refuse":
        return (f"readiness.fitness is refuse and {host}'s fitness drifted since {baseline}: {what}. Nothing was "
                f"stopped: stack {stack} was not started. Restore the machine, benchmark it again to make this the "
                "baseline, or set readiness.fitness: warn to start anyway."), None
    return None, (f"{host}'s fitness drifted since {baseline}: {what}; starting anyway (readiness.fitness: warn): "
                  "figures measured before are not comparable")


def baseline_of(runs: Iterable[Any], host: str) -> Optional[Any]:
    """The newest benchmark run (bench_results.Run, oldest first as load_runs gives them) on
    `host` that recorded fitness: the baseline a host's fitness is compared with."""
    found = [r for r in runs if getattr(r, "fitness", None) and r.host == host]
    return found[-1] if found else None


# --------------------------------------------------------------------------- the host's baseline

@dataclass(frozen=True)
class HostBaseline:
    """The baseline a host keeps (BASELINE_FILE): which benchmark recorded it, and its fitness."""
    stack: str
    run: str  # <stack>/<folder> under results/bench of the checkout that ran it
    date: str  # the run's start, UTC ISO 8601
    host: str  # the host as the benchmark named it (its settings' target, and its fleet entry)
    fitness: dict[str, Any]

    def words(self) -> str:
        """How messages name it: "the benchmark of 2026-12-01 (tp8)"."""
        return f"the benchmark of {self.date[:10]} ({self.stack})"


def baseline_document(*, stack: str, run: str, date: str, host: str, fitness: dict[str, Any]) -> str:
    """BASELINE_FILE's text, as `bench` writes it after a run that read the host's fitness."""
    return json.dumps({"schema": BASELINE_SCHEMA, "stack": stack, "run": run, "date": date, "host": host,
                       "fitness": fitness}, indent=1, sort_keys=True) + "\n"


def parse_baseline(text: Optional[str]) -> tuple[Optional[HostBaseline], Optional[str]]:
    """(baseline, problem) from BASELINE_FILE's text: (None, None) when the host has none (never
    benchmarked); a file that is not one is a problem named, never a drift."""
    if text is None or not text.strip():
        return None, None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return None, f"{BASELINE_FILE} is not JSON ({exc}); benchmark again to write it anew"
    if not isinstance(doc, dict) or not isinstance(doc.get("fitness"), dict) or doc.get("schema") != BASELINE_SCHEMA:
        return None, f"{BASELINE_FILE} is not a fitness baseline of schema {BASELINE_SCHEMA}; benchmark again to write it anew"
    return HostBaseline(stack=str(doc.get("stack") or "?"), run=str(doc.get("run") or ""), date=str(doc.get("date") or ""),
                        host=str(doc.get("host") or ""), fitness=doc["fitness"]), None


def drift_of(host: str, baseline: Optional[HostBaseline], now: Fitness) -> str:
    """The drift check's line for a host (`drift_message`), or "" when nothing changed or
    nothing is known (no baseline, the GPUs not read)."""
    if baseline is None:
        return ""
    changes = compare(baseline.fitness, now)
    return drift_message(host, changes, baseline.words()) if changes else ""
