"""What the engine reports about itself: /server_info (and /get_server_info), /model_info.

SGLang's shape: {**server_args (resolved), **scheduler_info, internal_states (one per DP rank),
version}; the rehearsal's own facts under "rehearsal".
"""
from __future__ import annotations

from sglang.version import __version__
from sglang._rehearsal import rules
from sglang._rehearsal.rules import GiB


def server_info(engine) -> dict:
    info = {k: v for k, v in vars(engine.args).items()}
    info["ep_size"] = engine.reported_ep_size()
    plan = engine.plan
    info.update({
        "status": "ready",
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_req_input_len": plan.max_req_input_len,
        "max_running_requests": plan.max_running_requests,
        "internal_states": [{
            "dp_rank": rank,
            "last_gen_throughput": engine.ranks.throughput(rank),
            "#running-req": engine.ranks.load(rank),
            "#queue-req": 0,
            "max_total_num_tokens": plan.max_total_num_tokens,
            "memory_usage": {
                "weight": round(max(plan.weights_per_gpu) / GiB, 2),
                "kvcache": round(plan.max_total_num_tokens * max(plan.kv_bytes_per_token) / GiB, 2),
                "token_capacity": plan.max_total_num_tokens,
            },
        } for rank in range(engine.dp_ranks)],
        "version": __version__,
        "rehearsal": {
            "engine": "sglang-rehearsal " + __version__,
            "phase": engine.state,
            "fault": engine.fault.shown() if engine.fault else None,
            "dead_dp_rank": engine.ranks.dead,
            "checkpoint_identity": engine.answers.identity if engine.answers else None,
            "garbage": engine.answers is not None and engine.answers.identity.startswith("garbage:"),
            "start_seconds": engine.start_phases,
            "world_size": rules.compute_world_size(engine.args),
            "nnodes": engine.args.nnodes,
            "gpus_per_node": len(engine.used_gpus),
            "nodes": engine.nodes,
            "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in engine.used_gpus],
            "pp_layer_partition": plan.layers_per_stage,
            "weights_per_gpu_gib": [round(w / GiB, 2) for w in plan.weights_per_gpu],
            "kv_bytes_per_token": plan.kv_bytes_per_token,
            "layout": engine.layout,
            "requests_served": engine.requests_served,
            "performance": engine.performance_info(),
            "disaggregation": engine.pd.info() if engine.pd is not None else None,
        },
    })
    return info


def performance_info(engine) -> dict:
    # seconds_per_token: what a token takes now, the speed faults included (engine.token_step,
    # the figure the pace waits).
    if engine.seconds_per_token:
        return {"pacing": f"fixed {engine.seconds_per_token} s per token (REHEARSAL_SECONDS_PER_TOKEN)",
                "seconds_per_token": engine.token_step()}
    if not (engine.perf and engine.perf_layout):
        return {"pacing": "none", "seconds_per_token": engine.token_step()}
    layers = engine.model.num_layers
    return {"pacing": "model", "seconds_per_token": engine.token_step(), "parameters": "sglang/_rehearsal/performance.json",
            "interconnect": engine.perf_layout.interconnect,
            "cross_node": engine.perf_layout.cross_node if engine.perf_layout.nnodes > 1 else None,
            "running": engine.running,
            "output_tok_s": {str(c): round(engine.perf.output_tok_s(engine.perf_layout, layers, c), 1)
                             for c in (1, 32, 64)}}


def model_info(engine) -> dict:
    return {"model_path": engine.args.model_path, "tokenizer_path": engine.args.tokenizer_path,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": engine.args.weight_version, "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": engine.model.get("model_type"),
            "architectures": engine.model.get("architectures")}
