"""The cost model's constants fitted to measurements: the shipped ones to the seed's four
measured points (`fit_seed`, run by hand when the model changes: docs/advise.md), and the
scales `advise` calibrates on a project's benchmark results at the advised workload
(`calibrate`); the host block replaced by what the host said at deploy time (`host_from_facts`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from .advise_model import Candidate, Context, Tuning, Workload, estimate, gpu_figures, judge, json_data, link_of
from .advise_results import Measurement
from .config import StackSettings
from .strategy import Layout


@dataclass
class Calibration:
    tuning: Tuning
    points: list[Measurement]
    error_before: float  # mean |log(estimate / measured)|, as a ratio - 1
    error_after: float
    rehearsal: bool


SCALES = [round(0.25 * 2 ** (i / 4), 4) for i in range(17)]  # 0.25 .. 4, four steps an octave


def _error(cands: dict[Layout, Candidate], points: list[Measurement], ctx: Context) -> float:
    errs = [abs(math.log(estimate(cands[p.layout], p.concurrency, ctx).tok_s / p.output_throughput)) for p in points]
    return sum(errs) / len(errs)


def calibrate(valid: list[Candidate], measured: list[Measurement], ctx: Context) -> Calibration:
    """Scale the model's communication, GPU time and PP hand-off so its estimates meet the
    measured points (least mean log error; a scale away from 1 costs a little, so one point does
    not swing all three)."""
    cands = {c.layout: c for c in valid}
    points = [m for m in measured if m.layout in cands and m.output_throughput > 0]
    if not points:
        return Calibration(ctx.tuning, [], 0.0, 0.0, False)
    before = _error(cands, points, ctx)
    best, best_cost = ctx.tuning, None
    for comm in SCALES:
        for gpu in SCALES:
            for stage in SCALES:
                tuning = replace(ctx.tuning, comm_scale=ctx.tuning.comm_scale * comm, gpu_scale=gpu, overlap_scale=stage)
                err = _error(cands, points, replace(ctx, tuning=tuning))
                cost = err + 0.01 * sum(abs(math.log(x)) for x in (comm, gpu, stage))
                if best_cost is None or cost < best_cost - 1e-12:
                    best, best_cost = tuning, cost
    after = _error(cands, points, replace(ctx, tuning=best))
    return Calibration(best, points, math.exp(before) - 1, math.exp(after) - 1, any(p.rehearsal for p in points))


# The seed (notes/sglang.md): Kimi K2.6 on 8 x RTX PRO 6000 (96 GB, PCIe), measured by hand.
SEED_POINTS = (("tp8", Layout(8, 1, 1, 1, False, "none"), 1, 26.0), ("tp8", Layout(8, 1, 1, 1, False, "none"), 32, 808.0),
               ("pp8", Layout(1, 8, 1, 1, False, "none"), 1, 37.0), ("pp8", Layout(1, 8, 1, 1, False, "none"), 64, 396.0))


def seed_measurements() -> list[Measurement]:
    # Measured with 1024 input and 1024 output tokens a request.
    return [Measurement(stack, L, c, tok, input_len=1024, output_len=1024) for stack, L, c, tok in SEED_POINTS]


def seed_error() -> float:
    """The shipped constants' mean error on the seed's measurements (data/advise-model.json
    `seedError`, what `fit_seed` returns with them; checked by the tests)."""
    return float(json_data("advise-model.json")["seedError"])


def fit_seed(settings: StackSettings, workload: Workload = Workload()) -> tuple[Tuning, float]:
    """The host constants of data/advise-model.json: a grid search for the efficiency, the layer
    cost, the pipeline overlap and the link scale that bring the model nearest (mean log error)
    to the seed's four measurements, on the seed's host (`settings`). Returns the tuning and its
    mean error; run by hand when the model changes (docs/advise.md), checked by the tests."""
    link, gpu = link_of(settings.host.interconnect), gpu_figures(settings.host.gpu_model)
    points = seed_measurements()
    cands = {p.layout: judge(settings, p.layout) for p in points}
    best: Optional[Tuning] = None
    best_err: Optional[float] = None
    # Efficiency at most 0.9: no decode kernel reads at the data sheet's bandwidth.
    for eff in (0.6, 0.7, 0.8, 0.9):
        for layer in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):
            for overlap in (0.0, 0.02, 0.04, 0.06, 0.08, 0.1):
                for comm in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2):
                    for bandwidth in (1.0, 1.5, 2.0):
                        t = Tuning(eff, layer, overlap, 0.4, comm, bandwidth)
                        err = _error(cands, points, Context(link, gpu, t, workload))
                        if best_err is None or err < best_err - 1e-12:
                            best, best_err = t, err
    assert best is not None and best_err is not None  # the grid is not empty
    return best, math.exp(best_err) - 1


# ---------------------------------------------------------------------------- facts and results


def host_from_facts(settings: StackSettings, facts: dict[str, Any]) -> tuple[StackSettings, list[str]]:
    """The stack with its host block replaced by what the host said at deploy time (the stack
    output `host`: HostFacts.as_dict); notes say what changed."""
    h = settings.host
    notes = []
    update: dict[str, Any] = {}
    count = facts.get("gpu_count") or len(facts.get("gpus") or [])
    if count and count != h.gpu_count:
        update["gpu_count"] = int(count)
    mib = facts.get("gpu_memory_mib") or 0
    if mib:
        gb = round(mib / 1024, 1)
        if abs(gb - h.gpu_memory_gb) > 0.05 * h.gpu_memory_gb:
            update["gpu_memory_gb"] = gb
    kind = facts.get("interconnect")
    if kind in ("pcie", "nvlink") and kind != h.interconnect:
        update["interconnect"] = kind
    elif kind == "mixed" and h.interconnect != "pcie":
        update["interconnect"] = "pcie"
    models = facts.get("gpu_models") or sorted({g.get("name", "") for g in facts.get("gpus") or []} - {""})
    if models and models[0] != h.gpu_model:
        update["gpu_model"] = models[0]
    for key, value in update.items():
        notes.append(f"host facts: {key} {getattr(h, key)} -> {value}")
    if not update:
        notes.append("host facts agree with the host block")
    return settings.model_copy(update={"host": h.model_copy(update=update)}), notes
