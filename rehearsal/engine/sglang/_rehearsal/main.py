"""``python -m sglang.launch_server`` for a rehearsal host: SGLang's startup, without a GPU.

Phases, as SGLang goes through them:
  1. parse the command line (argparse errors: exit 2);
  2. read <model-path>/config.json and rehearsal-checkpoint.json, list the GPUs (nvidia-smi +
     CUDA_VISIBLE_DEVICES) and resolve the server args with SGLang's rules;
  3. "start the schedulers": every rank needs a visible GPU, the model must split over the layout;
  4. "load weights" for $REHEARSAL_LOAD_SECONDS with the port closed;
  5. size the KV pool (mem_fraction_static covers weights + KV pool; "Not enough memory" if not);
  6. bind the HTTP port, warm up for $REHEARSAL_WARMUP_SECONDS (/health answers 503), then log
     "The server is fired up and ready to roll!".
With --nnodes > 1, step 3 includes the rendezvous of every node (rendezvous.py): node 0 listens on
the --dist-init-addr port, the others connect to it; all load in step; node 0 serves the HTTP
API for the whole world while nodes >= 1 run SGLang's dummy health server (200 to /health and
/health_generate whatever happens). A node that goes away fails the others.
SIGTERM or SIGINT stops it cleanly (exit 0). Faults are injected with $REHEARSAL_FAULT
(see FAULTS below). Nothing here pretends to be SGLang: the version says "rehearsal".
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from sglang.version import __version__
from sglang._rehearsal import answers as answers_mod
from sglang._rehearsal import args as cli
from sglang._rehearsal import checkpoint
from sglang._rehearsal import disagg
from sglang._rehearsal import faults
from sglang._rehearsal import gpus as gpu_mod
from sglang._rehearsal import info
from sglang._rehearsal import loading
from sglang._rehearsal import metrics
from sglang._rehearsal import rendezvous as rdv
from sglang._rehearsal import rules
from sglang._rehearsal.ranks import DpRanks
from sglang._rehearsal.shutdown import Shutdown
from sglang._rehearsal.performance import Layout, PerformanceModel, interconnect_from_topology, pair_without_nvlink
from sglang._rehearsal.rules import GiB, MiB, Refusal
from sglang._rehearsal.server import DummyHealthServer, EngineHTTPServer, new_request_id, serve

FAULTS = faults.FAULTS  # what $REHEARSAL_FAULT can name (faults.py)
DEFAULT_WARMUP_SECONDS = 1.0
# torch.distributed's default timeout for an NCCL process group (SGLang passes --dist-timeout,
# None by default): the rendezvous of a multi-node world waits this long for the other nodes.
DEFAULT_RENDEZVOUS_SECONDS = 600.0
DEFAULT_STATE_DIR = "/run/rehearsal-gpu"
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class Log:
    """SGLang's log shape: ``[YYYY-mm-dd HH:MM:SS<rank prefix>] message`` on stderr."""

    def __init__(self, level: str = "info"):
        self.level = LEVELS.get(str(level).lower(), 20)
        self.prefix = ""
        self.lock = threading.Lock()

    def emit(self, level: int, message: str, prefix: str | None = None):
        if level < self.level:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        tag = self.prefix if prefix is None else prefix
        with self.lock:
            for line in str(message).split("\n"):
                sys.stderr.write(f"[{stamp}{tag}] {line}\n")
            sys.stderr.flush()

    def info(self, message, rank=False):
        self.emit(20, message, None if rank else "")

    def warning(self, message, rank=False):
        self.emit(30, message, None if rank else "")

    def error(self, message, rank=False):
        self.emit(40, message, None if rank else "")

    def access(self, client, method, path, code):
        phrase = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(code, "")
        self.emit(20, f'INFO:     {client[0]}:{client[1]} - "{method} {path} HTTP/1.1" {code} {phrase}', "")


class Stop(Exception):
    """SIGTERM/SIGINT arrived while starting: leave cleanly."""


class Engine:
    def __init__(self, args, model, env, log):
        self.args, self.model, self.env, self.log = args, model, env, log
        self.fault = faults.parse(env.get("REHEARSAL_FAULT"))
        self.fault_arg = self.fault.arg
        self.stop = threading.Event()
        self.exit_code = 0
        self.state = "starting"
        self.requests_served = 0
        self.lock = threading.Lock()
        self.started_at = time.time()
        self.plan = None
        self.layout = {}
        self.used_gpus = []
        self.visible = []
        self.gpu_count = 0
        self.server = None
        self.usage_file = None
        self.log_health = env.get("REHEARSAL_LOG_HEALTH", "1") != "0"
        self.seconds_per_token = float(env.get("REHEARSAL_SECONDS_PER_TOKEN") or 0)
        # Pacing: the performance model (default), a fixed REHEARSAL_SECONDS_PER_TOKEN, or none.
        self.pacing = env.get("REHEARSAL_PERFORMANCE", "model")
        self.perf = PerformanceModel.load() if self.pacing == "model" and not self.seconds_per_token else None
        self.perf_layout = None
        self.running = 0  # requests between prefill and their last token
        self.declared_ep_size = None
        # Multi-node: node 0's listener and links, or a node's link to node 0.
        self.rdv_server = None
        self.rank0_link = None
        self.nodes: list[dict] = []        # every node of the world as node 0 saw it join
        self.world_free_mib = None         # the smallest free GPU memory of the world
        self.lost_reason = None            # a peer node went away (set once)
        # Issue 39/40: answers from the weights, DP ranks, SGLang's stop, metrics, the start model.
        self.answers = None
        self.ranks = DpRanks(args.dp_size, self.fault_arg if self.fault == "dead_dp_rank" else None)
        self.shutdown = Shutdown(self)
        self.draining = False
        self.stats = metrics.Stats()
        self.in_flight: dict = {}          # request id -> its result, from arrival to answer
        self.load_plan = None
        self.start_phases: dict = {}       # seconds of each start phase, as the journal lines say
        self.clock = time.monotonic
        # Issue 41: prefill/decode disaggregation (disagg.py), None for an ordinary server.
        self.pd = disagg.Disaggregation(self) if args.disaggregation_mode != "null" else None

    # ------------------------------------------------------------------ HTTP-facing behaviour
    @property
    def dp_ranks(self) -> int:
        return self.args.dp_size

    def health_generate(self) -> bool:
        if self.draining or self.state == "stopping":
            self.log.info("Health check request received during shutdown. Returning 503.")
            return False
        if self.state != "ready":
            return False
        if self.fault == "health_fail_after_ready":
            self.log.error("Health check failed. Server couldn't get a response from detokenizer for last "
                           f"{self.env.get('SGLANG_HEALTH_CHECK_TIMEOUT', '20')} seconds. "
                           "(rehearsal fault health_fail_after_ready)")
            return False
        return True  # the fake one-token generation always answers

    def generate(self, prompt_tokens: int, max_new_tokens: int, routed=None):
        """Checks a request the way the tokenizer manager does; returns a result or an error text."""
        if self.state not in ("warmup", "ready", "unhealthy"):
            return "The server is not ready."
        refusal = self.ranks.check_routed(routed)
        if refusal:
            return refusal
        if prompt_tokens >= self.plan.max_req_input_len:
            return (f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                    f"({self.args.context_length} tokens).")
        if prompt_tokens + max_new_tokens > self.args.context_length:
            return (f"Requested token count exceeds the model's maximum context length of "
                    f"{self.args.context_length} tokens. You requested a total of "
                    f"{prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from the input "
                    f"messages and {max_new_tokens} tokens for the completion. Please reduce the number "
                    "of tokens in the input messages or the completion to fit within the limit.")
        return {"id": new_request_id(), "prompt_tokens": prompt_tokens, "completion_tokens": max_new_tokens,
                "started": time.time(), "dp_rank": self.ranks.assign(routed)}

    def answer(self, result: dict, prompt_ids: list):
        """The request's greedy continuation from the weights (answers.py); garbage under wrong_tokens."""
        ids, lps = self.answers.continue_greedy(prompt_ids, result["completion_tokens"])
        result.update(prompt_ids=list(prompt_ids), output_ids=ids, output_lps=lps)

    def requests_in_flight(self) -> list:
        with self.lock:
            return sorted(self.in_flight)

    def used_tokens(self, rank: int) -> int:
        """KV tokens held on a DP rank: the prompts and outputs of its requests in flight."""
        with self.lock:
            return sum(r["prompt_tokens"] + r["completion_tokens"] for r in self.in_flight.values()
                       if r.get("dp_rank", 0) == rank)

    def emit_token(self, result: dict):
        result["emitted"] = result.get("emitted", 0) + 1
        self.stats.token(result, time.time())
        self.ranks.token(result.get("dp_rank", 0))

    @contextlib.contextmanager
    def decoding(self, result: dict):
        """One request from prefill to its last token: it counts as running meanwhile, so the
        pace of every stream follows the concurrency (performance.py)."""
        rank = result.get("dp_rank", 0)
        with self.lock:
            self.running += 1
            self.in_flight[result["id"]] = result
        self.ranks.started(rank)
        try:
            if self.ranks.is_dead(rank):
                self.ranks.hang(rank, self.stop)  # the wedged rank never answers; a stop cuts it
                raise ConnectionAbortedError(f"DP rank {rank} is wedged (rehearsal fault dead_dp_rank)")
            if self.perf and self.perf_layout and "kv_received" not in result:  # a decode server got it prefilled
                time.sleep(self.perf.prefill_ms(self.perf_layout, self.model.num_layers, result["prompt_tokens"]) / 1000)
            if "pd_transfer" in result:
                result.pop("pd_transfer")()  # a prefill server sends the KV cache it just made
            yield
        finally:
            self.ranks.finished(rank)
            with self.lock:
                self.running -= 1
                self.in_flight.pop(result["id"], None)
            result["latency"] = round(time.time() - result["started"], 4)
            self.stats.finished(result, time.time())
            self.shutdown.wake.set()

    def token_step(self, result: dict | None = None) -> float:
        """Seconds a token takes now: the fixed pace or the performance model's, slowed by the
        speed faults. What token_delay waits, and what /server_info reports (one figure)."""
        if self.seconds_per_token:
            step = self.seconds_per_token
        elif self.perf and self.perf_layout:
            step = self.perf.round_ms(self.perf_layout, self.model.num_layers, self.running) / 1000
        else:
            step = 0.0
        return self.slowed(step, result)

    def token_delay(self, result: dict | None = None):
        """Wait until the request's next token is due. Due times are kept per request (not a
        sleep per token), so the time spent writing chunks does not slow the modelled pace."""
        step = self.token_step(result)
        if not step:
            return
        if result is None:
            time.sleep(step)
            return
        now = time.monotonic()
        due = max(result.get("due", now), now - step) + step  # never catch up more than one step
        result["due"] = due
        if due > now:
            time.sleep(due - now)

    def slowed(self, step: float, result) -> float:
        """The itl_factor and slow_drain faults' pace (faults.py)."""
        if self.fault == "itl_factor":
            step *= self.fault_arg
        if self.fault == "slow_drain" and self.draining and result is not None:
            left = max(1, int(result.get("completion_tokens", 1)) - int(result.get("emitted", 0)))
            end = self.shutdown.drain_started + self.fault_arg
            step = max(step, (end - self.clock()) / left)
        return max(step, 0.0)

    def decode_all(self, results: list):
        """Non-streaming requests (one, or a batch decoded together) take as long as their streams would."""
        with contextlib.ExitStack() as stack:
            for result in results:
                stack.enter_context(self.decoding(result))
            longest = max(r["completion_tokens"] for r in results)
            pace: dict = {}
            for step in range(longest):
                pace.update(completion_tokens=longest, emitted=step)
                self.token_delay(pace)
                for r in results:
                    if step < r["completion_tokens"]:
                        self.emit_token(r)

    def read_topology(self) -> str:
        """``nvidia-smi topo -m`` ("" when it cannot be read: no NVLink is then assumed)."""
        binary = self.env.get("REHEARSAL_NVIDIA_SMI") or "nvidia-smi"
        try:
            proc = subprocess.run([binary, "topo", "-m"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    def read_interconnect(self) -> str:
        return interconnect_from_topology(self.read_topology(), [g.index for g in self.used_gpus])

    def after_request(self):
        with self.lock:
            self.requests_served += 1
            served = self.requests_served
        if self.fault == "die_after_requests" and served >= self.fault_arg:
            self.crash("RuntimeError", f"rehearsal fault die_after_requests:{self.fault_arg}: the scheduler "
                                       f"died after {served} generation requests", prefix=True)
            self.exit_code = 1
            self.stop.set()

    def reported_ep_size(self) -> int:
        if self.fault != "rewrite_layout":
            return self.args.ep_size
        return 1 if self.args.ep_size != 1 else max(self.args.tp_size, 2)

    def server_info(self) -> dict:
        return info.server_info(self)

    def performance_info(self) -> dict:
        return info.performance_info(self)

    def model_info(self) -> dict:
        return info.model_info(self)

    # ------------------------------------------------------------------ failure output
    def crash(self, exc_type: str, message: str, note: str = "", prefix: bool = True, where: str = "Scheduler"):
        """Log a failure shaped like SGLang's: a traceback ending in the exception SGLang raises."""
        text = f"{exc_type}: {message}" if message else exc_type
        lines = [f"{where} hit an exception: Traceback (most recent call last):",
                 '  File "<sglang-rehearsal>", in <an SGLang startup rule>', text]
        if note:
            lines.append(f"rehearsal: {note}")
        self.log.emit(40, "\n".join(lines), None if prefix else "")

    def fail(self, refusal: Refusal) -> int:
        if refusal.stage == "args":
            text = f"{refusal.exc_type}: {refusal.message}" if refusal.message else refusal.exc_type
            sys.stderr.write("Traceback (most recent call last):\n"
                             '  File "<sglang-rehearsal>", in ServerArgs.__post_init__\n' + text + "\n")
            if refusal.note:
                sys.stderr.write(f"rehearsal: {refusal.note}\n")
            sys.stderr.flush()
            return 1
        self.crash(refusal.exc_type, refusal.message, refusal.note)
        self.log.error("Received sigquit from a child process. It usually means the child failed.")
        self.log.error("RuntimeError: Initialization failed. Please see the error messages above.")
        return 1

    # ------------------------------------------------------------------ startup
    def wait(self, seconds: float | None):
        """Sleep, but leave at once when asked to stop."""
        if self.stop.wait(seconds):
            raise Stop()

    def rank_prefix(self) -> str:
        """The log prefix of this node's first scheduler (node 1 of TP16 x 2 logs as TP8)."""
        tp_ranks, pp_ranks = rules.node_ranks(self.args)
        tp, pp = tp_ranks.start, pp_ranks.start
        parts = []
        if self.args.enable_dp_attention:
            parts.append("DP0")
        if self.args.pp_size > 1:
            parts.append(f"PP{pp}")
        if self.args.tp_size > 1:
            parts.append(f"TP{tp}")
        if self.args.ep_size > 1:
            parts.append(f"EP{tp // (self.args.tp_size // self.args.ep_size)}")
        return (" " + " ".join(parts)) if parts else ""

    def start(self) -> int:
        args, env, log = self.args, self.env, self.log
        problem = self.fault.check(args) or self.shutdown.problem()
        if problem:
            log.error(f"rehearsal: {problem}")
            return 1
        log.info(f"rehearsal engine sglang-rehearsal {__version__}: SGLang's command line and rules, "
                 "no model and no GPU work")

        try:
            all_gpus = gpu_mod.query(env)
        except gpu_mod.GpuQueryError as exc:
            sys.stderr.write(f"RuntimeError: No CUDA GPUs are available\nrehearsal: {exc}\n")
            return 1
        self.gpu_count = len(all_gpus)
        self.visible = gpu_mod.visible(all_gpus, env.get("CUDA_VISIBLE_DEVICES"))
        capacity = gpu_mod.capacity_mib(self.visible[0]) if self.visible else None
        try:
            for level, message in rules.resolve_args(args, self.model, env, capacity) + disagg.resolve(args):
                log.emit(LEVELS[level], message, "")
        except Refusal as refusal:
            return self.fail(refusal)
        log.info("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in vars(args).items()) + ")")
        if self.fault:
            log.warning(f"rehearsal: fault injected: {self.fault.shown()}")
        log.prefix = self.rank_prefix()
        try:
            try:
                self.launch()
            except Refusal as refusal:
                return self.fail(refusal)
            except Stop:
                if self.lost_reason:
                    self.report_lost()
                    return 1
                log.info("Received SIGTERM while starting. Exiting.")
                return 0
            return self.run() if args.node_rank == 0 else self.run_dummy()
        finally:
            self.leave_world()

    def launch(self):
        args, env, log = self.args, self.env, self.log
        if not self.visible:
            raise Refusal("launch", "RuntimeError", "No CUDA GPUs are available",
                          "CUDA_VISIBLE_DEVICES hides every GPU nvidia-smi lists"
                          if env.get("CUDA_VISIBLE_DEVICES") is not None else "nvidia-smi lists no GPU")
        ids = rules.gpu_ids_for_node(args)
        world = rules.compute_world_size(args)
        if max(ids) >= len(self.visible):
            visible_note = (f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
                            if env.get("CUDA_VISIBLE_DEVICES") is not None else "CUDA_VISIBLE_DEVICES unset")
            dp = "1 (dp attention)" if args.enable_dp_attention else str(args.dp_size)
            raise Refusal("launch", "torch.AcceleratorError", "CUDA error: invalid device ordinal",
                          f"world size {world} = dp {dp} x tp_size {args.tp_size} x pp_size {args.pp_size} "
                          f"needs {len(ids)} GPUs on this node (device ordinals {ids[0]}..{ids[-1]}) but only "
                          f"{len(self.visible)} are visible (nvidia-smi lists {self.gpu_count}; {visible_note}); "
                          "ep_size does not add GPUs")
        self.used_gpus = [self.visible[i] for i in ids]
        began = self.clock()
        if self.pd is not None:
            self.pd.start()  # the bootstrap server opens at launch; its ranks register later
        log.info("Init torch distributed begin.", rank=True)
        if args.nnodes > 1:
            self.join_world()
        self.layout_key = answers_mod.layout_key(args)
        self.load_plan = loading.plan(self.model, args, env, len(self.used_gpus), self.layout_key)
        loading.init_wait(self)
        self.start_phases["init"] = round(self.clock() - began, 3)
        log.info(f"Init torch distributed ends. elapsed={self.clock() - began:.2f} s, mem usage=0.00 GB", rank=True)
        self.answers = answers_mod.for_server(self.model.path, args, env, self.fault.garbles(args), log)
        self.layout = rules.check_model_layout(args, self.model)
        if self.perf and args.node_rank == 0:  # only node 0 generates
            self.perf_layout = Layout.from_args(args, self.read_interconnect(), cross_node=self.cross_node())
            log.info(f"rehearsal: token pace from the performance model: {self.perf_layout}")
        free = [g.free_mib * MiB for g in self.used_gpus]
        # SGLang sizes memory by the smallest free GPU memory of the whole world (a distributed
        # min); a node whose own GPUs have much more fails "unbalanced", as on one node.
        world_free = free + ([self.world_free_mib * MiB] if self.world_free_mib is not None else [])
        oom = None
        try:
            self.plan = rules.plan_memory(args, self.model, world_free, env)
        except Refusal as refusal:
            if refusal.exc_type != "torch.OutOfMemoryError":
                raise
            oom = refusal  # real CUDA OOMs surface partway through loading
        load_seconds = loading.load_seconds(self)
        log.info(f"Load weight begin. avail mem={min(free) / GiB:.2f} GB", rank=True)
        shards = checkpoint.check(args.model_path)  # every shard there and whole, or SGLang's failure
        if self.fault == "hang_during_load":
            self.wait(None)
        if self.fault in ("crash_during_load", "oom_during_load", "crash_after_join", "crash_printing_environment") or oom:
            self.wait(load_seconds / 2)
            if oom:
                raise oom
            if self.fault == "crash_printing_environment":
                raise Refusal("load", "OSError", faults.environment_dump(env))
            if self.fault == "oom_during_load":
                raise Refusal("load", "torch.OutOfMemoryError",
                              "CUDA out of memory. Tried to allocate 2.00 GiB. (rehearsal fault oom_during_load)")
            raise Refusal("load", "RuntimeError",
                          f"CUDA error: an illegal memory access was encountered (rehearsal fault {self.fault})")
        elapsed = loading.load_weights(self)
        log.info(checkpoint.progress_line(shards), rank=True)
        _, pp_ranks = rules.node_ranks(args)
        # This node's GPUs hold its own pipeline stages only.
        weights = max(self.plan.weights_per_gpu[s] for s in pp_ranks)
        dtype = self.model.checkpoint.get('torch_dtype', 'bfloat16')
        log.info(f"Load weight end. elapsed={elapsed:.2f} s, type={self.model.architecture}, dtype=torch.{dtype}, "
                 f"avail mem={(min(free) - weights) / GiB:.2f} GB, mem usage={weights / GiB:.2f} GB.", rank=True)
        for level, message in rules.finish_memory(args, self.plan):
            log.emit(LEVELS[level], message)
        plan = self.plan
        kv_size = plan.max_total_num_tokens * max(plan.kv_bytes_per_token)
        log.info(f"KV Cache is allocated. #tokens: {plan.max_total_num_tokens}, KV size: {kv_size / GiB:.2f} GB", rank=True)
        avail = min(free) - weights - kv_size
        log.info(f"Memory pool end. avail mem={avail / GiB:.2f} GB", rank=True)
        self.write_usage(weights + kv_size)
        if self.pd is not None:
            self.pd.kv_ready()
        graphs = not args.disable_cuda_graph and args.cuda_graph_backend_decode != "disabled"
        a2a_check = None
        if args.moe_a2a_backend in rules.NVLINK_A2A:
            # SGLang makes DeepEP's buffer at the first MoE dispatch: the graph capture (or the warmup).
            def a2a_check():
                rules.check_a2a_links(args, pair_without_nvlink(self.read_topology(), [g.index for g in self.used_gpus]))
        if graphs:
            loading.capture_graphs(self, avail / GiB, during=a2a_check)
        elif a2a_check is not None:
            a2a_check()
        log.info(f"max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size={args.chunked_prefill_size}, "
                 f"max_prefill_tokens={args.max_prefill_tokens}, max_running_requests={plan.max_running_requests}, "
                 f"context_len={args.context_length}, available_gpu_mem={avail / GiB:.2f} GB", rank=True)
        if self.fault == "rewrite_layout":
            log.warning(f"rehearsal fault rewrite_layout: /server_info will report ep_size={self.reported_ep_size()} "
                        f"instead of {args.ep_size}")
        if args.nnodes > 1:
            self.finish_together()

    # ------------------------------------------------------------------ multi-node
    def rendezvous_seconds(self) -> float:
        value = self.env.get("REHEARSAL_RENDEZVOUS_SECONDS")
        if value not in (None, ""):
            return max(float(value), 0.1)
        if self.args.dist_timeout:
            return float(self.args.dist_timeout)
        return DEFAULT_RENDEZVOUS_SECONDS

    def cross_node(self) -> str:
        """The fabric between nodes as NCCL would pick it: InfiniBand unless NCCL_IB_DISABLE."""
        return "tcp" if self.env.get("NCCL_IB_DISABLE", "0") not in ("", "0") else "infiniband"

    def hello(self) -> dict:
        """What a node tells node 0 about itself: its rank, its layout, its GPUs."""
        a = self.args
        return {"node_rank": a.node_rank, "nnodes": a.nnodes, "world_size": rules.compute_world_size(a),
                "tp_size": a.tp_size, "pp_size": a.pp_size, "dp_size": a.dp_size, "ep_size": a.ep_size,
                "enable_dp_attention": a.enable_dp_attention,
                "model": {"architecture": self.model.architecture, "num_hidden_layers": self.model.num_layers,
                          "checkpoint_bytes": self.model.checkpoint.get("checkpoint_bytes")},
                "gpus": len(self.used_gpus), "gpu_name": self.used_gpus[0].name,
                "free_min_mib": min(g.free_mib for g in self.used_gpus), "version": __version__}

    def join_world(self):
        args = self.args
        try:
            host, port = rdv.parse_addr(args.dist_init_addr)
        except ValueError as exc:
            raise Refusal("launch", "ValueError", str(exc), "--dist-init-addr is node 0's address, host:port")
        window = self.rendezvous_seconds()
        deadline = time.monotonic() + window
        try:
            if args.node_rank == 0:
                self.gather_world(port, window, deadline)
            else:
                self.reach_node0(host, port, window, deadline)
        except rdv.RendezvousError as err:
            raise Refusal("launch", err.exc_type, err.message, err.note)

    def gather_world(self, port: int, window: float, deadline: float):
        args, log = self.args, self.log
        world = rules.compute_world_size(args)
        per_node = world // args.nnodes
        expected = set(range(1, args.nnodes))
        if self.fault == "never_join":
            log.warning(f"rehearsal fault never_join: node 0 does not open the rendezvous port {port}", rank=True)
            self.wait(window)
            raise Refusal("launch", "RuntimeError", "rehearsal fault never_join: node 0 never opened its rendezvous port",
                          f"no node could join within {window:g} s")
        self.rdv_server = server = rdv.Server(port, log)
        server.listen()
        missing_text = ", ".join(map(str, sorted(expected)))
        log.info(f"rehearsal: rendezvous of {args.nnodes} nodes (world size {world}, {per_node} GPUs per node) on "
                 f"port {port} (every address); waiting up to {window:g} s for node rank(s) {missing_text}", rank=True)
        missing = server.gather(expected, deadline, self.stop, self.on_hello)
        if self.stop.is_set():
            raise Stop()
        if missing:
            joined = per_node * (args.nnodes - len(missing))
            names = ", ".join(map(str, sorted(missing)))
            raise Refusal("launch", "torch.distributed.DistStoreError",
                          f"Timed out after {int(window) + 1} seconds waiting for clients. {joined}/{world} clients joined.",
                          f"node rank(s) {names} did not join the rendezvous on port {port} within {window:g} s")
        ours = self.hello()
        self.world_free_mib = min([ours["free_min_mib"]] + [hello["free_min_mib"] for _, hello in server.joined.values()])
        self.nodes = [self.node_entry(0, rdv.parse_addr(args.dist_init_addr)[0], ours)]
        for rank, (link, hello) in sorted(server.joined.items()):
            self.nodes.append(self.node_entry(rank, link.peer, hello))
        server.broadcast({"go": {"world_free_min_mib": self.world_free_mib, "nodes": self.nodes}})
        for rank, link in server.links():
            self.watch(link, f"node rank {rank} ({link.peer})")
        where = ", ".join(f"node {n['node_rank']} at {n['address']}" for n in self.nodes)
        log.info(f"rehearsal: every node joined: {where}", rank=True)

    def node_entry(self, rank: int, address: str, hello: dict) -> dict:
        per_node = hello["world_size"] // hello["nnodes"]
        return {"node_rank": rank, "address": address, "gpus": hello["gpus"], "gpu_name": hello["gpu_name"],
                "gpu_ranks": [rank * per_node, (rank + 1) * per_node - 1], "free_min_mib": hello["free_min_mib"]}

    def on_hello(self, rank, hello: dict, address: str):
        """Node 0 checks a joining node: the same world, the same model, a rank of its own."""
        args = self.args
        ours = self.hello()
        if not isinstance(rank, int) or not 1 <= rank < args.nnodes:
            self.refuse_world(f"a node at {address} joined with node rank {rank!r}, not in 1..{args.nnodes - 1}")
        for key in ("nnodes", "world_size", "tp_size", "pp_size", "dp_size", "ep_size", "enable_dp_attention", "model"):
            if hello.get(key) != ours[key]:
                self.refuse_world(f"node rank {rank} ({address}) joined with {key}={hello.get(key)!r}; "
                                  f"node 0 has {key}={ours[key]!r}")
        self.log.info(f"rehearsal: node rank {rank} joined from {address}: {hello.get('gpus')} x {hello.get('gpu_name')}, "
                      f"{hello.get('free_min_mib')} MiB free per GPU", rank=True)

    def refuse_world(self, reason: str):
        self.rdv_server.broadcast_last({"refused": reason})
        raise rdv.RendezvousError("RuntimeError", reason,
                                  "every node must run the same command line but --node-rank; real SGLang hangs or "
                                  "fails in NCCL init on such a world, the rehearsal refuses it at the rendezvous")

    def reach_node0(self, host: str, port: int, window: float, deadline: float):
        args, log = self.args, self.log
        if self.fault == "never_join":
            log.warning(f"rehearsal fault never_join: node {args.node_rank} does not connect to {host}:{port}", rank=True)
            self.wait(window)
            raise Refusal("launch", "torch.distributed.DistNetworkError",
                          f"The client socket has timed out after {int(window * 1000)}ms while trying to connect to "
                          f"({host}, {port}).", "rehearsal fault never_join: this node never tried")
        link = rdv.connect(host, port, deadline, self.stop, log, window)
        if link is None:
            raise Stop()
        self.rank0_link = link
        link.send({"hello": self.hello()})
        link.start()
        log.info(f"rehearsal: node {args.node_rank} connected to node 0 at {host}:{port}; waiting for every node",
                 rank=True)
        # Node 0 answers when every node joined, or gives up at its own deadline (then closes).
        answer = link.wait_for(("go", "refused"), self.stop, deadline + 30)
        if self.stop.is_set():
            raise Stop()
        if answer is None:
            raise Refusal("launch", "torch.distributed.DistNetworkError",
                          "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
                          "shutdown or crash?",
                          f"node 0 at {host}:{port} closed the rendezvous before every node joined "
                          "(it timed out or failed: see its log)")
        if "refused" in answer:
            raise Refusal("launch", "RuntimeError", str(answer["refused"]),
                          "node 0 refused this node at the rendezvous")
        go = answer["go"]
        self.world_free_mib = int(go["world_free_min_mib"])
        self.nodes = list(go.get("nodes") or [])
        self.watch(link, f"node 0 ({host}:{port})")
        log.info(f"rehearsal: every node joined ({args.nnodes} nodes); loading in step with node 0", rank=True)

    def watch(self, link, who: str):
        """From now on a lost link fails this node (a real NCCL communicator fails that way)."""
        link.who = who
        link.on_lost = self.peer_lost
        if link.lost.is_set():
            self.peer_lost(link, link.lost_reason)

    def peer_lost(self, link, reason: str):
        with self.lock:
            if self.lost_reason is not None or self.stop.is_set():
                return  # already failing, or stopping anyway
            self.lost_reason = f"{getattr(link, 'who', link.peer)} is gone: {reason}"
            self.exit_code = 1
        self.stop.set()

    def report_lost(self):
        self.crash("torch.distributed.DistBackendError",
                   "NCCL error: remote process exited or there was a network error", self.lost_reason)
        self.log.error("Received sigquit from a child process. It usually means the child failed.")

    def finish_together(self):
        """Nodes finish loading in step: node 0 serves once every node has loaded."""
        if self.args.node_rank == 0:
            for _, link in self.rdv_server.links():
                if link.wait_for(("loaded",), self.stop) is None:
                    self.check_lost(link)
            self.rdv_server.broadcast({"serving": True})
        else:
            link = self.rank0_link
            link.send({"loaded": self.args.node_rank})
            if link.wait_for(("serving",), self.stop) is None:
                self.check_lost(link)

    def check_lost(self, link):
        if link.lost.is_set():
            self.peer_lost(link, link.lost_reason)
        raise Stop()

    def leave_world(self):
        for closer in (self.rdv_server, self.rank0_link, self.pd):
            if closer is not None:
                closer.close()
        self.rdv_server = self.rank0_link = None

    def load_seconds(self) -> float:
        value = self.env.get("REHEARSAL_LOAD_SECONDS")
        if value not in (None, ""):
            return max(float(value), 0.0)
        # Default: the checkpoint size in GiB / 100 (about 6 s for a 590 GiB checkpoint).
        return float(self.model.checkpoint["checkpoint_bytes"]) / GiB / 100

    def write_usage(self, per_gpu_bytes: float):
        """Tell the simulated nvidia-smi how much memory this engine holds on each of its GPUs."""
        directory = self.env.get("REHEARSAL_GPU_STATE_DIR") or DEFAULT_STATE_DIR
        used = {}
        for g in self.used_gpus:
            reserve = per_gpu_bytes / MiB + 1024  # + CUDA graphs, activations, NCCL buffers
            used[str(g.index)] = int(min(reserve, g.free_mib))
        try:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"used-{os.getpid()}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(), "process_name": sys.executable, "gpus": used}, f)
            os.replace(path + ".tmp", path)
            self.usage_file = path
        except OSError as exc:
            self.log.emit(10, f"rehearsal: cannot record GPU usage in {directory}: {exc}")

    def remove_usage(self):
        if self.usage_file:
            try:
                os.unlink(self.usage_file)
            except OSError:
                pass
            self.usage_file = None

    # ------------------------------------------------------------------ serving
    def run(self) -> int:
        args, log = self.args, self.log
        log.prefix = ""
        try:
            self.server = EngineHTTPServer((args.host, args.port), self)
        except OSError as exc:
            log.error(f"[Errno {exc.errno}] error while attempting to bind on address "
                      f"('{args.host}', {args.port}): {exc.strerror.lower() if exc.strerror else exc}")
            return 1
        serve(self.server)
        self.shutdown.start_scheduler()
        log.info(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
        log.info(f"rehearsal: HTTP server listening on http://{args.host}:{args.port}")
        self.state = "warmup"
        began = self.clock()
        try:
            if not args.skip_server_warmup:
                self.wait(float(self.env.get("REHEARSAL_WARMUP_SECONDS") or DEFAULT_WARMUP_SECONDS))
                if self.pd is not None:
                    self.pd.warmup()  # to the fake bootstrap host: no KV moves
                log.access(("127.0.0.1", 0), "POST", "/generate", 200)
            self.start_phases["warmup"] = round(self.clock() - began, 3)
            self.state = "ready"
            log.info("The server is fired up and ready to roll!")
            self.shutdown.wait()
        except Stop:
            pass
        if self.shutdown.signalled.is_set() or self.shutdown.child_failed:
            # SGLang's stop (shutdown.py): drain, then kill the tree; the process ends there.
            if not self.shutdown.child_failed:
                self.shutdown.drain()
            self.state = "stopping"
            self.stop.set()
            return self.shutdown.exit(0 if self.shutdown.signalled.is_set() else 1)
        self.shutdown.kill_tree()
        if self.lost_reason:
            self.state = "failed"
            self.report_lost()
        if self.exit_code == 0:
            self.state = "stopping"
            log.info("Received SIGTERM. Shutting down.")
        self.server.shutdown()
        self.server.server_close()
        if self.exit_code == 0:
            log.info("rehearsal: server stopped")
        return self.exit_code


    def run_dummy(self) -> int:
        """A node >= 1 once loaded: SGLang's dummy health server on --port (200 to /ping, /health
        and /health_generate whatever happens; no generation), until stopped or node 0 goes away."""
        args, log = self.args, self.log
        log.prefix = ""
        try:
            self.server = DummyHealthServer((args.host, args.port), self)
        except OSError as exc:
            log.error(f"[Errno {exc.errno}] error while attempting to bind on address "
                      f"('{args.host}', {args.port}): {exc.strerror.lower() if exc.strerror else exc}")
            return 1
        serve(self.server)
        log.info(f"Starting dummy health check server at {args.host}:{args.port}")
        self.state = "ready"
        self.stop.wait()
        self.server.shutdown()
        self.server.server_close()
        if self.lost_reason:
            self.report_lost()
            return 1
        log.info("Received SIGTERM. Shutting down.")
        return self.exit_code


def read_model(path: str) -> rules.Model:
    """<model-path>/config.json and rehearsal-checkpoint.json; SGLang-like errors when missing."""
    if not os.path.isdir(path):
        looks_like_repo = (not path.startswith(("/", ".", "~")) and path.count("/") == 1
                           and all(path.split("/")))
        if looks_like_repo:
            raise Refusal("args", "OSError",
                          "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
                          "find them in the cached files. Check your internet connection or see how to run "
                          "the library in offline mode.",
                          f"model path {path!r} is not a directory here; the rehearsal engine has no network "
                          "and needs a model directory (rehearsal/models/<name>)")
        raise Refusal("args", "huggingface_hub.errors.HFValidationError",
                      f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
                      "Use `repo_type` argument if needed.",
                      f"model path {path} does not exist (a local model directory was expected)")
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise Refusal("args", "OSError", f"{path} does not appear to have a file named config.json.")
    checkpoint_path = os.path.join(path, "rehearsal-checkpoint.json")
    if not os.path.isfile(checkpoint_path):
        raise Refusal("args", "FileNotFoundError", f"{checkpoint_path}",
                      "the rehearsal engine needs the declared checkpoint size in rehearsal-checkpoint.json "
                      "(see rehearsal/models/README.md)")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = rules.text_config(json.load(f))
        with open(checkpoint_path, encoding="utf-8") as f:
            checkpoint = json.load(f)
    except ValueError as exc:
        raise Refusal("args", "ValueError", f"invalid JSON in {path}: {exc}")
    for key in ("num_hidden_layers",):
        if key not in config:
            raise Refusal("args", "KeyError", repr(key), f"{config_path} lacks {key}")
    if "checkpoint_bytes" not in checkpoint:
        raise Refusal("args", "KeyError", "'checkpoint_bytes'", f"{checkpoint_path} lacks checkpoint_bytes")
    return rules.Model(path=path, config=config, checkpoint=checkpoint)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = cli.parse(argv)  # exits 2 on a bad command line, like SGLang
    env = dict(os.environ)
    log = Log(args.log_level)
    try:
        model = read_model(args.model_path)
    except Refusal as refusal:
        text = f"{refusal.exc_type}: {refusal.message}"
        sys.stderr.write("Traceback (most recent call last):\n"
                         '  File "<sglang-rehearsal>", in ModelConfig.from_server_args\n' + text + "\n")
        if refusal.note:
            sys.stderr.write(f"rehearsal: {refusal.note}\n")
        return 1
    engine = Engine(args, model, env, log)

    def on_signal(signum, frame):
        engine.shutdown.on_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return engine.start()
    finally:
        engine.remove_usage()
