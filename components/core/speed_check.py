"""The speed check: does a started server generate near its measured speed? Pure.

After the answer check, a short probe (SGLang's own benchmark client, a few concurrency levels,
tens of seconds) measures output tok/s; the baseline is the newest stored `components bench` run
of the same host, layout and model, measured on the same kind of server (a rehearsal engine's
figures never judge a GPU server, nor the reverse). At each concurrency level both measured, the
ratio probe / baseline below readiness.minSpeedRatio (0.7) is `perf_regression`, with both figures
side by side. No baseline, or none at the probed levels: "no baseline: skipped", never one made up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .bench_results import Level, Run

MIN_SPEED_RATIO = 0.7  # a third below the measured speed is a power cap or a x4 link, not noise
PROBE_LEVELS = (1, 8)  # concurrency levels of the probe: one stream, and a small batch


@dataclass(frozen=True)
class SpeedRow:
    concurrency: int
    probe_tok_s: float
    baseline_tok_s: float
    probe_itl_ms: float
    baseline_itl_ms: float

    @property
    def ratio(self) -> float:
        return self.probe_tok_s / self.baseline_tok_s if self.baseline_tok_s > 0 else 0.0

    def line(self) -> str:
        return (f"concurrency {self.concurrency}: {self.probe_tok_s:.1f} tok/s vs {self.baseline_tok_s:.1f} baseline "
                f"(x{self.ratio:.2f}; median ITL {self.probe_itl_ms:.1f} ms vs {self.baseline_itl_ms:.1f} ms)")


@dataclass(frozen=True)
class SpeedVerdict:
    status: str  # "ok", "perf_regression" or "skipped"
    reason: str
    rows: list[SpeedRow] = field(default_factory=list)
    baseline: str = ""  # the baseline run's folder, stack and host

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "baseline": self.baseline,
                "levels": [{"concurrency": r.concurrency, "probe_tok_s": round(r.probe_tok_s, 2),
                            "baseline_tok_s": round(r.baseline_tok_s, 2), "ratio": round(r.ratio, 3),
                            "probe_median_itl_ms": round(r.probe_itl_ms, 2),
                            "baseline_median_itl_ms": round(r.baseline_itl_ms, 2)} for r in self.rows]}


def baseline(runs: list[Run], *, host: str, layout: str, model: str, rehearsal: bool) -> Optional[Run]:
    """The newest run of this host, layout and model, on the same kind of server."""
    same = [(r.time, r) for r in runs if r.host == host and r.layout == layout and r.model == model
            and r.rehearsal == rehearsal and r.time is not None]
    return max(same, key=lambda timed: timed[0])[1] if same else None


def judge(probe: dict[int, Level], base: Optional[Run], min_ratio: float = MIN_SPEED_RATIO) -> SpeedVerdict:
    if not 0 < min_ratio <= 1:
        raise ValueError(f"readiness.minSpeedRatio must be in (0, 1], got {min_ratio}")
    if base is None:
        return SpeedVerdict("skipped", "no baseline: skipped (no bench run of this host, layout and model; "
                                       "run `python -m components bench` once to have one)")
    common = sorted(set(probe) & set(base.levels))
    where = f"{base.stack} {base.folder} on {base.host}"
    if not common:
        return SpeedVerdict("skipped", f"no baseline at the probed concurrency {sorted(probe)}: skipped "
                                       f"(the baseline {where} measured {sorted(base.levels)})", baseline=where)
    rows = [SpeedRow(c, probe[c].output_throughput, base.levels[c].output_throughput,
                     probe[c].median_itl_ms, base.levels[c].median_itl_ms) for c in common]
    slow = [r for r in rows if r.ratio < min_ratio]
    if slow:
        return SpeedVerdict("perf_regression", f"slower than {min_ratio:g} x the baseline ({where}): "
                            + "; ".join(r.line() for r in slow), rows, where)
    return SpeedVerdict("ok", f"at speed (baseline {where}): " + "; ".join(r.line() for r in rows), rows, where)


def action(verdict: SpeedVerdict, on_regression: str) -> str:
    """What an `up` does with the verdict: "rollback" only for a regression in rollback mode."""
    if on_regression not in ("warn", "rollback"):
        raise ValueError(f"readiness.onPerfRegression must be warn or rollback, got {on_regression!r}")
    return "rollback" if verdict.status == "perf_regression" and on_regression == "rollback" else "keep"
