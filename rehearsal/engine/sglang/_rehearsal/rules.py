"""SGLang's layout and memory rules, as pure functions (no I/O, no clock).

Each rule cites where SGLang applies it (2026 sources, sgl-project/sglang):
  server_args.py / arg_groups/*_hook.py / overrides.py  argument resolution and checks
  distributed/utils.py get_pp_indices                    PP layer split
  distributed/parallel_state.py                          moe_tp = tp // ep // moe_dp
  model_executor memory pool (MemoryPoolConfig)          "Not enough memory" check
A broken rule raises :class:`Refusal` carrying the exception type SGLang raises, its message,
and where in startup it happens, so the engine can fail the way SGLang fails.

Why a second copy of rules gpu-serving checks in components/core/strategy.py: this one stands in
for SGLang on the host, written from SGLang's source on its own, so a rule gpu-serving misses or
gets wrong fails on the rehearsal host as it would on a GPU box instead of being agreed with.
"""
from __future__ import annotations

import dataclasses
import math

GiB = 1 << 30
MiB = 1 << 20

# A2A backends that force ep_size = tp_size (overrides.py _A2A_EP_SPANNING_BACKENDS).
A2A_EP_SPANNING = {"megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep",
                   "flashinfer", "mori", "pplx"}
KV_DTYPE_BYTES = {"fp8_e5m2": 1, "fp8_e4m3": 1, "mxfp8": 1, "bf16": 2, "bfloat16": 2,
                  "nvfp4": 0.5, "fp4_mx_block16": 0.5, "fp4_e2m1": 0.5}
CONTEXT_LENGTH_KEYS = ["max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings"]


class Refusal(Exception):
    """A startup failure as SGLang would produce it.

    stage: "args" (main process, before any scheduler starts), "launch" (a scheduler process
    fails to start on its GPU), "load" (during weight loading) or "memory" (memory pool init).
    exc_type: the Python exception SGLang raises there (ValueError, AssertionError, ...).
    note: one line from the rehearsal engine saying what rule this is, in the user's words.
    """

    def __init__(self, stage: str, exc_type: str, message: str, note: str = ""):
        super().__init__(message)
        self.stage, self.exc_type, self.message, self.note = stage, exc_type, message, note


@dataclasses.dataclass
class Model:
    path: str
    config: dict          # the text model's config.json (text_config unwrapped)
    checkpoint: dict      # rehearsal-checkpoint.json

    def get(self, key, default=None):
        return self.config.get(key, default)

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def is_mla(self) -> bool:
        return "kv_lora_rank" in self.config and self.config.get("kv_lora_rank") is not None

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or ["UnknownForCausalLM"])[0]


def text_config(config: dict) -> dict:
    """Multimodal wrappers (Kimi K2.5's kimi_k25) keep the language model under text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and "num_hidden_layers" in inner:
        merged = dict(inner)
        merged.setdefault("architectures", config.get("architectures"))
        return merged
    return config


def derived_context_length(config: dict) -> int:
    """SGLang's get_context_length: YaRN with original_max_position_embeddings keeps factor 1."""
    rope = config.get("rope_scaling") or {}
    factor = rope.get("factor", 1) if rope else 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if config.get(key) is not None:
            return int(factor * config[key])
    return 2048


def compute_world_size(args) -> int:
    """server_args.compute_world_size: EP does not multiply the GPU count."""
    return (1 if args.enable_dp_attention else args.dp_size) * args.tp_size * args.pp_size


# --------------------------------------------------------------------------- argument resolution

def resolve_args(args, model: Model, env: dict, gpu_capacity_mib: int | None) -> list[tuple[str, str]]:
    """Resolve server args in place as SGLang's ServerArgs.__post_init__ does.

    Returns the log lines SGLang prints while resolving, as (level, message).
    gpu_capacity_mib: the device memory capacity SGLang's defaults are keyed on.
    """
    logs: list[tuple[str, str]] = []
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.device is None:
        args.device = "cuda"
    if args.page_size is None:
        args.page_size = 1
    if args.attention_backend is None:
        # SGLang picks a hardware-specific default; for MLA models on CUDA that is a MLA kernel.
        args.attention_backend = "flashinfer" if not model.is_mla else "triton"
    if args.grammar_backend is None:
        args.grammar_backend = "xgrammar"
    if args.sampling_backend is None:
        args.sampling_backend = "flashinfer"

    for field in ("tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "moe_dp_size"):
        if getattr(args, field) < 1:
            raise Refusal("args", "ValueError", f"{field} must be a positive integer, got {getattr(args, field)}")

    # _data_parallelism_defaults: dp_size == 1 silently turns DP attention off.
    if args.dp_size == 1 and args.enable_dp_attention:
        args.enable_dp_attention = False
        args.enable_dp_lm_head = False

    # _a2a_ep_size: the all-to-all backends span the whole TP group.
    if args.moe_a2a_backend in A2A_EP_SPANNING and args.ep_size != args.tp_size:
        logs.append(("info", f"{args.moe_a2a_backend} MoE is enabled. The expert parallel size is "
                             f"adjusted to be the same as the tensor parallel size[{args.tp_size}]."))
        args.ep_size = args.tp_size

    # GPU-memory keyed defaults (memory_hook.handle_gpu_memory_settings).
    cap = gpu_capacity_mib
    if args.chunked_prefill_size is None:
        if cap is None:
            args.chunked_prefill_size = 4096
        elif cap < 20 * 1024:
            args.chunked_prefill_size = 2048
        elif cap < 60 * 1024:
            args.chunked_prefill_size = 4096
        elif cap < 160 * 1024:
            args.chunked_prefill_size = 8192
        else:
            args.chunked_prefill_size = 16384
    if args.cuda_graph_max_bs_decode is None:
        if cap is None:
            args.cuda_graph_max_bs_decode = 160
        elif cap < 20 * 1024:
            args.cuda_graph_max_bs_decode = 8
        elif cap < 35 * 1024:
            args.cuda_graph_max_bs_decode = 48 if args.tp_size < 4 else 160
        elif cap < 60 * 1024:
            args.cuda_graph_max_bs_decode = 32 if args.tp_size < 4 else 160
        elif cap < 160 * 1024:
            args.cuda_graph_max_bs_decode = 256 if args.tp_size < 4 else 512
        else:
            args.cuda_graph_max_bs_decode = 512
    if args.mem_fraction_static is None:
        args.mem_fraction_static = default_mem_fraction(args, cap, model)

    # _handle_data_parallelism: a bare assert, then chunked prefill is divided among DP ranks.
    if args.enable_dp_attention:
        if args.tp_size % args.dp_size != 0:
            raise Refusal("args", "AssertionError", "",
                          f"with --enable-dp-attention, tp_size ({args.tp_size}) must be divisible "
                          f"by dp_size ({args.dp_size})")
        original = args.chunked_prefill_size
        args.chunked_prefill_size = args.chunked_prefill_size // args.dp_size
        args.schedule_conservativeness = args.schedule_conservativeness * 0.3
        logs.append(("warning", f"DP attention is enabled. chunked prefill size is adjusted from "
                                f"{original} to {args.chunked_prefill_size}."))

    # moe_hook.handle_a2a_moe
    if args.moe_a2a_backend == "flashinfer" and not (args.enable_dp_attention and args.dp_size == args.tp_size):
        raise Refusal("args", "AssertionError",
                      "Flashinfer MoE A2A is only supported with dp_size == tp_size and --enable-dp-attention")
    if args.moe_a2a_backend == "pplx" and not (args.enable_dp_attention and args.dp_size >= 2):
        raise Refusal("args", "AssertionError",
                      "moe_a2a_backend='pplx' requires --enable-dp-attention with at least 2 DP groups (--dp-size >= 2).")

    # Pipeline parallelism turns the overlap scheduler off.
    if args.pp_size > 1 and not args.disable_overlap_schedule:
        args.disable_overlap_schedule = True
        logs.append(("warning", "Pipeline parallelism is incompatible with overlap schedule."))

    # check_server_args
    if (args.tp_size * args.pp_size) % args.nnodes != 0:
        raise Refusal("args", "AssertionError", "tp_size must be divisible by number of nodes")
    if args.pp_size > 1 and args.speculative_algorithm is not None:
        raise Refusal("args", "AssertionError",
                      "Pipeline parallelism is not compatible with overlap schedule, speculative decoding")
    if args.dp_size > 1 and args.nnodes != 1 and not args.enable_dp_attention:
        raise Refusal("args", "AssertionError", "multi-node data parallel is not supported unless dp attention!")
    if args.nnodes > 1 and not args.dist_init_addr:
        raise Refusal("args", "ValueError",
                      "--dist-init-addr is required when --nnodes > 1 (the address of node 0, host:port)")
    if not 0 <= args.node_rank < args.nnodes:
        raise Refusal("args", "AssertionError", f"node_rank ({args.node_rank}) must be in [0, nnodes={args.nnodes})")
    if ":" in args.served_model_name:
        raise Refusal("args", "AssertionError",
                      "served_model_name cannot contain a colon (':') character. The colon is reserved for "
                      f"the 'model:adapter' syntax used in LoRA adapter specification. Invalid value: "
                      f"'{args.served_model_name}'")
    if args.moe_dense_tp_size not in (None, 1, args.tp_size):
        raise Refusal("args", "AssertionError", "moe_dense_tp_size only supports None, 1, or tp_size currently")
    if args.chunked_prefill_size > 0 and args.chunked_prefill_size % args.page_size != 0:
        raise Refusal("args", "AssertionError", "chunked_prefill_size must be divisible by page_size")
    if not 0 < args.mem_fraction_static < 1:
        raise Refusal("args", "ValueError",
                      f"mem_fraction_static must be in (0, 1), got {args.mem_fraction_static}")

    # ModelConfig: context length against the model's own limit.
    derived = derived_context_length(model.config)
    if args.context_length is None:
        args.context_length = derived
    elif args.context_length > derived and env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") not in ("1", "true", "True"):
        raise Refusal("args", "ValueError",
                      f"User-specified context_length ({args.context_length}) is greater than the derived "
                      f"context_length ({derived}). This may lead to incorrect model outputs or CUDA errors. "
                      "Note that the derived context_length may differ from max_position_embeddings in the "
                      "model's config. To allow overriding this maximum, set the env var "
                      "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return logs


def default_mem_fraction(args, capacity_mib: int | None, model: Model) -> float:
    """memory_hook: (capacity - reserved) / capacity, reserved in MB, at least 10 GB on big GPUs."""
    if capacity_mib is None:
        return 0.95
    activation_tokens = max(args.chunked_prefill_size, 2048) if args.chunked_prefill_size > 0 \
        else max(args.max_prefill_tokens, 2048)
    reserved = 512 + activation_tokens * 1.5 + args.tp_size * args.pp_size / 8 * 1024
    graph = 0.0
    if not args.disable_cuda_graph:
        graph += args.cuda_graph_max_bs_decode * 2
        graph += 1.5 * 1024 if model.is_mla else 0
    if args.enable_dp_attention:
        graph += args.cuda_graph_max_bs_decode * args.dp_size * 3
        if args.cuda_graph_max_bs_decode > 300:
            graph += args.cuda_graph_max_bs_decode * args.dp_size * 1.5
    reserved += graph
    if capacity_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((capacity_mib - reserved) / capacity_mib, 3)


# --------------------------------------------------------------------------- launch and model init

def gpu_ids_for_node(args) -> list[int]:
    """CUDA device ordinals this node's scheduler processes open (engine launcher arithmetic)."""
    per_node = compute_world_size(args) // args.nnodes
    return [args.base_gpu_id + i * args.gpu_id_step for i in range(per_node)]


def node_ranks(args) -> tuple[range, range]:
    """The TP ranks and PP ranks this node's schedulers run (engine launcher arithmetic): PP
    stages go to nodes first; when there are more nodes than stages, a TP group spans
    nnodes // pp_size nodes (TP16 over 2 nodes: node 0 runs TP0-7, node 1 TP8-15)."""
    nnodes_per_tp_group = max(args.nnodes // args.pp_size, 1)
    tp_per_node = args.tp_size // nnodes_per_tp_group
    tp_first = tp_per_node * (args.node_rank % nnodes_per_tp_group)
    pp_per_node = max(args.pp_size // args.nnodes, 1)
    pp_first = pp_per_node * (args.node_rank // nnodes_per_tp_group)
    return range(tp_first, tp_first + tp_per_node), range(pp_first, pp_first + pp_per_node)


def check_model_layout(args, model: Model) -> dict:
    """Model-init checks (attention head split, FusedMoE divisibility). Returns the MoE layout."""
    heads = int(model.get("num_attention_heads", 1))
    attn_tp = args.tp_size // args.dp_size if args.enable_dp_attention else args.tp_size
    if heads % attn_tp != 0:
        raise Refusal("load", "AssertionError", f"{heads} is not divisible by {attn_tp}",
                      f"num_attention_heads ({heads}) must divide evenly over the attention TP size ({attn_tp})")
    layout = {"attn_tp_size": attn_tp, "attn_dp_size": args.dp_size if args.enable_dp_attention else 1}
    experts = model.get("n_routed_experts") or model.get("num_experts")
    if not experts:
        layout.update(moe_ep_size=args.ep_size, moe_tp_size=args.tp_size // args.ep_size)
        return layout
    experts = int(experts) + int(args.ep_num_redundant_experts)
    moe_ep = args.ep_size
    moe_tp = args.tp_size // moe_ep // args.moe_dp_size
    if moe_tp == 0:
        raise Refusal("load", "ZeroDivisionError", "integer division or modulo by zero",
                      f"moe_tp_size = tp_size // ep_size // moe_dp_size = {args.tp_size} // {moe_ep} // "
                      f"{args.moe_dp_size} = 0: ep_size cannot exceed tp_size (EP subdivides the TP group; "
                      f"it does not add GPUs)")
    if args.tp_size % (moe_ep * args.moe_dp_size) != 0:
        raise Refusal("load", "AssertionError",
                      f"tp_size ({args.tp_size}) is not divisible by ep_size ({moe_ep}) x moe_dp_size ({args.moe_dp_size})",
                      "SGLang has no explicit check here, but its MoE process groups would not have ep_size "
                      "ranks; the rehearsal engine refuses the layout")
    if experts % moe_ep != 0:
        raise Refusal("load", "AssertionError",
                      f"num_experts ({experts}) must be divisible by ep_size ({moe_ep})",
                      "FusedMoE splits the routed experts evenly over the EP ranks")
    inter = int(model.get("moe_intermediate_size", 0))
    if inter % moe_tp != 0:
        raise Refusal("load", "AssertionError",
                      f"moe_intermediate_size ({inter}) must be divisible by moe_tp_size ({moe_tp})",
                      "FusedMoE splits each expert's intermediate size over tp_size / ep_size ranks")
    layout.update(moe_ep_size=moe_ep, moe_tp_size=moe_tp, num_local_experts=experts // moe_ep)
    return layout


# All-to-all backends that need NVLink between every pair of a node's GPUs: DeepEP's Buffer asserts
# it as SGLang makes it (deep_ep/utils.py check_nvlink_connections), at the first MoE dispatch,
# i.e. while CUDA graphs are captured, after the weights have loaded and with the port closed.
NVLINK_A2A = {"deepep"}


def check_a2a_links(args, unlinked: tuple[int, int] | None) -> None:
    """DeepEP without NVLink fails while loading. `unlinked`: the first pair of this node's GPUs
    (nvidia-smi indices) that `nvidia-smi topo -m` shows without NV#, or None."""
    if args.moe_a2a_backend not in NVLINK_A2A or unlinked is None:
        return
    a, b = unlinked
    raise Refusal("load", "AssertionError", f"GPU {a} and GPU {b} are not connected via NVLink",
                  f"--moe-a2a-backend {args.moe_a2a_backend}: DeepEP moves tokens over NVLink between every pair "
                  "of the node's GPUs (its normal mode), and these GPUs are connected over PCIe only "
                  "(nvidia-smi topo -m); use --moe-a2a-backend none")


def pp_partition(num_layers: int, pp_size: int, env_value: str | None) -> list[int]:
    """distributed/utils.get_pp_indices: remainder on the LAST stages, or SGLANG_PP_LAYER_PARTITION."""
    if env_value is not None:
        try:
            parts = [int(x) for x in env_value.split(",")]
        except ValueError:
            raise Refusal("load", "ValueError", f"Invalid partition string: {env_value}")
        if len(parts) != pp_size:
            raise Refusal("load", "ValueError", f"len(partitions)={len(parts)} does not match pp_size={pp_size}.")
        if sum(parts) != num_layers:
            raise Refusal("load", "ValueError",
                          f"sum(partitions)={sum(parts)} does not match num_hidden_layers={num_layers}.")
        return parts
    base, remainder = divmod(num_layers, pp_size)
    return [base + (1 if rank >= pp_size - remainder else 0) for rank in range(pp_size)]


# --------------------------------------------------------------------------- memory

@dataclasses.dataclass
class MemoryPlan:
    layers_per_stage: list[int]
    weights_per_gpu: list[float]      # bytes, per PP stage
    kv_bytes_per_token: list[float]   # per GPU, per PP stage
    kv_pool_bytes: list[float]        # per GPU, per PP stage
    tokens_per_stage: list[int]
    max_total_num_tokens: int
    free_at_start: float              # bytes: the least free memory of the GPUs used
    max_running_requests: int
    max_req_len: int
    max_req_input_len: int
    kv_dtype_bytes: float


def kv_dtype_bytes(args, model: Model) -> float:
    if args.kv_cache_dtype in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[args.kv_cache_dtype]
    return float(model.checkpoint.get("kv_cache_dtype_bytes", 2))


def weights_per_gpu(args, model: Model, layers: int) -> float:
    """Weight bytes on one GPU of a stage holding `layers` layers.

    Experts and dense layers split over the TP group; attention splits over the attention TP
    group only (under DP attention it is replicated dp_size times).
    """
    total = float(model.checkpoint["checkpoint_bytes"])
    attention = float(model.checkpoint.get("attention_weights_bytes", 0))
    attn_tp = args.tp_size // args.dp_size if args.enable_dp_attention else args.tp_size
    per_gpu = (total - attention) / args.tp_size + attention / attn_tp
    return per_gpu * layers / model.num_layers


def kv_per_token(args, model: Model, layers: int, dtype_bytes: float) -> float:
    if model.is_mla:
        # The latent KV is replicated on every attention-TP rank: not divided by TP.
        return (int(model.get("kv_lora_rank")) + int(model.get("qk_rope_head_dim", 0))) * layers * dtype_bytes
    heads = int(model.get("num_key_value_heads", model.get("num_attention_heads", 1)))
    attn_tp = args.tp_size // args.dp_size if args.enable_dp_attention else args.tp_size
    head_dim = int(model.get("head_dim") or int(model.get("hidden_size")) // int(model.get("num_attention_heads")))
    return 2 * max(1, heads // attn_tp) * head_dim * layers * dtype_bytes


def plan_memory(args, model: Model, free_bytes: list[float], env: dict) -> MemoryPlan:
    """The KV pool each GPU gets: mem_fraction_static covers weights + KV pool.

    rest = free_at_start * mem_fraction_static - weights;  tokens = rest // bytes_per_token.
    """
    free = min(free_bytes)
    if args.tp_size > 1 and free < max(free_bytes) * 0.9:
        raise Refusal("load", "ValueError", "The memory capacity is unbalanced. Some GPUs may be occupied.",
                      "the GPUs of one TP group differ by more than 10% in free memory "
                      "(another process holds memory on some of them)")
    layers = pp_partition(model.num_layers, args.pp_size, env.get("SGLANG_PP_LAYER_PARTITION"))
    dtype = kv_dtype_bytes(args, model)
    weights = [weights_per_gpu(args, model, n) for n in layers]
    biggest = max(weights)
    if biggest > free:
        raise Refusal("load", "torch.OutOfMemoryError",
                      f"CUDA out of memory. Tried to allocate {min(biggest - free, 2 * GiB) / GiB:.2f} GiB. "
                      f"GPU 0 has a total capacity of {max(free_bytes) / GiB:.2f} GiB of which "
                      f"{max(free - biggest * 0.98, 0) / MiB:.2f} MiB is free.",
                      f"the weights need {biggest / GiB:.2f} GiB per GPU but only {free / GiB:.2f} GiB is free; "
                      f"use more GPUs per stage (tp_size x pp_size)")
    per_token = [kv_per_token(args, model, n, dtype) for n in layers]
    pools = [free * args.mem_fraction_static - w for w in weights]
    tokens = [int(pool // cell) if pool > 0 else 0 for pool, cell in zip(pools, per_token)]
    max_total = min(tokens)
    max_total -= max_total % args.page_size
    return MemoryPlan(
        layers_per_stage=layers, weights_per_gpu=weights, kv_bytes_per_token=per_token,
        kv_pool_bytes=pools, tokens_per_stage=tokens, max_total_num_tokens=max_total,
        free_at_start=free, max_running_requests=0, max_req_len=0, max_req_input_len=0,
        kv_dtype_bytes=dtype,
    )


def finish_memory(args, plan: MemoryPlan) -> list[tuple[str, str]]:
    """Apply --max-total-tokens, refuse an empty pool, size the request limits."""
    logs = []
    if args.max_total_tokens is not None:
        if args.max_total_tokens > plan.max_total_num_tokens:
            logs.append(("warning", f"max_total_tokens={args.max_total_tokens} is larger than the profiled "
                                    f"value {plan.max_total_num_tokens}. Use the profiled value instead."))
        plan.max_total_num_tokens = min(plan.max_total_num_tokens, args.max_total_tokens)
    if plan.max_total_num_tokens <= 0:
        raise Refusal("memory", "RuntimeError",
                      "Not enough memory. Please try to increase --mem-fraction-static. "
                      f"Current value: mem_fraction_static={args.mem_fraction_static}",
                      f"weights take {max(plan.weights_per_gpu) / GiB:.2f} GiB per GPU but mem_fraction_static "
                      f"x free memory is only {args.mem_fraction_static * plan.free_at_start / GiB:.2f} GiB "
                      "(mem_fraction_static covers weights + KV cache pool)")
    default_reqs = min(max(int(plan.max_total_num_tokens / args.context_length * 512), 2048), 4096)
    plan.max_running_requests = args.max_running_requests or default_reqs
    plan.max_req_len = min(args.context_length - 1, plan.max_total_num_tokens - 1)
    plan.max_req_input_len = plan.max_req_len - 5
    return logs


def gib(value: float) -> float:
    return math.floor(value / GiB * 100) / 100
