"""Prefetched reads: results of read-only requests started ahead of the resource that needs them.

On a refresh the engine reads the host one resource after the other (each waits for the
resources it depends on): host facts, then CUDA and the venv, then the two files, then the
service, then readiness. The host-facts resource knows (from the program) every read the later
ones will make, and starts them at once, concurrently, on its connection (`ssh.prefetch`); the
results wait here until the resource that makes the very same request takes them.

The rules, so that a prefetched result is never something the real read would not have seen:

- a result is served to the exact same request only (same target, same command line or same
  file path and operation), and only once (consumed on use) -- except a snapshot that several
  providers read in one run (what serves on the host, `reads.serving`): that request says
  `reuse`, its first read is remembered (`remember`) and served again (`take(keep=True)`) under
  every other rule here, so a switch's preview reads it once, not three times;
- any change to the host through the transport (a file written or removed, any command not
  marked as a read, the switch lock) clears the target's results first, and results of reads
  that were in flight during a change are discarded, so nothing read before a change is ever
  served after it; while a change runs, nothing is served or stored;
- a result whose read started more than `max_age` seconds ago is not served;
- a read still in flight is waited for (until it would be too old), then given up;
- a prefetch that failed (timeout, lost connection, an error) leaves nothing: the real read
  runs as if there had been no prefetch, and only its own errors surface; a command's result
  without an exit status (its connection dropped under it) is such a failure, never stored.

No I/O here: jobs are callables given by the transport (`ssh.py`), so the rules are tested
with a fake one (tests/test_prefetch.py).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Hashable, Iterable

# Seconds a prefetched result stays servable, counted from the moment its read started.
MAX_AGE = 5.0
# Prefetch reads in flight at once per host (each holds an SSH session on that host's connection;
# the transport keeps a connection's sessions under sshd's limit itself, channels.MAX_CHANNELS). Per
# host, not per process: the hosts of a fleet are read at once, none waits behind another's reads.
WORKERS = 4

MISS = object()  # take(): nothing to serve, make the real read

Job = tuple[list[Hashable], Callable[[], dict]]


def _complete(value: Any) -> bool:
    """A command's result counts only with its exit status: one without (the transport's -1 or
    None, a connection lost under the command) may hold cut-short output, so it is never stored."""
    rc = getattr(value, "rc", 0)
    return isinstance(rc, int) and rc >= 0


class _Entry:
    __slots__ = ("state", "value", "queued", "started", "max_age")

    def __init__(self, queued: float):
        self.state = "pending"  # pending -> done (or removed)
        self.value: Any = None
        self.queued = queued
        self.started: float | None = None
        self.max_age: float | None = None  # None: the cache's own


class ReadCache:
    """Per-process store of prefetched read results, keyed by (scope, key): scope is the host
    (what a change invalidates), key the exact request."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_age: float = MAX_AGE, workers: int = WORKERS):
        self._clock = clock
        self.max_age = max_age
        self.workers = workers
        self._cond = threading.Condition()
        self._entries: dict[tuple, _Entry] = {}
        self._generation: dict[Hashable, int] = {}
        self._changing: dict[Hashable, int] = {}
        self._activity: dict[Hashable, int] = {}
        self._window: dict[Hashable, float] = {}
        # per scope: the jobs waiting, each its entries (key -> entry) and the read that fills them
        self._queues: dict[Hashable, deque[tuple[dict[Hashable, _Entry], Callable[[], Any]]]] = {}
        self._running: dict[Hashable, int] = {}
        self.stats = {"queued": 0, "stored": 0, "served": 0, "discarded": 0, "seeded": 0}
        self._listeners: list[Callable[[Hashable], None]] = []

    # --- prefetching -------------------------------------------------------------------------
    def prefetch(self, scope: Hashable, jobs: Iterable[Job]) -> int:
        """Queue `jobs` (keys, fn): fn() returns {key: result} for the keys it could read and
        raises (or leaves a key out) for the rest. Keys already pending or held are not read
        again. Returns the number of jobs queued."""
        with self._cond:
            if self._changing.get(scope):
                return 0
            now = self._clock()
            queued = 0
            for keys, fn in jobs:
                fresh = {k: _Entry(now) for k in dict.fromkeys(keys) if (scope, k) not in self._entries}
                if not fresh:
                    continue
                for k, e in fresh.items():
                    self._entries[(scope, k)] = e
                self._queues.setdefault(scope, deque()).append((fresh, fn))
                queued += 1
            self.stats["queued"] += queued
            queue = self._queues.get(scope) or deque()
            for _ in range(min(self.workers - self._running.get(scope, 0), len(queue))):
                self._running[scope] = self._running.get(scope, 0) + 1
                try:
                    # Daemon threads: a read hung on a frozen connection never holds the process up.
                    threading.Thread(target=self._work, args=(scope,), name="gpu-serving-prefetch", daemon=True).start()
                except RuntimeError:  # no thread to spare: these reads are simply not prefetched
                    self._running[scope] -= 1
                    break
            if not self._running.get(scope):
                while queue:
                    entries, _ = queue.popleft()
                    self._drop(scope, entries)
                return 0
            return queued

    def _work(self, scope: Hashable) -> None:
        exited = False
        queue = self._queues[scope]
        try:
            while True:
                with self._cond:
                    if not queue:
                        self._running[scope] -= 1  # under the same lock as the check: no job is left behind
                        exited = True
                        return
                    entries, fn = queue.popleft()
                    live = {k: e for k, e in entries.items() if self._entries.get((scope, k)) is e}
                    if not live:
                        continue
                    if self._changing.get(scope):
                        self._drop(scope, live)
                        continue
                    generation = self._generation.get(scope, 0)
                    started = self._clock()
                    for e in live.values():
                        e.started = started
                try:
                    results = fn()
                    if not isinstance(results, dict):
                        results = {}
                except Exception:  # noqa: BLE001 - a failed prefetch is only a missed one
                    results = {}
                with self._cond:
                    valid = self._generation.get(scope, 0) == generation and not self._changing.get(scope)
                    for k, e in live.items():
                        if self._entries.get((scope, k)) is not e:
                            continue
                        if valid and k in results and _complete(results[k]):
                            e.state, e.value = "done", results[k]
                            self.stats["stored"] += 1
                        else:
                            del self._entries[(scope, k)]
                            self.stats["discarded"] += 1
                    self._cond.notify_all()
        finally:
            if not exited:  # an unexpected error: free the worker slot (a key it held is given up
                with self._cond:  # by its reader within max_age, as a late read is)
                    self._running[scope] -= 1
                    self._cond.notify_all()

    def _drop(self, scope: Hashable, entries: dict) -> None:
        for k, e in entries.items():
            if self._entries.get((scope, k)) is e:
                del self._entries[(scope, k)]
                self.stats["discarded"] += 1
        self._cond.notify_all()

    # --- the real reads ----------------------------------------------------------------------
    def take(self, scope: Hashable, key: Hashable, keep: bool = False) -> Any:
        """The prefetched result of this exact request (removed: it is served once; `keep`: left
        for the next take of a `reuse` request), or MISS. A read still in flight is waited for,
        until it would be too old to serve."""
        got = self.take_read(scope, key, keep)
        return got if got is MISS else got[0]

    def take_read(self, scope: Hashable, key: Hashable, keep: bool = False) -> Any:
        """`take`, as (result, the moment its read started), or MISS."""
        with self._cond:
            self._touch(scope)
            e = self._entries.get((scope, key))
            if e is None:
                return MISS
            while e.state == "pending" and self._entries.get((scope, key)) is e:
                remaining = e.queued + self.max_age - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._entries.get((scope, key)) is not e:
                return MISS  # cleared by a change, or failed
            max_age = self.max_age if e.max_age is None else e.max_age
            usable = e.state == "done" and not self._changing.get(scope) and e.started is not None \
                and self._clock() - e.started <= max_age
            if not (keep and usable):
                del self._entries[(scope, key)]
            if not usable:
                self.stats["discarded"] += 1
                return MISS
            self.stats["served"] += 1
            return e.value, e.started

    def seed(self, scope: Hashable, key: Hashable, value: Any, started: float, max_age: float) -> bool:
        """Hold a result read by another process of the same run (handoff.py: the preview's,
        given to the update's) as if prefetched here, servable until `max_age` after `started`
        (this clock: CLOCK_MONOTONIC, the same in every process of the machine). Only while
        this process has changed nothing on the host and nothing is held for the request."""
        with self._cond:
            if self._generation.get(scope, 0) or self._changing.get(scope) or (scope, key) in self._entries \
                    or not _complete(value):
                return False
            e = _Entry(started)
            e.state, e.value, e.started, e.max_age = "done", value, started, max_age
            self._entries[(scope, key)] = e
            self.stats["seeded"] += 1
            return True

    def holds(self, scope: Hashable, key: Hashable) -> bool:
        """A result (or a read in flight) is held for this exact request."""
        with self._cond:
            return (scope, key) in self._entries

    def mark(self, scope: Hashable) -> tuple:
        """Taken just before a real read of a `reuse` request starts; given back to `remember`."""
        with self._cond:
            return self._generation.get(scope, 0), self._clock()

    def remember(self, scope: Hashable, key: Hashable, value: Any, mark: tuple) -> bool:
        """Keep a real read's result for the next takes of the same `reuse` request: only when
        nothing changed the host since `mark` (the read's start) and nothing is changing it, and
        for no longer than a prefetched result (counted from the read's start)."""
        generation, started = mark
        with self._cond:
            if self._generation.get(scope, 0) != generation or self._changing.get(scope) \
                    or (scope, key) in self._entries or not _complete(value):
                return False
            e = _Entry(started)
            e.state, e.value, e.started = "done", value, started
            self._entries[(scope, key)] = e
            self.stats["stored"] += 1
            return True

    def touch(self, scope: Hashable) -> None:
        """A real read of the host ran (for the prefetch window, below)."""
        with self._cond:
            self._touch(scope)

    def _touch(self, scope: Hashable) -> None:
        self._activity[scope] = self._activity.get(scope, 0) + 1
        self._window.pop(scope, None)

    # --- changes -----------------------------------------------------------------------------
    def begin_change(self, scope: Hashable) -> None:
        """The host is about to change: drop what was read of it (and what is being read)."""
        with self._cond:
            self._changing[scope] = self._changing.get(scope, 0) + 1
            self._invalidate(scope)

    def end_change(self, scope: Hashable) -> None:
        with self._cond:
            self._changing[scope] = max(0, self._changing.get(scope, 0) - 1)
            self._invalidate(scope)

    def on_change(self, listener: Callable[[Hashable], None]) -> None:
        """Call `listener(scope)` whenever a change of `scope` begins or ends."""
        self._listeners.append(listener)

    def _invalidate(self, scope: Hashable) -> None:
        for listener in self._listeners:
            listener(scope)
        self._generation[scope] = self._generation.get(scope, 0) + 1
        self._touch(scope)
        stale = [k for k in self._entries if k[0] == scope]
        for k in stale:
            del self._entries[k]
        self.stats["discarded"] += len(stale)
        self._cond.notify_all()

    def clear(self, scope: Hashable) -> None:
        """A change that happened at once (begin and end)."""
        self.begin_change(scope)
        self.end_change(scope)

    # --- the prefetch window -----------------------------------------------------------------
    # Under `PULUMI_RUN_PROGRAM` refresh the engine reads the host-facts resource (with its
    # previous outputs) and only then checks the program's new inputs; the later resources'
    # reads come after that check. The window tells the check that it follows such a read
    # closely: open when the host-facts read was the only read of the host while it ran, closed
    # by any other read or change of the host, or after max_age.
    def activity(self, scope: Hashable) -> int:
        with self._cond:
            return self._activity.get(scope, 0)

    def open_window(self, scope: Hashable, activity_before: int, own_reads: int = 1) -> bool:
        with self._cond:
            if self._activity.get(scope, 0) != activity_before + own_reads:
                return False
            self._window[scope] = self._clock()
            return True

    def window_open(self, scope: Hashable) -> bool:
        with self._cond:
            opened = self._window.get(scope)
            return opened is not None and self._clock() - opened <= self.max_age

    # --- introspection (tests, debugging) ----------------------------------------------------
    def held(self, scope: Hashable) -> list:
        with self._cond:
            return [k[1] for k, e in self._entries.items() if k[0] == scope]

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no prefetch job is queued or running (tests)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(self._queues.values()) or any(self._running.values()) \
                    or any(e.state == "pending" for e in self._entries.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True
