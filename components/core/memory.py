"""Per-GPU memory plan, computed the way SGLang sizes its KV pool.

SGLang's ``mem_fraction_static`` is the share of a GPU's memory for model weights plus the KV
cache pool (not "the KV share"): the pool is what is left of ``total x mem_fraction_static``
after the weights. A pool <= 0 makes SGLang fail at start with "Not enough memory. Please try to
increase --mem-fraction-static." Sizes are GB as SGLang logs them (2**30 bytes).

Approximations, stated so nobody over-trusts the figures: weights are spread evenly over
layers (embeddings and dense layers ignored), activations and CUDA graphs live in the
``1 - mem_fraction_static`` remainder, as in SGLang.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .config import NAMESPACE, StackSettings
from .errors import SettingError
from .strategy import layout_of

GB = 1 << 30


def pp_layer_split(num_layers: int, pp_size: int) -> list[int]:
    """Layers per pipeline stage as SGLang splits them: the remainder goes to the LAST stages
    (61 layers over PP8 = 7,7,7,8,8,8,8,8)."""
    base, rem = divmod(num_layers, pp_size)
    return [base + (1 if stage >= pp_size - rem else 0) for stage in range(pp_size)]


@dataclass(frozen=True)
class StagePlan:
    stage: int
    layers: int
    weights_gb: float
    kv_pool_gb: float
    kv_bytes_per_token: int
    max_total_tokens: int


@dataclass(frozen=True)
class MemoryPlan:
    gpu_memory_gb: float
    mem_fraction_static: float
    static_budget_gb: float  # weights + KV pool per GPU
    stages: list[StagePlan]
    weights_gb: float  # on the fullest GPU
    kv_pool_gb: float  # on the tightest GPU
    kv_bytes_per_token: int  # on the tightest GPU
    max_total_tokens: int  # per server replica (SGLang takes the minimum over ranks)
    max_running_requests: int
    context_length: int
    token_demand: int  # max_running_requests x context_length
    warnings: list[str] = field(default_factory=list)
    # A multi-node layout: per node (rank order) its host, the stages and TP ranks it runs and
    # the per-GPU figures there (every GPU of a node holds the same share). Empty for one node.
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_memory(settings: StackSettings) -> tuple[MemoryPlan, list[SettingError]]:
    """The memory plan of one strategy, and the errors that would stop SGLang at start."""
    L = layout_of(settings)
    model, serving = settings.model, settings.serving
    gpu_gb = settings.host.gpu_memory_gb
    budget = gpu_gb * serving.mem_fraction_static

    attention = min(model.attention_weights_gb, model.weights_gb)
    rest = model.weights_gb - attention
    stages = []
    for stage, layers in enumerate(pp_layer_split(model.num_layers, L.pp_size)):
        share = layers / model.num_layers
        # Attention is split over the attention-TP group (smaller under DP attention, where
        # each rank keeps a full copy of its attention); experts and the rest over all of TP.
        weights = share * (attention / L.attn_tp_size + rest / L.tp_size)
        if model.is_mla:
            # MLA keeps one latent vector per token and layer, replicated on every attention
            # rank: not divided by TP.
            per_token = (model.kv_lora_rank + model.qk_rope_head_dim) * layers * model.kv_dtype_bytes
        else:
            per_layer = model.kv_bytes_per_token_per_layer or 0
            per_token = per_layer * layers / max(L.attn_tp_size, 1)
        per_token = int(round(per_token))
        pool = budget - weights
        tokens = int(pool * GB // per_token) if pool > 0 and per_token > 0 else 0
        stages.append(StagePlan(stage, layers, round(weights, 2), round(pool, 2), per_token, tokens))

    tight = min(stages, key=lambda s: s.max_total_tokens)
    full = max(stages, key=lambda s: s.weights_gb)
    tokens = tight.max_total_tokens
    # Each DP-attention rank (or plain DP replica) owns a pool of its own.
    replicas = L.dp_size
    if serving.max_running_requests is not None:
        running = serving.max_running_requests
    else:
        # SGLang's default when unset.
        running = min(max(int(tokens / max(serving.context_length, 1) * 512), 2048), 4096)
    demand = running * serving.context_length

    errors: list[SettingError] = []
    warnings: list[str] = []
    # Numbers that would make the plan say nothing true (issue 13.7): refused, saying what to set.
    if model.attention_weights_gb > model.weights_gb:
        errors.append(SettingError(
            f"{NAMESPACE}:model.attentionWeightsGb",
            f"attentionWeightsGb {model.attention_weights_gb:g} exceeds weightsGb {model.weights_gb:g}: the attention "
            "weights are part of the model's weights",
            "set attentionWeightsGb to the attention projections' share of weightsGb (0 if unknown)"))
    if not model.is_mla and not model.kv_bytes_per_token_per_layer:
        errors.append(SettingError(
            f"{NAMESPACE}:model.kvBytesPerTokenPerLayer",
            f"{model.name} has no MLA (kvLoraRank 0) and no KV size: its KV cache per token cannot be planned "
            "(the plan would show a pool of 0 tokens)",
            "set kvBytesPerTokenPerLayer = 2 x num_key_value_heads x head_dim x kvDtypeBytes from the model's "
            "config.json (e.g. 2 x 8 x 128 x 2 = 4096), or kvLoraRank and qkRopeHeadDim for an MLA model"))
    elif tight.kv_pool_gb <= 0:
        needed = (full.weights_gb + 1) / gpu_gb
        fix = (f"raise memFractionStatic to at least {needed:.2f}" if needed < 0.95 else
               f"the weights alone ({full.weights_gb:.1f} GB a GPU) need more GPUs or a larger ppSize/tpSize")
        errors.append(SettingError(
            f"{NAMESPACE}:serving.memFractionStatic",
            f"no room for the KV cache: {full.weights_gb:.1f} GB of weights per GPU exceed {gpu_gb:g} GB x "
            f"{serving.mem_fraction_static} = {budget:.1f} GB (SGLang would fail at start: Not enough memory)",
            fix))
    elif demand > tokens * replicas:
        warnings.append(
            f"maxRunningRequests {running} x contextLength {serving.context_length} = {demand:,} tokens exceeds the KV pool "
            f"({tokens * replicas:,} tokens); SGLang will queue requests rather than run them all at full context")
    if serving.context_length > tokens > 0:
        errors.append(SettingError(
            f"{NAMESPACE}:serving.contextLength",
            f"contextLength {serving.context_length} exceeds the KV pool of {tokens:,} tokens: not even one request fits",
            f"use contextLength <= {tokens} or raise memFractionStatic"))

    plan = MemoryPlan(
        gpu_memory_gb=gpu_gb,
        mem_fraction_static=serving.mem_fraction_static,
        static_budget_gb=round(budget, 2),
        stages=stages,
        weights_gb=full.weights_gb,
        kv_pool_gb=tight.kv_pool_gb,
        kv_bytes_per_token=tight.kv_bytes_per_token,
        max_total_tokens=tokens,
        max_running_requests=running,
        context_length=serving.context_length,
        token_demand=demand,
        warnings=warnings,
        nodes=node_figures(settings, stages),
    )
    return plan, errors


def node_figures(settings: StackSettings, stages: list[StagePlan]) -> list[dict[str, Any]]:
    """Per node of a multi-node layout: which stages and TP ranks it runs (SGLang's split,
    `Layout.node_share`) and the per-GPU weights and KV pool on it."""
    place = settings.node
    L = layout_of(settings)
    if place is None or L.nnodes <= 1:
        return []
    out = []
    for rank, name in enumerate(place.names):
        tp, pp = L.node_share(rank)
        mine = [stages[p] for p in pp if p < len(stages)]
        if not mine:
            continue
        out.append({"rank": rank, "host": name, "stages": list(pp), "tp_ranks": [tp.start, tp.stop - 1],
                    "gpus": len(tp) * len(pp), "weights_gb": max(st.weights_gb for st in mine),
                    "kv_pool_gb": min(st.kv_pool_gb for st in mine),
                    "max_total_tokens": min(st.max_total_tokens for st in mine)})
    return out
