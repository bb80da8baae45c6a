"""`--enable-metrics`: /metrics in Prometheus' text format, with SGLang's metric names and labels.

Read from SGLang's observability collector (SchedulerMetricsCollector, TokenizerMetricsCollector,
2026) and the scheduler's metrics init:

- scheduler gauges (`sglang:num_running_reqs`, `num_used_tokens`, `token_usage`, `gen_throughput`,
  `num_queue_reqs`, `cache_hit_rate`, `max_total_num_tokens`), labelled `model_name`,
  `engine_type` ("unified"), `tp_rank`, `pp_rank`, `moe_ep_rank`, and `dp_rank` when the server
  has DP ranks. One series per scheduler that reports: those with attention-TP rank 0 (one per
  DP rank and pipeline stage), every scheduler with `--enable-metrics-for-all-schedulers`. Every
  TP rank of a DP group sees the same batch, so with that flag a sum over all series counts a
  request once per TP rank: sum over `tp_rank="0"`;
- tokenizer counters and histograms (`sglang:prompt_tokens_total`, `generation_tokens_total`,
  `num_requests_total`, `time_to_first_token_seconds`, `inter_token_latency_seconds` (older
  releases: `time_per_output_token_seconds`), `e2e_request_latency_seconds`), labelled
  `model_name`, `engine_type`, with SGLang's default buckets.
With `--collect-tokens-histogram`, also `sglang:prompt_tokens_histogram` and
`sglang:generation_tokens_histogram` (each finished request's lengths), both with the collector's
default prompt-token buckets (SGLang uses that one list for both unless --prompt-tokens-buckets /
--generation-tokens-buckets say otherwise).
Rendered as prometheus_client writes the text format 0.0.4 (a counter's family is named with its
`_total`; `le` as a float; values as floats).
"""
from __future__ import annotations

import threading

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
# TokenizerMetricsCollector's default_bucket_prompt_tokens (collector.py), used for both length histograms.
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 15000,
                 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000, 300000, 600000, 900000, 1100000)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    def __init__(self, buckets):
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * len(self.bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float):
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += value


class Stats:
    """What the tokenizer manager counts, for /metrics."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.prompt_lengths = Histogram(TOKEN_BUCKETS)
        self.generation_lengths = Histogram(TOKEN_BUCKETS)

    def token(self, result: dict, now: float):
        with self.lock:
            last = result.get("last_token_at")
            if last is None:
                self.ttft.observe(now - result["started"])
            else:
                self.itl.observe(now - last)
            result["last_token_at"] = now
            self.generation_tokens += 1

    def finished(self, result: dict, now: float):
        with self.lock:
            self.requests += 1
            self.prompt_tokens += int(result["prompt_tokens"])
            self.e2e.observe(now - result["started"])
            self.prompt_lengths.observe(int(result["prompt_tokens"]))
            self.generation_lengths.observe(int(result.get("emitted") or 0))


def _labels(pairs) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


def _num(value) -> str:
    return repr(float(value))


def schedulers(args) -> list[dict]:
    """The (tp_rank, pp_rank, moe_ep_rank, dp_rank) of every scheduler that reports."""
    tp, pp, dp = int(args.tp_size), int(args.pp_size), int(args.dp_size)
    ep = max(1, int(args.ep_size))
    attn_tp = tp // dp if args.enable_dp_attention and dp > 1 else tp
    groups = dp if args.enable_dp_attention and dp > 1 else 1
    out = []
    for dp_rank in range(dp if dp > 1 else 1):
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                # Under DP attention the DP ranks share the TP ranks: rank r's attention group is r // attn_tp.
                if groups > 1 and tp_rank // attn_tp != dp_rank:
                    continue
                if not args.enable_metrics_for_all_schedulers and tp_rank % attn_tp != 0:
                    continue
                entry = {"tp_rank": tp_rank, "pp_rank": pp_rank, "moe_ep_rank": tp_rank // max(1, tp // ep)}
                if dp > 1:
                    entry["dp_rank"] = dp_rank
                out.append(entry)
    return out


def render(engine) -> str:
    args = engine.args
    base = [("model_name", args.served_model_name), ("engine_type", "unified")]
    plan = engine.plan
    capacity = max(1, plan.max_total_num_tokens)
    lines: list[str] = []
    gauges = {
        "num_running_reqs": ("The number of running requests.", lambda r: engine.ranks.load(r)),
        "num_used_tokens": ("The number of used tokens.", lambda r: engine.used_tokens(r)),
        "token_usage": ("The token usage.", lambda r: round(engine.used_tokens(r) / capacity, 4)),
        "gen_throughput": ("The generation throughput (token/s).", lambda r: engine.ranks.throughput(r)),
        "num_queue_reqs": ("The number of requests in the waiting queue.", lambda r: 0),
        "cache_hit_rate": ("The prefix cache hit rate.", lambda r: 0.0),
        "max_total_num_tokens": ("Maximum total number of tokens in the KV cache pool.",
                                 lambda r: plan.max_total_num_tokens),
    }
    reporting = schedulers(args)
    for name, (doc, value) in gauges.items():
        lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} gauge"]
        for s in reporting:
            pairs = base + [(k, s[k]) for k in ("tp_rank", "pp_rank", "moe_ep_rank", "dp_rank") if k in s]
            lines.append(f"sglang:{name}{_labels(pairs)} {_num(value(s.get('dp_rank', 0)))}")
    stats = engine.stats
    with stats.lock:
        for name, doc, value in (("prompt_tokens_total", "Number of prefill tokens processed.", stats.prompt_tokens),
                                 ("generation_tokens_total", "Number of generation tokens processed.",
                                  stats.generation_tokens),
                                 ("num_requests_total", "Number of requests processed.", stats.requests)):
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} counter",
                      f"sglang:{name}{_labels(base)} {_num(value)}"]
        histograms = [("time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft),
                      ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", stats.itl),
                      ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", stats.e2e)]
        if getattr(args, "collect_tokens_histogram", False):
            histograms += [("prompt_tokens_histogram", "Histogram of prompt token length.", stats.prompt_lengths),
                           ("generation_tokens_histogram", "Histogram of generation token length.", stats.generation_lengths)]
        for name, doc, hist in histograms:
            lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} histogram"]
            for bound, count in zip(hist.bounds, hist.counts):
                lines.append(f"sglang:{name}_bucket{_labels(base + [('le', _num(bound))])} {_num(count)}")
            lines.append(f"sglang:{name}_bucket{_labels(base + [('le', '+Inf')])} {_num(hist.total)}")
            lines.append(f"sglang:{name}_count{_labels(base)} {_num(hist.total)}")
            lines.append(f"sglang:{name}_sum{_labels(base)} {_num(hist.sum)}")
    if engine.pd is not None:
        lines += engine.pd.metric_lines(base)
    return "\n".join(lines) + "\n"
