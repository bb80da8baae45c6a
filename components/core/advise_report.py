"""The advice as text and as JSON (`python -m components advise`, docs/advise.md).

Every figure is labelled an estimate; a measured figure is shown only beside the estimate of the
same workload; layouts the model cannot tell apart (within its error, `Advice.tie_band`) are a
tie, never a "best"; the project's own stacks are always named, refused ones with their rule.
"""
from __future__ import annotations

from typing import Any

from .advise import Advice
from .advise_model import ESTIMATE, Candidate, Estimate


def render(a: Advice, top: int = 8) -> str:
    s, h, ctx = a.settings, a.settings.host, a.ctx
    w = ctx.workload
    lines = [f"advise (ESTIMATES from a cost model, not measurements): stack {s.stack}, {s.model.name} on "
             f"{h.gpu_count} x {h.gpu_model} ({h.gpu_memory_gb:g} GB), interconnect {h.interconnect} (from the {a.source})",
             f"workload: {w.input_len} input + {w.output_len} output tokens a request ({a.workload_from}); concurrency "
             f"{', '.join(map(str, w.concurrency))}",
             f"model: {ctx.gpu.name} {ctx.gpu.bandwidth_gbps:g} GB/s x {ctx.tuning.efficiency:g}; {ctx.link.kind} "
             f"all-reduce {ctx.link.latency_us:.0f} us + bytes / {ctx.link.busbw_gbps:g} GB/s between 2 GPUs "
             f"({ctx.link.growth}; {ctx.link.source}), host link x{ctx.tuning.comm_scale:g} latency x{ctx.tuning.link_bandwidth_scale:g} "
             "bandwidth; constants fitted to the seed's TP8/PP8 measurements"]
    cal = a.calibration
    if cal and cal.points:
        pts = ", ".join(f"{p.stack} C={p.concurrency}" for p in cal.points)
        lines.append(f"calibrated on {len(cal.points)} benchmark result(s) of this workload ({pts})"
                     f"{' -- REHEARSAL figures, not GPU measurements' if cal.rehearsal else ''}: mean error "
                     f"{cal.error_before:.0%} -> {cal.error_after:.0%}; scales communication x{cal.tuning.comm_scale:.2f}, "
                     f"GPU x{cal.tuning.gpu_scale:.2f}, pipeline overlap x{cal.tuning.overlap_scale:.2f}")
        lines.append(f"model error {a.model_error:.0%} (after calibration): estimates within {a.tie_band:.0%} of each "
                     "other are a tie")
    else:
        lines.append("not calibrated: no benchmark results (python -m components bench) of this workload for these layouts")
        lines.append(f"model error {a.model_error:.0%} on the seed's measurements it was fitted to (other layouts and "
                     f"hosts are predictions): estimates within {a.tie_band:.0%} of each other are a tie")
    lines += [f"note: {n}" for n in a.notes]
    if a.stack_refused:
        lines.append("")
        lines.append(f"STACK {s.stack} IS REFUSED by plan, preview and up ({len(a.stack_refused)} problem(s)); "
                     "the layouts below are for its host:")
        lines += [f"  {e}" for e in a.stack_refused]
    lines.append("")
    lines.append(f"valid layouts ({len(a.valid)}): weights and KV room per GPU from the memory plan")
    for c in sorted(a.valid, key=lambda c: c.name):
        m = c.memory_plan
        lines.append(f"  {c.name:<22} {c.layout.describe():<40} weights {m.weights_gb:6.1f} GB, KV {m.kv_pool_gb:5.1f} GB "
                     f"= {m.max_total_tokens * c.layout.dp_size:>9,} tokens{_stacks(c)}")
    lines.append(f"refused layouts ({len(a.refused)}): the rule each breaks")
    for c in sorted(a.refused, key=lambda c: c.name):
        err = c.refused[0]
        lines.append(f"  {c.name:<22} {c.layout.describe():<40} {err.setting}: {err.rule}" + (f" ({err.fix})" if err.fix else "")
                     + _stacks(c))
    lines += _own_stacks(a)
    for conc, ests in a.ranking.items():
        lines.append("")
        lines.append(f"concurrency {conc}: estimated output tok/s (all requests), ranked")
        for i, e in enumerate(ests[:top], 1):
            measured = f"  measured {e.measured:.0f}" if e.measured is not None else ""
            lines.append(f"  {i:>2}. {e.name:<22} {e.tok_s:8.1f} tok/s  {e.per_request_tok_s:6.1f}/request"
                         f"{measured}  {'; '.join(e.reasons)}{_stacks(_candidate(a, e))}")
        if len(ests) > top:
            lines.append(f"      ... {len(ests) - top} more (--top {len(ests)})")
        mine = [e for e in ests if _candidate(a, e).stacks]
        if mine:
            lines.append("  the project's stacks: " + ", ".join(
                f"{'/'.join(_candidate(a, e).stacks)} {e.tok_s:.1f}" for e in mine))
            # The choice the operator is making today is between the stacks they have written;
            # the overall best below may be a layout nobody deployed yet (a prediction to check).
            lines.append("  " + _verdict(a, mine, conc, "the project's stacks", stacks=True))
        if len(ests) > 1:
            lines.append("  " + _verdict(a, ests, conc, "", stacks=False))
    return "\n".join(lines) + "\n"


def _verdict(a: Advice, ests: list[Estimate], conc: int, among: str, *, stacks: bool) -> str:
    """"best ..." when one estimate leads beyond the model's error, else "tie ..."."""
    def name(e: Estimate) -> str:
        return "/".join(_candidate(a, e).stacks) if stacks else e.name
    leaders = a.leaders(ests)
    if len(leaders) > 1:
        shown = ", ".join(f"{name(e)} {e.tok_s:.0f}" for e in leaders[:6]) + (", ..." if len(leaders) > 6 else "")
        return (f"tie{' among ' + among if among else ''} at C={conc}: {shown} tok/s ({ESTIMATE}s within the model's "
                f"error, {a.tie_band:.0%}): the model cannot tell them apart; measure them (python -m components bench)")
    first, where = ests[0], f" of {among}" if among else ""
    if len(ests) == 1:
        return f"best{where} at C={conc}: {name(first)} ({ESTIMATE} {first.tok_s:.0f} tok/s)"
    second = ests[1]
    return (f"best{where} at C={conc}: {name(first)} ({ESTIMATE} {first.tok_s:.0f} tok/s, {first.tok_s / second.tok_s:.2f}x "
            f"{name(second)}, beyond the model's error of {a.tie_band:.0%})")


def _own_stacks(a: Advice) -> list[str]:
    """Every stack of the project, valid here or not."""
    if not a.own:
        return []
    lines = ["the project's stacks on this host:"]
    for o in a.own:
        mark = " (the stack advised for)" if o.name == a.settings.stack else ""
        layout = o.layout.describe() if o.layout is not None else ""  # every verdict but "unreadable" has one
        if o.verdict == "valid":
            text = f"valid: {layout}"
        elif o.verdict == "refused":
            text = f"REFUSED: {layout}: {o.detail}"
        elif o.verdict == "not considered":
            text = f"not ranked: {layout}: {o.detail}"
        else:
            text = f"cannot be read: {o.detail}"
        lines.append(f"  {o.name:<12}{mark} {text}")
        lines += [f"    warning: {w}" for w in a.ledger.get(o.name, [])]
    return lines


def _candidate(a: Advice, e: Estimate) -> Candidate:
    return next(c for c in a.valid if c.name == e.name)


def _stacks(c: Candidate) -> str:
    return f"  (stack {', '.join(c.stacks)})" if c.stacks else ""


def as_dict(a: Advice) -> dict[str, Any]:
    w = a.ctx.workload
    return {
        "label": ESTIMATE,
        "stack": a.settings.stack,
        "stack_refused": [{"setting": e.setting, "rule": e.rule, "fix": e.fix} for e in a.stack_refused],
        "host": {"gpu_count": a.settings.host.gpu_count, "gpu_memory_gb": a.settings.host.gpu_memory_gb,
                 "gpu_model": a.settings.host.gpu_model, "interconnect": a.settings.host.interconnect, "source": a.source},
        "workload": {"input_len": w.input_len, "output_len": w.output_len, "concurrency": list(w.concurrency),
                     "from": a.workload_from},
        "model_error": round(a.model_error, 4),
        "tie_band": round(a.tie_band, 4),
        "calibrated_on": [{"stack": p.stack, "concurrency": p.concurrency, "output_throughput": p.output_throughput,
                           "rehearsal": p.rehearsal} for p in (a.calibration.points if a.calibration else [])],
        "own_stacks": [{"name": o.name, "verdict": o.verdict, "layout": o.layout.describe() if o.layout else None,
                        "detail": o.detail, **({"ledger": a.ledger[o.name]} if a.ledger.get(o.name) else {})}
                       for o in a.own],
        "valid": [{"name": c.name, "layout": c.layout.describe(), "stacks": c.stacks,
                   "weights_gb": c.memory_plan.weights_gb, "kv_pool_gb": c.memory_plan.kv_pool_gb,
                   "kv_tokens": c.memory_plan.max_total_tokens * c.layout.dp_size} for c in a.valid],
        "refused": [{"name": c.name, "layout": c.layout.describe(), "stacks": c.stacks,
                     "rules": [{"setting": e.setting, "rule": e.rule, "fix": e.fix} for e in c.refused]} for c in a.refused],
        "ranking": {str(conc): [{"name": e.name, "tok_s": round(e.tok_s, 1), "per_request_tok_s": round(e.per_request_tok_s, 2),
                                 "held": e.held, "step_ms": round(e.step_ms, 2), "bubble": round(e.bubble, 3),
                                 "prefill_ms": round(e.prefill_ms, 1), "reasons": e.reasons, "measured": e.measured}
                                for e in ests] for conc, ests in a.ranking.items()},
        # Per concurrency: the layouts the model cannot tell from the best (one name: a clear best).
        "leaders": {str(conc): [e.name for e in a.leaders(ests)] for conc, ests in a.ranking.items()},
        "notes": a.notes,
    }
