"""Built-in model profiles: the architecture numbers the memory plan and the strategy rules need.

A user writes ``profile: kimi-k2.6`` under ``gpu-serving:model`` and may still override any
single number. Sources of each number are given beside it; sizes are in GB as SGLang reports
them (2**30 bytes).
"""
from __future__ import annotations

from typing import Any

PROFILES: dict[str, dict[str, Any]] = {
    # Kimi K2.x (K2, K2.5, K2.6 share the DeepSeek-V3 architecture at a larger expert count).
    # Layers, experts, MoE width and MLA ranks: the model's config.json (num_hidden_layers 61,
    # n_routed_experts 384, moe_intermediate_size 2048, kv_lora_rank 512, qk_rope_head_dim 64,
    # num_attention_heads 64).
    # weightsGb: the INT4 checkpoint of the founding scenario, about 590 GB (notes/sglang.md).
    # attentionWeightsGb: the bf16 MLA projections (about 101 M parameters a layer with 64
    # heads, times 61 layers, 2 bytes) -- replicated on every rank under DP attention.
    "kimi-k2.6": {
        "name": "kimi-k2.6",
        "servedName": "kimi-k2.6",
        "numLayers": 61,
        "numExperts": 384,
        "moeIntermediateSize": 2048,
        "numAttentionHeads": 64,
        "kvLoraRank": 512,
        "qkRopeHeadDim": 64,
        "kvDtypeBytes": 2,  # bf16 KV cache, SGLang's default for this model
        "weightsGb": 590,
        "attentionWeightsGb": 12.3,
    },
    # DeepSeek-V3 / V3.1 / R1: config.json (61 layers, 256 routed experts, moe_intermediate_size
    # 2048, kv_lora_rank 512, qk_rope_head_dim 64, 128 heads); FP8 checkpoint of about
    # 642 GB; attention about 187 M parameters a layer in FP8.
    "deepseek-v3": {
        "name": "deepseek-v3",
        "servedName": "deepseek-v3",
        "numLayers": 61,
        "numExperts": 256,
        "moeIntermediateSize": 2048,
        "numAttentionHeads": 128,
        "kvLoraRank": 512,
        "qkRopeHeadDim": 64,
        "kvDtypeBytes": 2,
        "weightsGb": 642,
        "attentionWeightsGb": 11.4,
    },
}
# Kimi K2 and K2.5 have the K2.6 architecture; only the checkpoint name differs.
PROFILES["kimi-k2"] = {**PROFILES["kimi-k2.6"], "name": "kimi-k2", "servedName": "kimi-k2"}
PROFILES["kimi-k2.5"] = {**PROFILES["kimi-k2.6"], "name": "kimi-k2.5", "servedName": "kimi-k2.5"}
