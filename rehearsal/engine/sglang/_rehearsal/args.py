"""SGLang's command line, as far as a deployment uses it.

Flag names, aliases, defaults and choices follow SGLang's ``server_args.py`` (2026): canonical
``--tp-size --pp-size --dp-size --ep-size`` with the aliases ``--tensor-parallel-size``,
``--pipeline-parallel-size``, ``--data-parallel-size``, ``--expert-parallel-size``/``--ep``.
The parser keeps argparse's default ``allow_abbrev=True`` like SGLang's, so ``--tp 8`` and
``--dp 8`` work as prefixes while ``--pp`` is ambiguous (``--pp-size``,
``--pp-max-micro-batch-size``, ``--pp-async-batch-depth``). The removed ``--enable-ep-moe`` and
``--enable-deepep-moe`` are not registered, so they are "unrecognized arguments" (exit 2) as in
SGLang's newest parser; the message adds what to use instead.
"""
from __future__ import annotations

import argparse
import logging
import sys

ATTENTION_BACKEND_CHOICES = [
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed",
    "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla",
    "tokenspeed_mla", "trtllm_mha", "dual_chunk_flash_attn", "hpc_ops", "minicpm_flashattn",
    "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
]
GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]
MOE_A2A_BACKEND_CHOICES = [
    "none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe",
    "deepep_v2", "pplx", "ascend_tp",
]
MOE_RUNNER_BACKEND_CHOICES = [
    "auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
    "cutlass", "aiter", "marlin", "humming", "experimental_sgl_marlin", "hpc_ops", "megamoe",
]
LOAD_FORMAT_CHOICES = [
    "auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "presharded", "gguf",
    "expert_pack", "bitsandbytes", "mistral", "layered", "flash_rl", "remote", "remote_instance",
    "fastsafetensors", "private", "runai_streamer",
]
QUANTIZATION_CHOICES = [
    "awq", "fp8", "mxfp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf",
    "modelopt", "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4",
    "w8a8_int8", "w8a8_fp8", "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8",
    "compressed-tensors", "modelslim", "mxfp_w4a8", "quark", "quark_int4fp8_moe", "quark_mxfp4",
    "mlx_q4", "mlx_q8", "unquant", "humming",
]
KV_CACHE_DTYPE_CHOICES = [
    "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1",
]
DTYPE_CHOICES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
# Flags SGLang removed; a deployment that still writes them should hear what replaced them.
REMOVED_FLAGS = {
    "--enable-ep-moe": "set --ep-size to the same value as --tp-size",
    "--enable-deepep-moe": "set --moe-a2a-backend deepep",
}


class SGLangArgumentParser(argparse.ArgumentParser):
    """argparse with SGLang's prog name and a hint for removed flags in the error text."""

    def error(self, message: str):
        hints = [f"{flag} was removed from SGLang: {fix}" for flag, fix in REMOVED_FLAGS.items()
                 if flag in message]
        if hints:
            message = message + " (" + "; ".join(hints) + ")"
        super().error(message)


class DeprecatedStoreTrue(argparse.Action):
    """A deprecated boolean flag that still works and logs a warning (like SGLang's)."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=0, const=True, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        logging.getLogger("sglang").warning(
            "'%s' is deprecated and will be removed in a future release. Use '%s' instead.",
            option_string, self.new_flag)
        setattr(namespace, self.dest, True)


class DeprecatedAlias(argparse.Action):
    """A deprecated alias that stores its value under the new name and logs a warning."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        logging.getLogger("sglang").warning(
            "'%s' is deprecated and will be removed in a future release. Use '%s' instead.",
            option_string, self.new_flag)
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    p = SGLangArgumentParser(prog="sglang serve")
    a = p.add_argument
    # Model and tokenizer
    a("--model-path", "--model", dest="model_path", required=True,
      help="The path of the model weights (a local folder; the rehearsal engine has no network).")
    a("--tokenizer-path", default=None)
    a("--tokenizer-mode", default="auto", choices=["auto", "slow"])
    a("--tokenizer-worker-num", type=int, default=1)
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", default="auto", choices=LOAD_FORMAT_CHOICES)
    a("--model-loader-extra-config", default="{}")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=int, default=None)
    a("--is-embedding", action="store_true")
    a("--enable-multimodal", action="store_true", default=None)
    a("--revision", default=None)
    a("--model-impl", default="auto")
    a("--json-model-override-args", default="{}")
    # Quantization and data type
    a("--dtype", default="auto", choices=DTYPE_CHOICES)
    a("--quantization", default=None, choices=QUANTIZATION_CHOICES)
    a("--quantization-param-path", default=None)
    a("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPE_CHOICES)
    # Memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", default="fcfs",
      choices=["lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key"])
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--disable-chunked-prefix-cache", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    # Distributed topology and parallelism
    a("--nccl-port", type=int, default=None)
    a("--dist-timeout", type=int, default=None)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--pp-max-micro-batch-size", type=int, default=None)
    a("--pp-async-batch-depth", type=int, default=0)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--load-balance-method", default="auto",
      choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"])
    a("--moe-dp-size", "--moe-data-parallel-size", dest="moe_dp_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    a("--enable-dp-lm-head", action="store_true")
    a("--enable-p2p-check", action="store_true")
    # Device
    a("--device", default=None)
    a("--base-gpu-id", type=int, default=0)
    a("--gpu-id-step", type=int, default=1)
    a("--random-seed", type=int, default=None)
    a("--watchdog-timeout", type=float, default=300)
    a("--sleep-on-idle", action="store_true")
    a("--numa-node", type=int, nargs="+", default=None)
    # HTTP server and API
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--skip-server-warmup", action="store_true")
    a("--warmups", default=None)
    a("--api-key", default=None)
    a("--admin-api-key", default=None)
    a("--served-model-name", default=None)
    a("--weight-version", default="default")
    a("--chat-template", default=None)
    a("--completion-template", default=None)
    a("--file-storage-path", default="sglang_storage")
    a("--enable-cache-report", action="store_true")
    a("--reasoning-parser", default=None)
    a("--tool-call-parser", default=None)
    a("--sampling-defaults", default="model", choices=["openai", "model"])
    a("--allow-auto-truncate", action="store_true")
    a("--stream-interval", type=int, default=1)
    # Logging and metrics
    a("--log-level", default="info")
    a("--log-level-http", default=None)
    a("--log-requests", action="store_true")
    a("--log-requests-level", type=int, default=2, choices=[0, 1, 2, 3])
    a("--show-time-cost", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--collect-tokens-histogram", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    # Kernel backends
    a("--attention-backend", default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--decode-attention-backend", default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--prefill-attention-backend", default=None, choices=ATTENTION_BACKEND_CHOICES)
    a("--sampling-backend", default=None, choices=["flashinfer", "pytorch", "ascend"])
    a("--grammar-backend", default=None, choices=GRAMMAR_BACKEND_CHOICES)
    a("--mm-attention-backend", default=None)
    # CUDA graphs (the newest SGLang keeps the older spellings as deprecated aliases)
    a("--cuda-graph-max-bs-decode", type=int, default=None)
    a("--cuda-graph-max-bs", type=int, dest="cuda_graph_max_bs_decode", action=DeprecatedAlias,
      new_flag="--cuda-graph-max-bs-decode", default=argparse.SUPPRESS)
    a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    a("--cuda-graph-bs", type=int, nargs="+", dest="cuda_graph_bs_decode", action=DeprecatedAlias,
      new_flag="--cuda-graph-bs-decode", default=argparse.SUPPRESS)
    a("--cuda-graph-backend-decode", default=None, choices=["full", "breakable", "tc_piecewise", "disabled"])
    a("--cuda-graph-backend-prefill", default=None, choices=["full", "breakable", "tc_piecewise", "disabled"])
    a("--disable-cuda-graph", action=DeprecatedStoreTrue, new_flag="--cuda-graph-backend-{decode,prefill}=disabled")
    a("--disable-cuda-graph-padding", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-symm-mem", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    # Speculative decoding
    a("--speculative-algorithm", default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    # Expert parallelism
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--moe-a2a-backend", default="none", choices=MOE_A2A_BACKEND_CHOICES)
    a("--moe-runner-backend", default="auto", choices=MOE_RUNNER_BACKEND_CHOICES)
    a("--deepep-mode", default="auto", choices=["auto", "normal", "low_latency"])
    a("--ep-num-redundant-experts", type=int, default=0)
    a("--ep-dispatch-algorithm", default=None, choices=["static", "dynamic", "fake", "lp"])
    a("--init-expert-location", default="trivial")
    a("--enable-eplb", action="store_true")
    a("--moe-dense-tp-size", type=int, default=None)
    a("--disable-shared-experts-fusion", action="store_true")
    # PD disaggregation (server_args.py: "Only used for PD disaggregation")
    a("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    a("--disaggregation-transfer-backend", default="mooncake",
      choices=["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"])
    a("--disaggregation-bootstrap-port", type=int, default=8998)
    a("--disaggregation-decode-tp", type=int, default=None)
    a("--disaggregation-decode-dp", type=int, default=None)
    a("--disaggregation-prefill-pp", type=int, default=1)
    a("--disaggregation-ib-device", default=None)
    a("--disaggregation-decode-enable-offload-kvcache", action="store_true")
    a("--num-reserved-decode-tokens", type=int, default=512)
    a("--disaggregation-decode-polling-interval", type=int, default=1)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse like ``sglang serve``: argparse errors print usage and exit 2."""
    return build_parser().parse_args(argv)


if __name__ == "__main__":  # pragma: no cover - a debugging aid
    print(parse(sys.argv[1:]))
