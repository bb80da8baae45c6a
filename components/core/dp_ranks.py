"""Every DP rank generates: the per-rank verdict. Pure.

With dp_size > 1 SGLang's /health_generate passes as soon as any rank answers, so a wedged rank
(SGLang PR 32949's production case) stays green while requests routed to it hang. The probe asks
each rank itself: a one-token /generate with `routed_dp_rank` (SGLang sends it to that rank; out of
range is a 400), with a deadline. A rank that does not answer in time, or answers with an error, is
`unhealthy: dp rank k`. /server_info's internal_states (one entry per DP rank) must list every rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .readiness import READY, UNHEALTHY

PROBE_TIMEOUT = 20.0  # SGLang's own health-check timeout (SGLANG_HEALTH_CHECK_TIMEOUT)


def probe_request(rank: int) -> dict[str, Any]:
    """The /generate body asking DP rank `rank` for one token."""
    return {"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}, "routed_dp_rank": rank}


@dataclass(frozen=True)
class RankProbe:
    rank: int
    status: int           # HTTP status; 0 when no answer came before the deadline
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class RanksVerdict:
    outcome: str          # ready or unhealthy
    reason: str
    dead: tuple[int, ...] = ()


def judge(dp_size: int, probes: list[RankProbe], internal_states: Optional[list[Any]] = None,
          timeout: float = PROBE_TIMEOUT) -> RanksVerdict:
    if dp_size <= 1:
        return RanksVerdict(READY, "one DP rank: /health_generate already asks it")
    by_rank = {p.rank: p for p in probes}
    problems: list[tuple[int, str]] = []
    for rank in range(dp_size):
        p = by_rank.get(rank)
        if p is None:
            problems.append((rank, "was not probed"))
        elif p.status == 0:
            problems.append((rank, f"did not answer a generation routed to it within {timeout:g} s "
                                   f"(/generate routed_dp_rank={rank})" + (f": {p.error}" if p.error else "")))
        elif p.status != 200:
            problems.append((rank, f"answered a generation routed to it with HTTP {p.status}"
                                   + (f": {p.error}" if p.error else "")))
    if internal_states is not None:
        listed = {s.get("dp_rank", i) for i, s in enumerate(internal_states) if isinstance(s, dict)}
        for rank in range(dp_size):
            if rank not in listed and rank not in {r for r, _ in problems}:
                problems.append((rank, "is missing from /server_info internal_states"))
    if not problems:
        return RanksVerdict(READY, f"all {dp_size} DP ranks generate (one token each, slowest "
                                   f"{max(p.seconds for p in probes):.2f} s)")
    problems.sort()
    text = "; ".join(f"dp rank {rank} {what}" for rank, what in problems)
    return RanksVerdict(UNHEALTHY, f"unhealthy: {text}", tuple(r for r, _ in problems))
