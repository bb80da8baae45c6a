"""The cost model of `advise` (advise.py): the layouts of a host's GPUs, each judged by the
program's own check, and the estimate of each valid one at a concurrency. Every figure is an
estimate.

The cost model (docs/advise.md) prices one decode step of a server replica, per GPU:

- weights read: the attention weights over the attention-TP group plus the active experts' share
  of the rest over TP (expert parallelism reads whole experts: the busiest GPU of the EP group
  sets the pace), at the GPU's memory bandwidth (data/gpus.json) x a fitted efficiency;
- the KV cache of the batch's requests (MLA's latent KV is read on every attention rank);
- a fixed cost per layer (kernel launches), fitted;
- communication: TP's two all-reduces a layer of batch x hidden x 2 bytes, DP attention's
  gather/scatter, EP's all-to-all (dispatch + combine) when an all-to-all backend is set, each
  priced by latency + bytes / bus bandwidth of the interconnect measured with NCCL
  (data/interconnects.json, data/nccl/);
- pipeline parallelism: a request passes the stages one after the other (the bubble: with fewer
  micro-batches in flight than stages, stages wait), and each stage hand-off costs a fitted time
  per request (SGLang turns the overlap schedule off under PP);
- prefill: 2 x active parameters x input tokens of compute, plus TP's all-reduces of the whole
  prompt, blocking decode while it runs.

The KV room from the memory plan bounds how many requests a layout holds at once: beyond it
requests queue. Constants no data sheet gives are fitted to the seed's measurements
(data/advise-model.json, `advise_calibration.fit_seed`); with benchmark results of some layouts
the model is calibrated on the results measured at the same workload (`advise_calibration.calibrate`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from .config import A2A_BACKENDS, StackSettings, StrategySettings
from .errors import SettingError
from .layout_check import check_layout
from .memory import GB, MemoryPlan, pp_layer_split
from .strategy import Layout, check_extra_args, check_unit_name

DATA = Path(__file__).parent / "data"
# The all-to-all backend the advisor tries for expert parallelism (SGLang lists several; they
# differ in kernels, not in the volume the model prices).
A2A_TRIED = "deepep"
assert A2A_TRIED in A2A_BACKENDS
DEFAULT_CONCURRENCY = (1, 32, 64)
ESTIMATE = "estimate"


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Link:
    """An interconnect, priced from a measured 2-GPU all-reduce: latency + bytes / bus bandwidth."""

    kind: str
    latency_us: float  # one small all-reduce between 2 GPUs
    busbw_gbps: float
    growth: str  # "ring" or "switch"
    source: str

    def _latency(self, n: int) -> float:
        return self.latency_us * (n - 1) if self.growth == "ring" else self.latency_us

    def allreduce_us(self, n: int, nbytes: float) -> float:
        if n <= 1:
            return 0.0
        # NCCL's bus bandwidth is defined so that time = size x 2(n-1)/n / busbw.
        return self._latency(n) + nbytes * 2 * (n - 1) / n / (self.busbw_gbps * 1e9) * 1e6

    def alltoall_us(self, n: int, nbytes_per_rank: float) -> float:
        if n <= 1:
            return 0.0
        # Pairwise exchange: each rank sends (n-1)/n of its tokens away; half the all-reduce's
        # steps on a ring.
        lat = self.latency_us * (n - 1) / 2 if self.growth == "ring" else self.latency_us
        return lat + nbytes_per_rank * (n - 1) / n / (self.busbw_gbps * 1e9) * 1e6

    def send_us(self, nbytes: float) -> float:
        return self.latency_us / 2 + nbytes / (self.busbw_gbps * 1e9) * 1e6


@lru_cache(maxsize=None)
def json_data(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def link_of(interconnect: str) -> Link:
    """The measured figures of `interconnect` (pcie, nvlink, mixed); a single GPU needs none."""
    table = json_data("interconnects.json")
    entry = table.get(interconnect) or table["pcie"]
    if "sameAs" in entry:
        entry = table[entry["sameAs"]]
    rows = json_data(entry["fixture"])["rows"]
    # The fastest row is the latency floor; the largest message shows the bandwidth.
    latency = min(r["us"] for r in rows)
    busbw = max(rows, key=lambda r: r["bytes"])["busbw_GBps"]
    return Link(interconnect, latency, busbw, entry["latencyGrowth"], entry["fixture"])


@dataclass(frozen=True)
class GpuFigures:
    name: str
    bandwidth_gbps: float
    bf16_tflops: float
    known: bool


def gpu_figures(gpu_model: str) -> GpuFigures:
    table = {k: v for k, v in json_data("gpus.json").items() if not k.startswith("_")}
    hits = [k for k in table if k.lower() in gpu_model.lower()]
    if hits:
        k = max(hits, key=len)
        return GpuFigures(k, table[k]["memoryBandwidthGBps"], table[k]["bf16Tflops"], True)
    # Unknown card: the seed host's figures, said in the output.
    k = "RTX PRO 6000 Blackwell"
    return GpuFigures(k, table[k]["memoryBandwidthGBps"], table[k]["bf16Tflops"], False)


@dataclass(frozen=True)
class Tuning:
    """The model's fitted constants, and the calibration scales (1 = as fitted on the seed)."""

    efficiency: float  # share of the memory bandwidth decode reaches
    layer_ms: float  # fixed cost of one layer's kernels
    pipeline_overlap: float  # share of a PP micro-batch's time that overlaps the others' (1 = ideal)
    prefill_efficiency: float  # share of the BF16 tensor throughput prefill reaches
    comm_scale: float = 1.0  # the host's link latency against the measured stand-in
    link_bandwidth_scale: float = 1.0  # its bandwidth against the stand-in
    gpu_scale: float = 1.0
    overlap_scale: float = 1.0

    @classmethod
    def shipped(cls) -> "Tuning":
        h = json_data("advise-model.json")["host"]
        return cls(h["bandwidthEfficiency"], h["layerOverheadMs"], h["pipelineOverlap"], h["prefillEfficiency"],
                   h["linkLatencyScale"], h["linkBandwidthScale"])


def arch_of(settings: StackSettings) -> dict[str, Any]:
    models = json_data("advise-model.json")["models"]
    arch: dict[str, Any] = models.get(settings.model.profile or settings.model.name) or models["default"]
    return arch


@dataclass(frozen=True)
class Workload:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    input_len: int = 1024
    output_len: int = 1024


# ---------------------------------------------------------------------------- layouts


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_name(L: Layout) -> str:
    """tp8, pp8, tp8-ep8, tp4-pp2, dp2-tp4, tp8-dpa8-ep8-deepep: the sizes that are not 1."""
    parts = []
    if L.dp_size > 1 and not L.enable_dp_attention:
        parts.append(f"dp{L.dp_size}")
    if L.tp_size > 1 or L.pp_size == 1:
        parts.append(f"tp{L.tp_size}")
    if L.pp_size > 1:
        parts.append(f"pp{L.pp_size}")
    if L.enable_dp_attention:
        parts.append(f"dpa{L.dp_size}")
    if L.ep_size > 1:
        parts.append(f"ep{L.ep_size}")
    if L.moe_a2a_backend != "none":
        parts.append(L.moe_a2a_backend)
    return "-".join(parts)


def candidate_layouts(gpus: int, moe: bool) -> list[Layout]:
    """Every combination of sizes that reads as `gpus` GPUs: the layouts SGLang allows, and the
    usual misreadings (EP or DP attention counted as GPUs) so their refusal is shown."""
    out: list[Layout] = []
    divs = _divisors(gpus)

    def eps(tp: int) -> list[int]:
        return _divisors(tp) if moe else [1]

    for dp in divs:
        for tp in divs:
            for pp in divs:
                if dp * tp * pp != gpus:
                    continue
                for ep in eps(tp):
                    out.append(Layout(tp, pp, ep, dp, False, "none"))
                    if ep == tp and ep > 1:
                        out.append(Layout(tp, pp, ep, dp, False, A2A_TRIED))
                if dp == 1 and tp > 1:
                    for d in _divisors(tp)[1:]:
                        for ep in eps(tp):
                            out.append(Layout(tp, pp, ep, d, True, "none"))
                            if ep == tp and ep > 1:
                                out.append(Layout(tp, pp, ep, d, True, A2A_TRIED))
    if gpus > 1:
        if moe:
            out.append(Layout(1, 1, gpus, 1, False, "none"))  # "EP8" as --ep-size 8 alone
            out.append(Layout(gpus, 1, gpus // 2, 1, False, A2A_TRIED))  # a2a with ep != tp
        out.append(Layout(1, 1, 1, gpus, True, "none"))  # DP attention counted as GPUs
    seen, unique = set(), []
    for L in out:
        if L not in seen:
            seen.add(L)
            unique.append(L)
    return unique


def with_layout(settings: StackSettings, L: Layout) -> StackSettings:
    strategy = StrategySettings(name=settings.strategy.name, tp_size=L.tp_size, pp_size=L.pp_size, ep_size=L.ep_size,
                                dp_size=L.dp_size, enable_dp_attention=L.enable_dp_attention,
                                moe_a2a_backend=L.moe_a2a_backend)
    return settings.model_copy(update={"strategy": strategy})


@dataclass
class Candidate:
    layout: Layout
    name: str
    settings: StackSettings
    memory: Optional[MemoryPlan]
    refused: list[SettingError]
    stacks: list[str] = field(default_factory=list)  # project stacks declaring this layout

    @property
    def valid(self) -> bool:
        return not self.refused

    @property
    def memory_plan(self) -> MemoryPlan:
        """The memory plan of a valid layout (a refused one has none)."""
        if self.memory is None:
            raise ValueError(f"{self.name} is refused: it has no memory plan")
        return self.memory


def judge(settings: StackSettings, L: Layout) -> Candidate:
    """The layout through the program's own check (`layout_check.check_layout`, what `plan`,
    `preview` and `up` run): SGLang's rules and the memory plan."""
    s = with_layout(settings, L)
    # Problems of the stack that no layout changes (extraArgs, the unit name) are not the layout's.
    unrelated = {(e.setting, e.rule) for e in check_extra_args(s.serving.extra_args) + check_unit_name(s)}
    errors, memory = check_layout(s)
    errors = [e for e in errors if (e.setting, e.rule) not in unrelated]
    return Candidate(L, layout_name(L), s, memory if not errors else None, errors)


# ---------------------------------------------------------------------------- the cost model


@dataclass
class Estimate:
    name: str
    concurrency: int
    held: int  # requests the layout runs at once (KV room, maxRunningRequests)
    tok_s: float  # output tokens per second, all requests
    per_request_tok_s: float
    step_ms: float  # time for every running request to get one more token
    parts_ms: dict[str, float]  # where a step's time goes
    bubble: float  # share of pipeline stages idle
    prefill_ms: float  # one request's prefill
    reasons: list[str] = field(default_factory=list)
    measured: Optional[float] = None


@dataclass(frozen=True)
class Context:
    """What the model needs besides the layout."""

    link: Link
    gpu: GpuFigures
    tuning: Tuning
    workload: Workload


def host_link(ctx: Context) -> Link:
    """The host's link: the measured stand-in scaled by the fitted (or calibrated) factors."""
    t = ctx.tuning
    return replace(ctx.link, latency_us=ctx.link.latency_us * t.comm_scale,
                   busbw_gbps=ctx.link.busbw_gbps * t.link_bandwidth_scale)


def held_requests(c: Candidate, concurrency: int, w: Workload) -> tuple[int, str]:
    """How many of `concurrency` requests the layout runs at once, and what bounds it."""
    L, m = c.layout, c.memory_plan
    pools = L.dp_size  # each DP-attention rank, or plain DP replica, has a KV pool of its own
    fits = m.max_total_tokens * pools // (w.input_len + w.output_len)
    running = m.max_running_requests * (1 if L.enable_dp_attention else L.dp_size)
    held = max(1, min(concurrency, fits, running))
    if held >= concurrency:
        return held, ""
    if fits <= running:
        return held, (f"KV room {m.max_total_tokens * pools:,} tokens holds {fits} requests of "
                      f"{w.input_len + w.output_len} tokens: the other {concurrency - held} queue")
    return held, f"maxRunningRequests {m.max_running_requests} runs {held}: the other {concurrency - held} queue"


def estimate(c: Candidate, concurrency: int, ctx: Context) -> Estimate:
    L, s, t, w = c.layout, c.settings, ctx.tuning, ctx.workload
    model, arch = s.model, arch_of(s)
    link = host_link(ctx)
    hidden = arch["hiddenSize"]
    layers = model.num_layers
    held, bound = held_requests(c, concurrency, w)
    replicas = 1 if L.enable_dp_attention else L.dp_size
    groups = L.dp_size if L.enable_dp_attention else 1
    b = held / replicas  # requests per replica
    bw = ctx.gpu.bandwidth_gbps * 1e9 * t.efficiency / 1e3  # bytes per ms

    attention = min(model.attention_weights_gb, model.weights_gb) * GB / layers
    rest = (model.weights_gb * GB / layers) - attention
    E = model.num_experts
    k: float = arch["expertsPerToken"]
    shared: float = arch["sharedExperts"]
    active_rest = rest * (k + shared) / (E + shared) if E else rest
    kv_token_layer = c.memory_plan.stages[0].kv_bytes_per_token / c.memory_plan.stages[0].layers
    context = w.input_len + w.output_len / 2

    def imbalance(tokens: float) -> float:
        # Whole experts on ep GPUs: the busiest GPU reads more than the mean (max of a
        # balls-in-bins draw, Gaussian approximation), the pace of the step.
        if L.ep_size <= 1 or not E:
            return 1.0
        per_gpu = E / L.ep_size
        mean: float = per_gpu * (1 - (1 - k / E) ** max(tokens, 1))
        busiest = min(per_gpu, mean + math.sqrt(2 * mean * math.log(L.ep_size)))
        return busiest / mean

    def layer_parts(tokens: float) -> dict[str, float]:
        """One layer on the busiest GPU for a (micro-)batch of `tokens` requests, ms."""
        per_group = tokens / groups
        weights = (attention / L.attn_tp_size + active_rest * imbalance(tokens) / L.tp_size) / bw
        kv = per_group * context * kv_token_layer / bw
        msg = tokens * hidden * 2
        if L.tp_size == 1:
            comm = 0.0
        elif not L.enable_dp_attention:
            if L.moe_a2a_backend != "none":
                comm = (link.allreduce_us(L.tp_size, msg)
                        + 2 * link.alltoall_us(L.ep_size, tokens / L.tp_size * k * hidden * 2))
            else:
                comm = 2 * link.allreduce_us(L.tp_size, msg)
        else:
            comm = link.allreduce_us(L.attn_tp_size, per_group * hidden * 2)
            if L.moe_a2a_backend != "none":
                comm += 2 * link.alltoall_us(L.ep_size, tokens / L.tp_size * k * hidden * 2)
            else:
                # SGLang gathers every group's tokens for the MoE as an all-reduce of a padded
                # buffer, and reduces the MoE output over TP: two all-reduces of all tokens.
                comm += 2 * link.allreduce_us(L.tp_size, msg)
        return {"weights": weights * t.gpu_scale, "kv cache": kv * t.gpu_scale,
                "kernels": t.layer_ms * t.gpu_scale, "communication": comm / 1e3}

    stages = pp_layer_split(layers, L.pp_size)
    micro = min(b, L.pp_size) if L.pp_size > 1 else 1
    mb = b / micro
    per_layer = layer_parts(mb)
    parts = {name: v * layers for name, v in per_layer.items()}
    if L.pp_size > 1:
        handoff = link.send_us(mb * hidden * 2) / 1e3
        stage_ms = [n * sum(per_layer.values()) + handoff for n in stages]
        parts["stage hand-offs"] = handoff * L.pp_size
        # A request crosses every stage in turn (one micro-batch: the other stages idle, the
        # bubble). Micro-batches overlap by the fitted share; a full, ideal pipeline is paced by
        # its slowest stage.
        overlap = min(1.0, t.pipeline_overlap * t.overlap_scale)
        step = max(micro * max(stage_ms), sum(stage_ms) * micro / (1 + (micro - 1) * overlap))
        bubble = 1 - micro * sum(stage_ms) / (L.pp_size * step)
    else:
        step = sum(parts.values())
        bubble = 0.0

    # Prefill: compute over the GPUs that work at once, TP's all-reduces of the whole prompt.
    flops = 2 * (arch.get("activeParamsB") or model.weights_gb) * 1e9 * w.input_len
    tflops = ctx.gpu.bf16_tflops * 1e12 * t.prefill_efficiency / 1e3  # flop per ms
    overlap = min(b, L.pp_size)
    prefill_work = flops / (L.tp_size * tflops) / overlap * t.gpu_scale
    prefill_comm = 2 * layers * link.allreduce_us(L.attn_tp_size, w.input_len * hidden * 2) / 1e3
    if L.pp_size > 1:
        prefill_comm += (L.pp_size - 1) * link.send_us(w.input_len * hidden * 2) / 1e3 / overlap
    prefill = prefill_work + prefill_comm
    # Over one request's life the batch decodes output_len steps and admits b new prompts.
    life = w.output_len * step + b * prefill
    per_replica = b * w.output_len / life * 1e3
    tok_s = per_replica * replicas
    e = Estimate(c.name, concurrency, held, tok_s, tok_s / held, step, parts, bubble, prefill)
    e.reasons = _reasons(c, e, ctx, bound, b)
    return e


def _reasons(c: Candidate, e: Estimate, ctx: Context, bound: str, b: float) -> list[str]:
    L, link = c.layout, host_link(ctx)
    total = sum(e.parts_ms.values())
    top = sorted(e.parts_ms.items(), key=lambda kv: -kv[1])[:2]
    out = [", ".join(f"{name} {v / total:.0%}" for name, v in top) + f" of a {e.step_ms:.1f} ms step"]
    if L.tp_size > 1 and "communication" in dict(top):
        out.append(f"{'all-reduce' if L.moe_a2a_backend == 'none' else 'all-reduce + all-to-all'} "
                   f"over {ctx.link.kind} ({link.allreduce_us(L.tp_size, b * 7168 * 2):.0f} us each at tp{L.tp_size})")
    if L.pp_size > 1:
        out.append(f"pipeline stages idle {e.bubble:.0%} ({min(b, L.pp_size):g} micro-batch(es) for {L.pp_size} stages)")
    if L.ep_size > 1 and L.moe_a2a_backend == "none":
        out.append("EP without all-to-all: all-reduce as TP, busiest GPU reads more experts")
    if bound:
        out.append(bound)
    return out
