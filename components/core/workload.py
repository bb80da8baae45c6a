"""The observed workload: what the servers' /metrics say about the traffic, per watch tick and over
a window. Pure (samples in, figures out; the reads are components/traffic_watch.py's).

Per tick, from two samples of each serving host (the previous tick's and this one's):
- concurrency: requests in the system on average over the tick, by Little's law from SGLang's
  end-to-end latency histogram (its sum grows by the seconds every finished request spent: the
  growth over the tick's seconds is the mean number in flight); with no request finished in the
  tick, the gauges' running + queued at the tick (core/server_metrics.py counts each once);
- request rate (requests finished a second), input and output tokens a request (the growth of
  SGLang's prompt/generation token counters over the requests finished), TTFT and ITL p50 (from
  the growth of their histograms);
- output tokens a second, all hosts (the generation counter's growth over the tick's seconds):
  what a switch is measured by afterwards (core/autoswitch_log.py);
- the lengths' distribution, when the servers keep SGLang's length histograms
  (serving.collectTokensHistogram): each finished request's input and output length, p50 and p90
  for the tick, and the tick's histograms kept so the window's quantiles are over every request
  of the window, not a median of the ticks'. Without them, the tick's means only (labelled);
- a counter that went down (the server restarted) gives that host no figure for the tick.
Over the window: the per-tick figures kept for `window_seconds`, and their summary (the median
concurrency, so that a burst does not decide a layout alone, and its p90 beside it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median
from typing import Any, Optional

from .server_metrics import Histogram, ServerSample

DEFAULT_WINDOW_SECONDS = 3600  # an hour of ticks: the load a layout serves, not one tick's burst


@dataclass(frozen=True)
class Observation:
    at: float
    seconds: Optional[float]          # the tick's length (None: no previous sample)
    hosts: int                        # serving hosts read
    in_flight: Optional[float]        # running + queued at the tick, all hosts
    concurrency: Optional[float]      # mean in the system over the tick (Little's law), else in_flight
    request_rate: Optional[float]     # requests finished a second
    input_len: Optional[float]        # prompt tokens a finished request
    output_len: Optional[float]       # generated tokens a finished request
    ttft_p50_ms: Optional[float] = None
    itl_p50_ms: Optional[float] = None
    basis: str = ""                   # "little" | "gauges" | ""
    output_tok_s: Optional[float] = None   # generated tokens a second, all hosts
    # The tick's length histograms (each finished request's; Histogram.as_dict), or None.
    input_lengths: Optional[dict[str, Any]] = None
    output_lengths: Optional[dict[str, Any]] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Observation":
        fields: dict[str, Any] = {k: doc.get(k) for k in cls.__dataclass_fields__}
        return cls(**fields)


def _delta(now: Optional[float], before: Optional[float]) -> Optional[float]:
    if now is None or before is None or now < before:
        return None  # unknown, or a restart reset the counter
    return now - before


def observe(before: dict[str, ServerSample], now: dict[str, ServerSample]) -> Observation:
    """One tick's workload over the hosts in `now` (host -> sample); `before`: the previous tick's."""
    at = max((s.at for s in now.values()), default=0.0)
    gauges = [s.in_flight for s in now.values() if s.in_flight is not None]
    in_flight = sum(gauges) if gauges else None
    busy = finished = prompt = generated = count = gen_rate = 0.0
    seconds: list[float] = []
    ttft = itl = None
    input_lengths, output_lengths = Histogram(), Histogram()
    for host, s in now.items():
        p = before.get(host)
        if p is None or s.at <= p.at:
            continue
        d_req, d_busy = _delta(s.requests, p.requests), _delta(s.e2e.total, p.e2e.total)
        d_in, d_out = _delta(s.prompt_tokens, p.prompt_tokens), _delta(s.generation_tokens, p.generation_tokens)
        if d_req is None or d_busy is None or d_in is None or d_out is None or s.e2e.count < p.e2e.count:
            continue
        seconds.append(s.at - p.at)
        busy += d_busy / (s.at - p.at)
        finished += d_req / (s.at - p.at)
        gen_rate += d_out / (s.at - p.at)
        if s.prompt_lengths.count >= p.prompt_lengths.count and s.generation_lengths.count >= p.generation_lengths.count:
            input_lengths = input_lengths.plus(s.prompt_lengths.minus(p.prompt_lengths))
            output_lengths = output_lengths.plus(s.generation_lengths.minus(p.generation_lengths))
        count += d_req
        prompt += d_in
        generated += d_out
        ttft = s.ttft.minus(p.ttft) if ttft is None else ttft  # one host's shape: quantiles do not add
        itl = s.itl.minus(p.itl) if itl is None else itl
    tick = median(seconds) if seconds else None
    little = busy if seconds and finished > 0 else None
    q_ttft = ttft.quantile(0.5) if ttft is not None else None
    q_itl = itl.quantile(0.5) if itl is not None else None
    return Observation(
        at=at, seconds=tick, hosts=len(now), in_flight=in_flight,
        concurrency=little if little is not None else in_flight,
        request_rate=finished if seconds else None,
        input_len=prompt / count if count > 0 else None, output_len=generated / count if count > 0 else None,
        ttft_p50_ms=None if q_ttft is None else q_ttft * 1000, itl_p50_ms=None if q_itl is None else q_itl * 1000,
        basis="little" if little is not None else ("gauges" if in_flight is not None else ""),
        output_tok_s=gen_rate if seconds else None,
        input_lengths=input_lengths.as_dict() if input_lengths.count > 0 else None,
        output_lengths=output_lengths.as_dict() if output_lengths.count > 0 else None)


def keep(window: list[Observation], new: Observation, window_seconds: float = DEFAULT_WINDOW_SECONDS) -> list[Observation]:
    """The window with `new` added and what is older than `window_seconds` before it dropped."""
    return [o for o in window if new.at - o.at <= window_seconds and o.at < new.at] + [new]


@dataclass(frozen=True)
class Summary:
    ticks: int
    seconds: float                    # from the first tick kept to the last
    concurrency: Optional[float]      # median of the ticks'
    concurrency_p90: Optional[float]
    request_rate: Optional[float]     # mean
    input_len: Optional[float]        # weighted by the requests of each tick
    output_len: Optional[float]
    output_tok_s: Optional[float] = None    # median of the ticks'
    # Each request's lengths over the window (SGLang's length histograms), else None: means only.
    input_len_p50: Optional[float] = None
    input_len_p90: Optional[float] = None
    output_len_p50: Optional[float] = None
    output_len_p90: Optional[float] = None
    lengths_basis: str = ""           # "each request" | "means only" | ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.concurrency is None:
            return "no load observed yet"
        lengths = ""
        if self.input_len_p50 is not None and self.output_len_p50 is not None:
            lengths = (f", input p50 {self.input_len_p50:.0f} / p90 {_n(self.input_len_p90)} and output p50 "
                       f"{self.output_len_p50:.0f} / p90 {_n(self.output_len_p90)} tokens a request")
        elif self.input_len is not None and self.output_len is not None:
            lengths = f", {self.input_len:.0f} in + {self.output_len:.0f} out tokens a request (means only)"
        tok_s = f", {self.output_tok_s:,.0f} output tok/s" if self.output_tok_s is not None else ""
        rate = f", {self.request_rate:.2f} requests/s" if self.request_rate is not None else ""
        return (f"{_c(self.concurrency)} requests in flight (median of {self.ticks} tick(s) over "
                f"{self.seconds / 60:.0f} min; p90 {_c(self.concurrency_p90)}){rate}{tok_s}{lengths}")


def _n(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:.0f}"


def _c(v: Optional[float]) -> str:
    return "?" if v is None else (f"{v:.1f}" if v < 10 else f"{v:.0f}")


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _window_lengths(window: list[Observation], key: str) -> Histogram:
    total = Histogram()
    for o in window:
        total = total.plus(Histogram.from_dict(getattr(o, key)))
    return total


def summarize(window: list[Observation]) -> Summary:
    cs = [o.concurrency for o in window if o.concurrency is not None]
    tok_s = [o.output_tok_s for o in window if o.output_tok_s is not None]
    inputs, outputs = _window_lengths(window, "input_lengths"), _window_lengths(window, "output_lengths")
    rates = [o.request_rate for o in window if o.request_rate is not None]
    weighted = [(o.request_rate * (o.seconds or 0), o.input_len, o.output_len) for o in window
                if o.request_rate and o.input_len is not None and o.output_len is not None]
    total = sum(w for w, _, _ in weighted)
    span = (window[-1].at - window[0].at) if len(window) > 1 else 0.0
    each = inputs.count > 0 and outputs.count > 0
    return Summary(len(window), span, median(cs) if cs else None, _p90(cs) if cs else None,
                   sum(rates) / len(rates) if rates else None,
                   sum(w * input_len for w, input_len, _ in weighted) / total if total else None,
                   sum(w * output_len for w, _, output_len in weighted) / total if total else None,
                   median(tok_s) if tok_s else None,
                   inputs.quantile(0.5) if each else None, inputs.quantile(0.9) if each else None,
                   outputs.quantile(0.5) if each else None, outputs.quantile(0.9) if each else None,
                   "each request" if each else ("means only" if total else ""))
