"""What a server's and the router's Prometheus text say about the load, read with Prometheus' own
text parser (prometheus_client). Pure.

SGLang (`--enable-metrics`, /metrics on the serving port; the rehearsal engine writes the same,
rehearsal/engine/sglang/_rehearsal/metrics.py):
- scheduler gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`, one series per scheduler
  that reports, labelled tp_rank, pp_rank (and dp_rank with DP ranks). By default only each
  attention-TP group's rank 0 reports; with `--enable-metrics-for-all-schedulers` every TP rank
  does, and every TP rank of a group sees the same batch: summing every series counts each
  request once per TP rank. Every pipeline stage holds the same requests (SGLang hands them from
  stage to stage; a stage's gauge is the micro-batch it logged last), so stages are not added up
  either: a DP group's load is its largest stage's, and the DP groups add up;
- tokenizer counters `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`,
  `sglang:num_requests_total` and the histograms `sglang:e2e_request_latency_seconds`,
  `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds` (older releases:
  `sglang:time_per_output_token_seconds`), one series per model; with `--collect-tokens-histogram`
  (serving.collectTokensHistogram) also `sglang:prompt_tokens_histogram` and
  `sglang:generation_tokens_histogram`, each finished request's lengths.
The router (smg 1.13.0, its --prometheus-port; captured in tests/data/traffic/):
`smg_worker_requests_active{worker=URL}` (requests in flight per server) and
`smg_router_requests_total` (requests routed).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
REQUESTS = "sglang:num_requests_total"
E2E = "sglang:e2e_request_latency_seconds"
TTFT = "sglang:time_to_first_token_seconds"
ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
PROMPT_LENGTHS = "sglang:prompt_tokens_histogram"
GENERATION_LENGTHS = "sglang:generation_tokens_histogram"
ROUTER_ACTIVE = "smg_worker_requests_active"
ROUTER_REQUESTS = "smg_router_requests_total"


# One sample of a Prometheus text exposition: (name, labels, value).
Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition: (name, labels, value). Raises ValueError on
    text that is not the format."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def scheduler_load(rows: list[Sample], names: tuple[str, ...], attn_tp_size: Optional[int] = None
                   ) -> Optional[float]:
    """Requests in `names` (running, queued or both) on one server, each counted once (module
    docstring). `attn_tp_size`: the layout's attention-TP group (tp, or tp/dp under DP attention):
    a series whose tp_rank is not its group's rank 0 is another view of the same batch. Unknown
    (None): per DP rank label and stage, the lowest tp_rank reporting. None when no series."""
    per: dict[tuple[Any, ...], dict[str, float]] = {}  # (dp group, pp stage, tp rank) -> name -> value
    for name, labels, value in rows:
        if name not in names:
            continue
        tp = _int(labels.get("tp_rank"))
        if attn_tp_size:
            if tp % attn_tp_size:
                continue
            group = labels.get("dp_rank", str(tp // attn_tp_size))
        else:
            group = labels.get("dp_rank", "")
        key = (labels.get("model_name", ""), group, _int(labels.get("pp_rank")), tp)
        per.setdefault(key, {})[name] = value
    if not per:
        return None
    lowest: dict[tuple[Any, ...], int] = {}
    for model, group, pp, tp in per:
        lowest[(model, group, pp)] = min(tp, lowest.get((model, group, pp), tp))
    stages: dict[tuple[Any, ...], float] = {}
    for (model, group, pp), tp in lowest.items():
        load = sum(per[(model, group, pp, tp)].values())
        stages[(model, group)] = max(load, stages.get((model, group), 0.0))
    return sum(stages.values())


def in_flight(text: str, attn_tp_size: Optional[int] = None) -> Optional[int]:
    """Requests running plus queued on a server, from its /metrics; None when it reports neither."""
    load = scheduler_load(samples(text), (RUNNING, QUEUED), attn_tp_size)
    return None if load is None else int(round(load))


@dataclass(frozen=True)
class Histogram:
    """A histogram's cumulative buckets (upper bound -> count), count and sum."""
    buckets: tuple[tuple[float, float], ...] = ()
    count: float = 0.0
    total: float = 0.0

    def minus(self, before: "Histogram") -> "Histogram":
        old = dict(before.buckets)
        return Histogram(tuple((le, max(0.0, n - old.get(le, 0.0))) for le, n in self.buckets),
                         max(0.0, self.count - before.count), max(0.0, self.total - before.total))

    def plus(self, other: "Histogram") -> "Histogram":
        """Two servers' histograms of one quantity added (the same buckets: SGLang's defaults);
        with different buckets, the one that counted more (cumulative counts at different
        bounds do not add)."""
        if not other.buckets and not other.count:
            return self
        if not self.buckets and not self.count:
            return other
        if [le for le, _ in self.buckets] != [le for le, _ in other.buckets]:
            return self if self.count >= other.count else other
        return Histogram(tuple((le, n + m) for (le, n), (_, m) in zip(self.buckets, other.buckets)),
                         self.count + other.count, self.total + other.total)

    def quantile(self, q: float) -> Optional[float]:
        """Prometheus' histogram_quantile: linear inside the bucket the rank falls in."""
        if self.count <= 0 or not self.buckets:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if le == float("inf"):
                    return lower
                return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 0.0)
            lower, below = le, n
        return lower

    def as_dict(self) -> dict[str, Any]:
        return {"buckets": [[le if le != float("inf") else "+Inf", n] for le, n in self.buckets], "count": self.count,
                "sum": self.total}

    @classmethod
    def from_dict(cls, doc: Optional[dict[str, Any]]) -> "Histogram":
        if not doc:
            return cls()
        return cls(tuple((float(le), float(n)) for le, n in doc.get("buckets", [])), float(doc.get("count", 0)),
                   float(doc.get("sum", 0)))


def histogram(rows: list[Sample], names: tuple[str, ...] | str) -> Histogram:
    """The first of `names` the text has, summed over its label sets (one per model)."""
    for name in (names,) if isinstance(names, str) else names:
        buckets: dict[float, float] = {}
        count = total = 0.0
        seen = False
        for n, labels, value in rows:
            if n == f"{name}_bucket":
                le = float(labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + value
                seen = True
            elif n == f"{name}_count":
                count += value
                seen = True
            elif n == f"{name}_sum":
                total += value
        if seen:
            return Histogram(tuple(sorted(buckets.items())), count, total)
    return Histogram()


def _sum(rows: list[Sample], name: str) -> Optional[float]:
    values = [v for n, _, v in rows if n == name]
    return sum(values) if values else None


# A ServerSample's histograms, in its field order (status.json keeps each as a dict).
HISTOGRAMS = ("e2e", "ttft", "itl", "prompt_lengths", "generation_lengths")


@dataclass(frozen=True)
class ServerSample:
    """One read of one server's /metrics."""
    at: float                     # seconds since the epoch, when read
    running: Optional[float]
    queued: Optional[float]
    prompt_tokens: Optional[float]
    generation_tokens: Optional[float]
    requests: Optional[float]
    e2e: Histogram = field(default_factory=Histogram)
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    prompt_lengths: Histogram = field(default_factory=Histogram)      # empty without --collect-tokens-histogram
    generation_lengths: Histogram = field(default_factory=Histogram)

    @property
    def in_flight(self) -> Optional[float]:
        if self.running is None and self.queued is None:
            return None
        return (self.running or 0.0) + (self.queued or 0.0)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in HISTOGRAMS:
            d[k] = getattr(self, k).as_dict()
        return d

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "ServerSample":
        return cls(float(doc["at"]), doc.get("running"), doc.get("queued"), doc.get("prompt_tokens"),
                   doc.get("generation_tokens"), doc.get("requests"),
                   *(Histogram.from_dict(doc.get(k)) for k in HISTOGRAMS))


def server_sample(text: str, at: float, attn_tp_size: Optional[int] = None) -> ServerSample:
    """SGLang's /metrics as one sample. Raises ValueError on text that is not Prometheus' format."""
    rows = samples(text)
    return ServerSample(at, scheduler_load(rows, (RUNNING,), attn_tp_size), scheduler_load(rows, (QUEUED,), attn_tp_size),
                        _sum(rows, PROMPT_TOKENS), _sum(rows, GENERATION_TOKENS), _sum(rows, REQUESTS),
                        histogram(rows, E2E), histogram(rows, TTFT), histogram(rows, ITL),
                        histogram(rows, PROMPT_LENGTHS), histogram(rows, GENERATION_LENGTHS))


@dataclass(frozen=True)
class RouterSample:
    at: float
    active: dict[str, float]      # worker URL -> requests in flight there
    requests: Optional[float]     # requests routed since the router started

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def router_sample(text: str, at: float) -> RouterSample:
    rows = samples(text)
    active: dict[str, float] = {}
    for name, labels, value in rows:
        if name == ROUTER_ACTIVE:
            url = labels.get("worker", "").rstrip("/")
            active[url] = active.get(url, 0.0) + value
    return RouterSample(at, active, _sum(rows, ROUTER_REQUESTS))
