"""The strategy the traffic calls for, with its numbers. Pure: curves, the observed load, the
switch's cost and the policy in; a recommendation out (cases tests/data/recommend/).

For each deployable stack, the expected output throughput at the observed concurrency:
- from its measured `compare` curve (core/compare.py: the newest figure per level), interpolated
  between the two measured levels around the load on log-log axes (throughput grows as a power of
  concurrency between levels: straight there), TTFT and ITL alike;
- where the load lies outside the measured levels, the advisor's estimate (core/advise.py),
  labelled so; without one, the nearest measured level, labelled so.
A fleet behind the router spreads the load: each host sees concurrency / hosts.

The switch pays when the throughput gained over the next `horizon` (after the roll) outweighs
what the roll costs: every host is down for its forecast switch time once (core/switch_cost.py,
else the configured figure), losing the current layout's share of the throughput meanwhile:
  net = (T_new - T_now) * (horizon - roll time) - T_now * switch time.
Against flapping: a candidate must beat the current stack by `hysteresis_percent`, and no switch
is recommended within `min_dwell_seconds` of the last one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .compare import Comparison

MEASURED, INTERPOLATED, ESTIMATE, NEAREST = "measured", "interpolated", "estimate", "nearest measured level"
STAY, SWITCH = "stay", "switch"


@dataclass(frozen=True)
class Level:
    tok_s: float
    ttft_ms: Optional[float] = None
    itl_ms: Optional[float] = None


@dataclass(frozen=True)
class Curve:
    """One stack's figures: measured levels, and the advisor's estimates (tok/s) by concurrency."""
    stack: str
    strategy: str
    measured: dict[int, Level] = field(default_factory=dict)
    estimates: dict[int, float] = field(default_factory=dict)
    rehearsal: bool = False


@dataclass(frozen=True)
class Expected:
    stack: str
    strategy: str
    per_host_concurrency: float
    tok_s: Optional[float]            # the whole fleet's
    ttft_ms: Optional[float]
    itl_ms: Optional[float]
    basis: str                        # measured | interpolated | estimate | nearest measured level | none
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _between(points: dict[int, float], c: float) -> Optional[tuple[float, int, int]]:
    """Log-log interpolation of `points` at c, with the levels used; None outside their range."""
    levels = sorted(k for k, v in points.items() if v is not None and v > 0)
    if not levels or c < levels[0] or c > levels[-1]:
        return None
    for lo, hi in zip(levels, levels[1:] + levels[-1:]):
        if lo <= c <= hi:
            if lo == hi or c == lo:
                return points[lo], lo, lo
            if c == hi:
                return points[hi], hi, hi
            f = (math.log(c) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return math.exp(math.log(points[lo]) + f * (math.log(points[hi]) - math.log(points[lo]))), lo, hi
    return None


def expected(curve: Curve, concurrency: float, hosts: int = 1) -> Expected:
    """The stack's expected figures at `concurrency` requests in flight over `hosts` hosts."""
    c = max(1.0, concurrency / max(1, hosts))  # below one request in flight a layout serves one at a time
    tok = {k: lv.tok_s for k, lv in curve.measured.items()}
    hit = _between(tok, c)
    if hit is not None:
        value, lo, hi = hit
        ttft = _between({k: lv.ttft_ms for k, lv in curve.measured.items() if lv.ttft_ms}, c)
        itl = _between({k: lv.itl_ms for k, lv in curve.measured.items() if lv.itl_ms}, c)
        basis = MEASURED if lo == hi else INTERPOLATED
        detail = f"measured at C={lo}" if lo == hi else f"interpolated between measured C={lo} and C={hi}"
        return Expected(curve.stack, curve.strategy, c, value * hosts, ttft and ttft[0], itl and itl[0], basis,
                        detail + (" (rehearsal engine)" if curve.rehearsal else ""))
    est = _between(curve.estimates, c)
    if est is not None:
        value, lo, hi = est
        return Expected(curve.stack, curve.strategy, c, value * hosts, None, None, ESTIMATE,
                        f"advisor's estimate (not measured at C={c:g}; `python -m components bench --stack {curve.stack}`)")
    if tok:
        near = min(tok, key=lambda k: abs(math.log(k) - math.log(c)))
        lv = curve.measured[near]
        return Expected(curve.stack, curve.strategy, c, lv.tok_s * hosts, lv.ttft_ms, lv.itl_ms, NEAREST,
                        f"measured at C={near} only, the nearest level to C={c:g}")
    return Expected(curve.stack, curve.strategy, c, None, None, None, "none",
                    f"no benchmark result and no estimate (`python -m components bench --stack {curve.stack}`)")


@dataclass(frozen=True)
class Policy:
    horizon_seconds: float = 3600.0       # the next window the gain is counted over
    hysteresis_percent: float = 10.0      # a candidate must beat the current stack by this much
    min_dwell_seconds: float = 3600.0     # no switch recommended sooner after the last one
    switch_seconds: float = 900.0         # the configured cost of one host's switch, without a forecast


@dataclass(frozen=True)
class Cost:
    seconds: float                        # one host's switch (nothing serves there meanwhile)
    basis: str                            # "history" | "estimate" | "configured"
    text: str = ""


@dataclass(frozen=True)
class Recommendation:
    current: str
    action: str                           # stay | switch
    recommended: str                      # the stack to serve: `current` when staying
    reason: str
    concurrency: Optional[float]
    hosts: int
    figures: list[Expected]
    gain_tokens: Optional[float] = None   # net over the horizon, the switch's cost paid
    cost_tokens: Optional[float] = None
    cost: Optional[Cost] = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["figures"] = [f.as_dict() for f in self.figures]
        return d

    def line(self) -> str:
        head = (f"recommend {self.recommended} (switch from {self.current})" if self.action == SWITCH
                else f"stay on {self.current}")
        return f"{head}: {self.reason}"


def _tps(v: Optional[float]) -> str:
    return "?" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")


def recommend(current: str, curves: list[Curve], concurrency: Optional[float], *, hosts: int = 1,
              costs: Optional[dict[str, Cost]] = None, policy: Policy = Policy(), now: float = 0.0,
              last_switch_at: Optional[float] = None, batch_size: int = 1) -> Recommendation:
    """Stay on `current` or switch to another of `curves`' stacks. `costs`: per target stack, the
    forecast of one host's switch (else policy.switch_seconds, "configured"); `last_switch_at`:
    when the serving stack last changed (None: not known to have changed)."""
    if concurrency is None:
        return Recommendation(current, STAY, current, "no load observed yet (no /metrics read)", None, hosts, [])
    figures = [expected(c, concurrency, hosts) for c in curves]
    by_stack = {f.stack: f for f in figures}
    mine = by_stack.get(current)
    load = f"at {concurrency:.1f} requests in flight" + (f" over {hosts} hosts" if hosts > 1 else "")
    if mine is None or mine.tok_s is None:
        return Recommendation(current, STAY, current, f"no figure for the serving stack {current} {load}: "
                              f"nothing to compare it with ({mine.detail if mine else 'not among the stacks'})",
                              concurrency, hosts, figures)
    others = sorted(((f.tok_s, f) for f in figures if f.stack != current and f.tok_s is not None), key=lambda rated: -rated[0])
    best_tok_s, best = others[0] if others else (None, None)
    if best is None or best_tok_s is None or best_tok_s <= mine.tok_s:
        return Recommendation(current, STAY, current, f"{mine.strategy} gives the most {load}: {_tps(mine.tok_s)} tok/s "
                              f"({mine.detail})", concurrency, hosts, figures)
    lead = (best_tok_s / mine.tok_s - 1) * 100
    versus = (f"{best.strategy} {_tps(best.tok_s)} tok/s ({best.detail}) vs {mine.strategy} {_tps(mine.tok_s)} "
              f"({mine.detail}) {load}, +{lead:.0f} %")
    if lead < policy.hysteresis_percent:
        return Recommendation(current, STAY, current, f"{versus}: within the {policy.hysteresis_percent:g} % hysteresis",
                              concurrency, hosts, figures)
    cost = (costs or {}).get(best.stack) or Cost(policy.switch_seconds, "configured",
                                                 f"{policy.switch_seconds / 60:g} min a host, autoswitch.switchMinutes")
    batches = math.ceil(hosts / max(1, batch_size))
    roll = cost.seconds * batches
    lost = mine.tok_s * cost.seconds
    gained = (best_tok_s - mine.tok_s) * max(0.0, policy.horizon_seconds - roll)
    net = gained - lost
    priced = (f"over the next {policy.horizon_seconds / 60:g} min it gains {gained:,.0f} tokens after a roll of "
              f"{roll / 60:.0f} min and the switch costs {lost:,.0f} ({cost.basis}: {cost.text or f'{cost.seconds:.0f} s'})")
    if net <= 0:
        return Recommendation(current, STAY, current, f"{versus}; {priced}: the gain does not pay for the switch",
                              concurrency, hosts, figures, net, lost, cost)
    if last_switch_at is not None and now - last_switch_at < policy.min_dwell_seconds:
        wait = policy.min_dwell_seconds - (now - last_switch_at)
        return Recommendation(current, STAY, current, f"{versus}; {priced}; but the last switch was "
                              f"{(now - last_switch_at) / 60:.0f} min ago (minimum dwell {policy.min_dwell_seconds / 60:g} "
                              f"min: {wait / 60:.0f} min to go)", concurrency, hosts, figures, net, lost, cost)
    return Recommendation(current, SWITCH, best.stack, f"{versus}; {priced}: net +{net:,.0f} tokens",
                          concurrency, hosts, figures, net, lost, cost)


def curves_from(comparison: Comparison, estimates: Optional[dict[str, dict[int, float]]] = None,
                strategies: Optional[dict[str, str]] = None) -> list[Curve]:
    """The curves of a `compare` comparison (core/compare.py), in its order; `estimates`: the
    advisor's tok/s by concurrency per stack (also for stacks without results); `strategies`: a
    name for stacks with no result."""
    estimates = estimates or {}
    out = []
    for s in comparison.series:
        out.append(Curve(s.stack, s.strategy, {c: Level(p.level.output_throughput, p.level.median_ttft_ms,
                                                         p.level.median_itl_ms) for c, p in s.points.items()},
                         dict(estimates.get(s.stack, {})), s.rehearsal))
    have = {c.stack for c in out}
    for stack, points in estimates.items():
        if stack not in have:
            out.append(Curve(stack, (strategies or {}).get(stack, stack.upper()), {}, dict(points)))
    return out
