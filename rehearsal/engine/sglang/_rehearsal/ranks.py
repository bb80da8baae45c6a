"""Data-parallel ranks: which rank a request runs on, what each rank reports, and a wedged rank.

SGLang's data-parallel controller hands each request to a DP rank: the one named by the request's
`routed_dp_rank` (out of range: ValueError, 400), else round robin. Each rank's scheduler reports
its own load (`/get_load`, `/server_info` internal_states, the per-scheduler metrics).

The `dead_dp_rank:K` fault wedges rank K the way production reports describe it (SGLang PR 32949:
"one DP rank's generation stalled, /health and /health_generate stayed 200"): a request given to
K never answers (the client times out; a stop cuts it), while the health probe passes because
another rank answers it. The rehearsal sends the health probe to a live rank; SGLang dispatches it
like any request, so an idle SGLang fails the probe on K's turns and passes on the others'.
A probe of one rank is a /generate with routed_dp_rank=K (released SGLang); PR 32949 proposes
`/health_generate?dp_rank=K` for the same.
"""
from __future__ import annotations

import threading
import time
from collections import deque

THROUGHPUT_WINDOW = 5.0  # seconds of generated tokens behind a rank's last_gen_throughput


class DpRanks:
    def __init__(self, dp_size: int, dead: int | None = None):
        self.size = max(1, int(dp_size))
        self.dead = dead
        self.lock = threading.Lock()
        self.next = 0
        self.running = [0] * self.size
        self.stuck = [0] * self.size
        self.tokens: list[deque] = [deque() for _ in range(self.size)]

    def check_routed(self, routed) -> str:
        """SGLang's refusal of a routed_dp_rank ("" when it is fine or absent)."""
        if routed is None:
            return ""
        try:
            rank = int(routed)
        except (TypeError, ValueError):
            return f"routed_dp_rank={routed!r} is not an integer"
        if self.size <= 1 and rank == 0:
            return ""
        if rank < 0 or rank >= self.size:
            return f"routed_dp_rank={rank} out of range [0, {self.size})"
        return ""

    def assign(self, routed=None) -> int:
        with self.lock:
            if routed is not None and self.size > 1:
                return int(routed)
            rank = self.next
            self.next = (self.next + 1) % self.size
            return rank

    def health_rank(self) -> int:
        """A live rank for the health probe (see the module docstring)."""
        return next((r for r in range(self.size) if r != self.dead), 0)

    def is_dead(self, rank: int) -> bool:
        return self.dead is not None and rank == self.dead

    def hang(self, rank: int, stop: threading.Event):
        """A request on the wedged rank: it never answers; a stop of the server cuts it."""
        with self.lock:
            self.stuck[rank] += 1
        try:
            stop.wait()
        finally:
            with self.lock:
                self.stuck[rank] -= 1

    def started(self, rank: int):
        with self.lock:
            self.running[rank] += 1

    def finished(self, rank: int):
        with self.lock:
            self.running[rank] -= 1

    def token(self, rank: int):
        now = time.monotonic()
        with self.lock:
            q = self.tokens[rank]
            q.append(now)
            while q and q[0] < now - THROUGHPUT_WINDOW:
                q.popleft()

    def throughput(self, rank: int) -> float:
        now = time.monotonic()
        with self.lock:
            return round(sum(1 for t in self.tokens[rank] if t >= now - THROUGHPUT_WINDOW) / THROUGHPUT_WINDOW, 2)

    def load(self, rank: int) -> int:
        """Requests the rank runs now (a wedged rank's stuck ones included)."""
        with self.lock:
            return self.running[rank]
