"""Advise before deploying: every layout SGLang could run on the host's GPUs, the ones it would
refuse (with the rule, from `strategy.check_strategy` and the memory plan), and the valid ones
ranked per stated concurrency by an explicit cost model (advise_model.py, docs/advise.md),
calibrated on the benchmark results measured at the same workload (advise_calibration.py).
Every figure is an estimate. The text and JSON forms: advise_report.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional

from .advise_calibration import Calibration, calibrate, fit_seed, host_from_facts, seed_error
from .advise_model import (
    DEFAULT_CONCURRENCY,
    Candidate,
    Context,
    Estimate,
    Tuning,
    Workload,
    candidate_layouts,
    estimate,
    gpu_figures,
    judge,
    layout_name,
    link_of,
)
from .advise_results import Measurement
from .compare import TIE_PERCENT
from .config import StackSettings
from .errors import SettingError
from .strategy import Layout

# What the commands and the tests use from `advise` besides the advice itself.
__all__ = [
    "DEFAULT_CONCURRENCY", "Advice", "Estimate", "OwnStack", "Tuning", "Workload", "advise", "fit_seed",
    "host_from_facts", "layout_name", "seed_error",
]


@dataclass(frozen=True)
class OwnStack:
    """One of the project's stacks, as the advice sees it: its layout valid or refused on this
    host, or not one of the layouts considered (multi-node, another GPU count), or unreadable."""

    name: str
    layout: Optional[Layout]
    verdict: str  # "valid", "refused", "not considered", "unreadable"
    detail: str = ""


@dataclass
class Advice:
    settings: StackSettings
    source: str  # where the host figures come from
    ctx: Context
    valid: list[Candidate]
    refused: list[Candidate]
    ranking: dict[int, list[Estimate]]
    calibration: Optional["Calibration"] = None
    notes: list[str] = field(default_factory=list)
    own: list[OwnStack] = field(default_factory=list)
    workload_from: str = "given"  # where the lengths come from: the stack's benchmark settings, or flags
    # The advised stack's own refusals by plan/preview/up (the CLI runs plan.check_stack): the
    # advice is still printed, and the command exits non-zero.
    stack_refused: list[SettingError] = field(default_factory=list)
    # The failure ledger's warnings before each project stack's start (the words plan and preview
    # say: core/ledger.py warnings_for), by stack.
    ledger: dict[str, list[str]] = field(default_factory=dict)

    @property
    def model_error(self) -> float:
        """The model's mean error: on the benchmark results calibrated on, else on the seed's
        four measurements it was fitted to."""
        cal = self.calibration
        return cal.error_after if cal and cal.points else seed_error()

    @property
    def tie_band(self) -> float:
        """Estimates closer than this are a tie: within the model's error, and never closer than
        `compare` calls a measured tie."""
        return max(self.model_error, TIE_PERCENT / 100)

    def leaders(self, estimates: list[Estimate]) -> list[Estimate]:
        """The estimates the model cannot tell from the best (within `tie_band` of it)."""
        if not estimates:
            return []
        top = max(e.tok_s for e in estimates)
        return [e for e in estimates if e.tok_s * (1 + self.tie_band) >= top]


def advise(settings: StackSettings, workload: Workload, *, stacks: Optional[Mapping[str, Layout | str]] = None,
           measured: Iterable["Measurement"] = (), source: str = "host block", tuning: Optional[Tuning] = None) -> Advice:
    """Every layout for the host's GPU count, refused ones with the rule, valid ones ranked for
    each concurrency of `workload`; calibrated on the `measured` results of that workload.
    `stacks`: the project's stacks, each its layout or why it cannot be read."""
    h = settings.host
    link = link_of(h.interconnect)
    gpu = gpu_figures(h.gpu_model)
    ctx = Context(link, gpu, tuning or Tuning.shipped(), workload)
    notes = []
    if not gpu.known:
        notes.append(f"GPU model {h.gpu_model!r} is not in components/core/data/gpus.json: "
                     f"assuming {gpu.name} figures ({gpu.bandwidth_gbps:g} GB/s)")
    judged = [judge(settings, L) for L in candidate_layouts(h.gpu_count, settings.model.num_experts > 0)]
    layouts = {name: L for name, L in (stacks or {}).items() if isinstance(L, Layout)}
    for c in judged:
        c.stacks = sorted(name for name, L in layouts.items() if L == c.layout)
    valid = [c for c in judged if c.valid]
    refused = [c for c in judged if not c.valid]
    measured = list(measured)
    # Only measurements of this workload say anything about these estimates (issue 36.16).
    same = [m for m in measured if m.is_at(workload.input_len, workload.output_len)]
    notes += other_workloads([m for m in measured if m not in same], workload)
    calibration = None
    if same and valid:
        calibration = calibrate(valid, same, ctx)
        ctx = replace(ctx, tuning=calibration.tuning)
    ranking = {}
    for conc in workload.concurrency:
        estimates = [estimate(c, conc, ctx) for c in valid]
        for e in estimates:
            e.measured = next((m.output_throughput for m in same
                               if m.layout == _layout_by_name(valid, e.name) and m.concurrency == conc), None)
        ranking[conc] = sorted(estimates, key=lambda e: (-e.tok_s, e.name))
    return Advice(settings, source, ctx, valid, refused, ranking, calibration, notes, own_stacks(stacks or {}, judged, h.gpu_count))


def other_workloads(others: list["Measurement"], workload: Workload) -> list[str]:
    """A note per stack and workload for the results not used: measured at other lengths."""
    groups: dict[tuple[str, str], list[int]] = {}
    for m in others:
        groups.setdefault((m.stack, m.workload), []).append(m.concurrency)
    notes = []
    for (stack, measured_at), measured_levels in sorted(groups.items()):
        levels = ", ".join(map(str, sorted(set(measured_levels))))
        use = next((m for m in others if m.stack == stack and m.workload == measured_at), None)
        hint = (f" (--input-len {use.input_len} --output-len {use.output_len} advises for them)"
                if use and use.input_len and use.output_len and use.range_ratio == 1.0 else "")
        notes.append(f"results of {stack} at C={levels} were measured at {measured_at}, not this workload "
                     f"({workload.input_len} in / {workload.output_len} out): not calibrated on, not shown{hint}")
    return notes


def own_stacks(stacks: Mapping[str, Layout | str], judged: list[Candidate], gpus: int) -> list[OwnStack]:
    out = []
    for name, L in sorted(stacks.items()):
        if not isinstance(L, Layout):
            out.append(OwnStack(name, None, "unreadable", str(L)))
            continue
        c = next((c for c in judged if c.layout == L), None)
        if c is None:
            why = ("the advisor covers one host" if L.nnodes > 1
                   else f"not a layout of this host's {gpus} GPUs")
            out.append(OwnStack(name, L, "not considered", why))
        elif c.valid:
            out.append(OwnStack(name, L, "valid"))
        else:
            e = c.refused[0]
            out.append(OwnStack(name, L, "refused", f"{e.setting}: {e.rule}"))
    return out


def _layout_by_name(cands: list[Candidate], name: str) -> Optional[Layout]:
    return next((c.layout for c in cands if c.name == name), None)
