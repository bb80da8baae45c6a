"""SGLang's stop, as its source does it (tokenizer_manager.py `SignalHandler`, `sigterm_watchdog`;
http_server.py `health_generate`; utils `kill_process_tree`; the `SubprocessWatchdog`).

SIGTERM to the main process (the tokenizer manager's handler, installed at the first request):
- logs `SIGTERM received. signum=None frame=None. Draining requests and shutting down...` and sets
  `gracefully_exit`; from then on /health and /health_generate answer 503 ("Health check request
  received during shutdown. Returning 503."). New generation requests are NOT refused: the
  tokenizer manager takes them like any other, and the drain waits for them too;
- the watchdog drains: while requests remain it logs `Gracefully exiting... Remaining number of
  requests N. Remaining requests remaining_rids=[...].` and looks again 5 s later
  (REHEARSAL_DRAIN_POLL_SECONDS; SGLang notices the signal on the same 5 s timer, the rehearsal
  at once, so an idle server stops without waiting). There is no drain timeout in the released
  source: systemd's TimeoutStopSec bounds it;
- it exits at once, requests in flight cut, when the server is unhealthy ("Signal SIGTERM received
  while health check failed. Force exiting.") or SGL_FORCE_SHUTDOWN is set ("Signal SIGTERM
  received while force shutdown flag set. Force exiting.");
- then `kill_process_tree(os.getpid(), include_parent=True)`: the schedulers, then itself, with
  SIGKILL. systemd then says "Main process exited, code=killed, status=9/KILL" and "Failed with
  result 'signal'": the unit is left `failed` unless it lists SuccessExitStatus=SIGKILL.

The scheduler processes are children. Under KillMode=control-group systemd sends SIGTERM to every
process of the unit at once: the schedulers die (the default action), the SubprocessWatchdog sees
it within its 1 s poll ("Subprocess scheduler_0 (pid=N) crashed with exit code -15. Triggering
SIGQUIT for cleanup..."), the SIGQUIT handler kills the tree, and every request in flight is cut.
Under KillMode=mixed only the main process gets SIGTERM: the schedulers keep generating and the
drain finishes them (docs/drain.md says which unit settings let it drain).

The rehearsal runs one child process for the schedulers. REHEARSAL_EXIT_AFTER_DRAIN chooses how
the process ends after a SIGTERM: `sigkill` (SGLang's: killed by SIGKILL) or `clean` (exit 0,
the default until the serving unit lists SuccessExitStatus=SIGKILL: a unit without it would be
left `failed` after every switch). A crash (the scheduler dies with no stop asked) exits 1 either way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

DEFAULT_POLL_SECONDS = 5.0      # the watchdog's asyncio.sleep(5)
WATCHDOG_INTERVAL = 1.0         # SubprocessWatchdog's poll
EXIT_MODES = ("clean", "sigkill")
# The scheduler stand-in: dies with its parent (PR_SET_PDEATHSIG), otherwise sleeps; SIGTERM
# ends it (the default action, as a released SGLang scheduler).
SCHEDULER = ("import ctypes, os, signal, sys, time\n"
             "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
             "sys.exit(0) if os.getppid() != int(sys.argv[1]) else None\n"
             "while True:\n    time.sleep(3600)\n")


def _truthy(value) -> bool:
    return str(value or "").strip().lower() in ("1", "true")


class Shutdown:
    def __init__(self, engine):
        self.engine = engine
        env = engine.env
        self.signalled = threading.Event()
        self.wake = threading.Event()
        self.child = None
        self.killing = False
        self.child_failed = False
        self.poll = float(env.get("REHEARSAL_DRAIN_POLL_SECONDS") or DEFAULT_POLL_SECONDS)
        self.mode = (env.get("REHEARSAL_EXIT_AFTER_DRAIN") or "clean").strip().lower()
        self.drain_started = None

    def problem(self) -> str:
        if self.mode not in EXIT_MODES:
            return f"REHEARSAL_EXIT_AFTER_DRAIN={self.mode!r}: use one of {', '.join(EXIT_MODES)}"
        return ""

    # ------------------------------------------------------------------ the scheduler process
    def start_scheduler(self):
        self.child = subprocess.Popen([sys.executable, "-c", SCHEDULER, str(os.getpid()), "sglang::scheduler"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        threading.Thread(target=self._watch_scheduler, daemon=True, name="subprocess-watchdog").start()

    def _watch_scheduler(self):
        while not self.engine.stop.wait(WATCHDOG_INTERVAL):
            code = self.child.poll()
            if code is None or code == 0 or self.killing:
                continue
            log = self.engine.log
            log.error(f"Subprocess scheduler_0 (pid={self.child.pid}) crashed with exit code {code}. "
                      "Triggering SIGQUIT for cleanup...")
            log.error("SIGQUIT received. signum=Signals.SIGQUIT, frame=None. It usually means one child failed.")
            self.child_failed = True
            self.engine.stop.set()
            self.wake.set()
            return

    # ------------------------------------------------------------------ the signal
    def on_signal(self, signum):
        engine = self.engine
        if engine.state not in ("warmup", "ready", "unhealthy") or engine.args.node_rank != 0:
            engine.stop.set()  # still starting: the handler is not installed yet, the process just stops
            return
        if not self.signalled.is_set():
            engine.log.warning("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
            engine.draining = True
            self.drain_started = engine.clock()
            self.signalled.set()
            self.wake.set()

    def wait(self):
        """Until a stop is asked (SIGTERM) or the server fails (stop set)."""
        while not (self.signalled.is_set() or self.engine.stop.is_set()):
            self.wake.wait(1.0)
            self.wake.clear()

    def drain(self) -> bool:
        """SGLang's sigterm_watchdog: True when every request finished, False when it force-exits."""
        engine, log = self.engine, self.engine.log
        while True:
            if self.child_failed:
                return False
            rids = engine.requests_in_flight()
            if engine.state == "unhealthy" or engine.fault == "health_fail_after_ready":
                log.error("Signal SIGTERM received while health check failed. Force exiting.")
                return False
            if _truthy(engine.env.get("SGL_FORCE_SHUTDOWN")):
                log.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                return False
            log.info(f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                     f"Remaining requests remaining_rids={rids!r}.")
            if not rids:
                return True
            if self.wake.wait(self.poll):
                self.wake.clear()

    def kill_tree(self):
        """kill_process_tree: the scheduler first (SIGKILL), then this process (by the caller)."""
        self.killing = True
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()

    def exit(self, code: int):
        """End the process the way SGLang's does: after a stop asked by SIGTERM, killed by SIGKILL
        (REHEARSAL_EXIT_AFTER_DRAIN=sigkill) or exit 0 (clean); requests still open are cut."""
        self.kill_tree()
        self.engine.remove_usage()
        sys.stderr.flush()
        if self.mode == "sigkill" and (self.signalled.is_set() or self.child_failed):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(code)
