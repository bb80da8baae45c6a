"""Prefill/decode disaggregation (--disaggregation-mode prefill|decode), as SGLang runs it
(python/sglang/srt/disaggregation/: prefill.py, decode.py, common/conn.py; server_args.py;
environ.py), with the KV cache really crossing TCP between the two servers (kvlink.py).

- Start: server_args' rules (`resolve`); a prefill server opens its bootstrap server on
  --disaggregation-bootstrap-port at launch and registers its ranks there once its KV pool is
  allocated (PUT /route, 5 tries); a decode server checks each prefill server it learns of with
  GET /health every SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL s (at least 2); after
  SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE misses the requests it is receiving from that
  server fail ("Lost connection with prefill instance (bootstrap_addr: ...)") and the next one
  looks the server up again.
- A request carries bootstrap_host/port/room (the router sets them, the same on both sides).
  The prefill server waits for the decode side's KV indices (its connection for the room) up to
  SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (300 s), prefills, writes the KV cache (prompt tokens x
  the model's KV bytes a token) and answers with one token. The decode server looks the prefill
  server up (GET /route, 15 tries), connects to the rank's KV port, reads the KV cache within
  SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s), then decodes. Failures answer 500 with SGLang's
  messages ("Prefill bootstrap failed ...", "Decode handshake failed ...", "Decode transfer failed
  ...", "Prefill transfer failed ...").
- Warm-up and /health_generate use SGLang's fake bootstrap host 2.2.2.2: no KV moves, so a green
  pair has not proven the transfer. Real transfers show on the prefill side's /metrics
  (`sglang:kv_transfer_total_mb` and friends, fake ones skipped as SGLang skips them) and on the
  decode side's (`sglang:per_stage_req_latency_seconds{stage="decode_transferred"}`; the fake ones
  count under stage="fake_output"); the rehearsal's own byte counts are in /server_info's
  `rehearsal.disaggregation`.
The rehearsal moves one copy of a request's KV (attention rank 0's); SGLang's other ranks move
theirs beside it.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from sglang._rehearsal import kvlink
from sglang._rehearsal.metrics import Histogram, _labels, _num
from sglang._rehearsal.rules import Refusal

FAKE_BOOTSTRAP_HOST = "2.2.2.2"       # disaggregation/utils.py
ENSURE_RETRIES = 15                   # decode.py: _max_ensure_retries
ENSURE_INTERVAL = 0.2                 # the rehearsal's pause between them (SGLang: a scheduler loop)
STAGE_BUCKETS = tuple(0.001 * 1.62 ** i for i in range(30))   # exponential_buckets(0.001, 1.62, 30)
MB_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
SPEED_BUCKETS = (0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 400)


class TransferFailed(Exception):
    """A request's KV transfer failed: the message is the one SGLang aborts the request with."""


def resolve(args) -> list[tuple[str, str]]:
    """server_args._handle_disaggregation."""
    mode = args.disaggregation_mode
    if mode == "decode":
        if args.disaggregation_decode_tp is not None:
            raise Refusal("args", "AssertionError", "Cannot set --disaggregation-decode-tp for the decode engine.")
        if args.disaggregation_decode_dp is not None:
            raise Refusal("args", "AssertionError", "Cannot set --disaggregation-decode-dp for the decode engine.")
        args.disable_radix_cache = True
        return [("warning", "KV cache is forced as chunk cache for decode server")]
    if mode == "prefill":
        if args.disaggregation_decode_tp is None:
            args.disaggregation_decode_tp = args.tp_size
        if args.disaggregation_decode_dp is None:
            args.disaggregation_decode_dp = args.dp_size
        args.disaggregation_prefill_pp = args.pp_size
        big, small = max(args.disaggregation_decode_tp, args.tp_size), min(args.disaggregation_decode_tp, args.tp_size)
        if small < 1 or big % small:
            raise Refusal("args", "AssertionError", "Different tp size is supported only when one tp is multiple of the "
                          f"other. decode_tp={args.disaggregation_decode_tp}, prefill_tp={args.tp_size}")
        args.disable_cuda_graph = True
        return [("warning", "Cuda graph is disabled for prefill server")]
    return []


def _env(env: dict, key: str, default: float) -> float:
    value = env.get(key)
    return float(value) if value not in (None, "") else default


def local_ip(env: dict, host: str) -> str:
    """get_local_ip_auto: SGLANG_HOST_IP / HOST_IP, the bound address, else the routed interface's."""
    for key in ("SGLANG_HOST_IP", "HOST_IP"):
        if env.get(key):
            return env[key]
    if host not in ("0.0.0.0", "::", ""):
        return host
    for probe in ("10.213.255.2", "192.0.2.1"):  # a UDP connect picks a route and sends nothing
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


class Disaggregation:
    def __init__(self, engine):
        self.engine = engine
        args, env = engine.args, engine.env
        self.mode = args.disaggregation_mode
        self.bootstrap_timeout = _env(env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)
        self.waiting_timeout = _env(env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300)
        self.heartbeat_interval = max(_env(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0), 2.0)
        self.max_failures = max(int(_env(env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1)
        self.lock = threading.Condition()
        self.bootstrap = self.listener = None
        self.rank_ip = local_ip(env, args.host)
        self.links: dict = {}            # prefill: room -> (connection, peer) of the decode side
        self.prefill_info: dict = {}     # decode: bootstrap address -> the prefill server's info
        self.misses: dict = {}
        self.receiving: dict = {}        # decode: room -> [bootstrap address, connection, failure]
        self.queue = {"bootstrap": 0, "inflight": 0, "prealloc": 0, "transfer": 0}
        self.failed = {"bootstrap": 0, "transfer": 0}
        self.bytes = self.transfers = self.fake = 0
        self.hist = {"total_mb": Histogram(MB_BUCKETS), "latency_ms": Histogram(MS_BUCKETS),
                     "speed_gb_s": Histogram(SPEED_BUCKETS), "bootstrap_ms": Histogram(MS_BUCKETS)}
        self.stages = {s: Histogram(STAGE_BUCKETS) for s in ("decode_bootstrap", "decode_transferred", "fake_output")}

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """At launch: a prefill server's bootstrap server and its rank's KV port; a decode
        server's heartbeat."""
        e = self.engine
        if self.mode == "prefill":
            if e.fault == "bootstrap_never_starts":
                e.log.warning(f"rehearsal fault bootstrap_never_starts: no bootstrap server on port "
                              f"{e.args.disaggregation_bootstrap_port}")
            else:
                try:
                    self.bootstrap = kvlink.BootstrapServer(e.args.host, e.args.disaggregation_bootstrap_port, e.log)
                except OSError as exc:
                    e.log.error(f"Server error: [Errno {exc.errno}] error while attempting to bind on address "
                                f"('{e.args.host}', {e.args.disaggregation_bootstrap_port}): {exc.strerror}")
                else:
                    self.bootstrap.start()
            self.listener = kvlink.KvListener(self.rank_ip, self.on_decode)
        else:
            threading.Thread(target=self.heartbeat, daemon=True, name="pd-heartbeat").start()

    def kv_ready(self):
        """The prefill ranks register at the bootstrap server once the KV pool exists."""
        if self.mode != "prefill":
            return
        a = self.engine.args
        attn_dp = a.dp_size if a.enable_dp_attention else 1
        attn_tp = a.tp_size // attn_dp
        system_dp = 1 if a.enable_dp_attention else a.dp_size
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(a.host, a.host)
        payloads = [{"attn_tp_size": attn_tp, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0,
                     "attn_dp_size": attn_dp, "attn_dp_rank": dp if attn_dp > 1 else 0, "pp_size": a.pp_size,
                     "pp_rank": pp, "system_dp_size": system_dp, "system_dp_rank": dp if system_dp > 1 else 0,
                     "rank_ip": self.rank_ip, "rank_port": self.listener.port, "page_size": a.page_size or 1,
                     "kv_cache_dtype": a.kv_cache_dtype, "load_balance_method": a.load_balance_method,
                     "prefill_http_port": a.port}
                    for dp in range(max(attn_dp, system_dp)) for tp in range(attn_tp) for pp in range(a.pp_size)]
        kvlink.register(host, a.disaggregation_bootstrap_port, payloads, self.engine.log, self.engine.stop)

    def warmup(self):
        """SGLang's warm-up generation in PD mode goes to the fake bootstrap host: nothing moves."""
        if self.mode == "decode":
            with self.lock:
                self.fake += 1
                self.stages["fake_output"].observe(0.0)

    def close(self):
        for closer in (self.bootstrap, self.listener):
            if closer is not None:
                closer.close()
        self.bootstrap = self.listener = None

    def kv_bytes(self, prompt_tokens: int) -> int:
        return int(prompt_tokens * sum(self.engine.plan.kv_bytes_per_token))

    # ------------------------------------------------------------------ requests
    def admit(self, body: dict, results: list) -> str | None:
        """Before a request runs: the prefill side waits for the decode side of its room; the
        decode side takes the KV cache. Returns the abort message, or None."""
        for i, result in enumerate(results):
            host, port, room = (_item(body.get(k), i) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
            try:
                if self.mode == "prefill":
                    self.prefill_bootstrap(result, host, room)
                else:
                    self.decode_receive(result, host, port, room)
            except TransferFailed as failed:
                self.engine.log.error(str(failed))
                return str(failed)
        return None

    def prefill_bootstrap(self, result: dict, host, room):
        result["completion_tokens"] = 1  # prefill.py: max_new_tokens = 1
        if host == FAKE_BOOTSTRAP_HOST:
            return
        began = time.monotonic()
        with self.lock:
            self.queue["bootstrap"] += 1
            try:
                while room not in self.links:
                    left = began + self.bootstrap_timeout - time.monotonic()
                    if left <= 0 or self.engine.stop.is_set():
                        self.failed["bootstrap"] += 1
                        self.engine.log.warning(
                            "Some requests timed out when bootstrapping, which means prefill instances fail to receive "
                            "the KV indices from the decode instance of this request. If a greater mean TTFT is "
                            "acceptable, you can 'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=600' (10 minutes) to "
                            "relax the timeout condition. ")
                        raise TransferFailed(
                            f"Prefill bootstrap failed for request rank=0 req.rid={result['id']!r} req.bootstrap_room={room} "
                            f"with exception KVTransferError(bootstrap_room={room}): Request {room} timed out after "
                            f"{time.monotonic() - began:.1f}s in KVPoll.Bootstrapping")
                    self.lock.wait(min(left, 0.5))
                conn, peer = self.links.pop(room)
            finally:
                self.queue["bootstrap"] -= 1
        self.hist["bootstrap_ms"].observe((time.monotonic() - began) * 1000)
        result["pd_transfer"] = lambda: self.prefill_send(result, room, conn, peer)

    def on_decode(self, room: int, conn, peer):
        """The decode side of `room` arrived at this prefill rank's KV port."""
        with self.lock:
            self.links[room] = (conn, peer)
            self.lock.notify_all()

    def prefill_send(self, result: dict, room: int, conn, peer):
        """After the prefill forward: write the room's KV cache and wait for the decode side's OK."""
        size = self.kv_bytes(result["prompt_tokens"])
        with self.lock:
            self.queue["inflight"] += 1
        began = time.monotonic()
        try:
            if self.engine.fault == "prefill_dies_mid_transfer":
                try:
                    kvlink.send_kv(conn, room, size, stop_after=size // 2)
                except (InterruptedError, OSError):
                    pass
                self.engine.crash("RuntimeError", f"rehearsal fault prefill_dies_mid_transfer: the prefill server died "
                                  f"sending room {room}'s KV cache ({size // 2} of {size} bytes sent)")
                sys.stderr.flush()
                os._exit(1)
            kvlink.send_kv(conn, room, size)
            conn.settimeout(self.waiting_timeout)
            if kvlink.read_line(conn) != "OK":
                raise ConnectionResetError("no OK")
        except (OSError, ValueError):
            with self.lock:
                self.failed["transfer"] += 1
            raise TransferFailed(
                f"Prefill transfer failed for request rank=0 req.rid={result['id']!r} req.bootstrap_room={room} with "
                f"exception KVTransferError(bootstrap_room={room}): Decode instance could be dead, remote mooncake "
                f"session {peer[0]}:{peer[1]} is not alive") from None
        finally:
            conn.close()
            with self.lock:
                self.queue["inflight"] -= 1
        took = max(time.monotonic() - began, 1e-6)
        with self.lock:
            self.bytes += size
            self.transfers += 1
            self.hist["total_mb"].observe(size / (1 << 20))
            self.hist["latency_ms"].observe(took * 1000)
            self.hist["speed_gb_s"].observe(size / took / 1e9)

    def decode_receive(self, result: dict, host, port, room):
        if host == FAKE_BOOTSTRAP_HOST:
            with self.lock:
                self.fake += 1
                self.stages["fake_output"].observe(0.0)
            return
        address = kvlink.addr(host, port)
        began = time.monotonic()
        with self.lock:
            self.queue["prealloc"] += 1
        try:
            rank = self.handshake(result, address, room)
            conn = self.connect(result, rank, room, began + self.waiting_timeout)
        finally:
            with self.lock:
                self.queue["prealloc"] -= 1
        entry = [address, conn, None]
        with self.lock:
            self.receiving[room] = entry
            self.queue["transfer"] += 1
            self.stages["decode_bootstrap"].observe(time.monotonic() - began)
        init = time.monotonic()
        try:
            got = kvlink.recv_kv(conn, room, init + self.waiting_timeout)
        except (OSError, ValueError) as exc:
            with self.lock:
                self.failed["transfer"] += 1
                reason = entry[2]
            if reason is None and isinstance(exc, socket.timeout):
                self.engine.log.warning(
                    "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean "
                    "TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax "
                    "the timeout condition. ")
                reason = f"Request {room} timed out after {time.monotonic() - init:.1f}s in KVPoll.WaitingForInput"
            raise TransferFailed(
                f"Decode transfer failed for request rank=0 decode_req.req.rid={result['id']!r} "
                f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
                f"{reason or 'Failed to get kvcache from prefill instance, it might be dead'}") from None
        finally:
            conn.close()
            with self.lock:
                self.receiving.pop(room, None)
                self.queue["transfer"] -= 1
        with self.lock:
            self.bytes += got
            self.transfers += 1
            self.stages["decode_transferred"].observe(time.monotonic() - init)
        result["kv_received"] = got

    def handshake(self, result: dict, address: str, room) -> dict:
        """The prefill server's info (cached a bootstrap address) and rank 0's KV port."""
        def failed(reason: str):
            with self.lock:
                self.failed["bootstrap"] += 1
            return TransferFailed(f"Decode handshake failed for request rank=0 decode_req.req.rid={result['id']!r} "
                                  f"decode_req.req.bootstrap_room={room} with exception "
                                  f"KVTransferError(bootstrap_room={room}): {reason}")
        for attempt in range(1, ENSURE_RETRIES + 1):
            if self.fetch_info(address):
                break
            if attempt == ENSURE_RETRIES or self.engine.stop.wait(ENSURE_INTERVAL):
                self.engine.log.error(f"Could not fetch prefill parallel info from {address} after {attempt} attempts")
                raise failed(f"Could not fetch prefill parallel info from {address} after {attempt} attempts")
        query = "prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
        try:
            status, text = kvlink.http("GET", f"http://{address}/route?{query}")
            if status == 200:
                return json.loads(text)
            self.engine.log.error(f"Failed to get prefill server info: {status}, {text}")
        except (OSError, ValueError) as exc:
            self.engine.log.error(f"Error fetching prefill info from bootstrap: {exc}")
        raise failed("Could not fetch bootstrap info for: prefill_dp_rank: 0 prefill_cp_rank: 0 target_tp_rank: 0 "
                     "and target_pp_rank 0")

    def fetch_info(self, address: str) -> bool:
        with self.lock:
            if address in self.prefill_info:
                return True
        query = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        try:
            status, text = kvlink.http("GET", f"http://{address}/route?{query}")
        except OSError as exc:
            self.engine.log.error(f"Error fetching prefill server info from bootstrap: {kvlink.root_cause(exc)}")
            return False
        if status != 200:
            self.engine.log.error(f"Failed to get prefill server info: {status}, {text}")
            return False
        info = json.loads(text)
        page = self.engine.args.page_size or 1
        if info.get("page_size") not in (None, page):
            raise TransferFailed(f"Page size mismatch: prefill server has page_size={info['page_size']}, but decode server "
                                 f"has page_size={page}. Both servers must use the same --page-size value.")
        with self.lock:
            self.prefill_info[address] = info
            self.misses[address] = 0
        return True

    def connect(self, result: dict, rank: dict, room, deadline: float):
        """The rank's KV port; ZMQ connects lazily and keeps trying, so a refusal is retried
        until the waiting timeout."""
        while True:
            try:
                conn = socket.create_connection((rank["rank_ip"], int(rank["rank_port"])), timeout=kvlink.ROUTE_TIMEOUT)
                conn.sendall((json.dumps({"room": room}) + "\n").encode())
                return conn
            except OSError:
                if time.monotonic() >= deadline or self.engine.stop.wait(0.5):
                    with self.lock:
                        self.failed["transfer"] += 1
                    raise TransferFailed(
                        f"Decode transfer failed for request rank=0 decode_req.req.rid={result['id']!r} "
                        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
                        f"Request {room} timed out after {self.waiting_timeout:.1f}s in KVPoll.WaitingForInput") from None

    def heartbeat(self):
        """CommonKVManager._start_heartbeat_checker_thread (decode)."""
        while not self.engine.stop.wait(self.heartbeat_interval):
            with self.lock:
                addresses = list(self.prefill_info)
            for address in addresses:
                try:
                    ok = kvlink.http("GET", f"http://{address}/health", timeout=3)[0] == 200
                except OSError:
                    ok = False
                with self.lock:
                    self.misses[address] = 0 if ok else self.misses.get(address, 0) + 1
                    lost = self.misses[address] >= self.max_failures
                if not ok:
                    self.engine.log.info(f"Attempting to reconnect to {address}...")
                if lost:
                    self.node_failure(address)

    def node_failure(self, address: str):
        reason = f"Lost connection with prefill instance (bootstrap_addr: {address})"
        with self.lock:
            self.prefill_info.pop(address, None)
            self.misses.pop(address, None)
            affected = [entry for entry in self.receiving.values() if entry[0] == address]
            for entry in affected:
                entry[2] = reason
        for entry in affected:
            try:
                entry[1].shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.engine.log.error(f"{reason}, {len(affected)} requests affected")

    # ------------------------------------------------------------------ what it reports
    def info(self) -> dict:
        with self.lock:
            return {"mode": self.mode, "kv_bytes": self.bytes, "transfers": self.transfers, "fake_transfers": self.fake,
                    "kv_bytes_per_token": self.kv_bytes(1), "bootstrap_port": self.engine.args.disaggregation_bootstrap_port
                    if self.mode == "prefill" else None,
                    "bootstrap_server": self.bootstrap is not None, "rank_port": self.listener.port if self.listener else None,
                    "prefill_servers": sorted(self.prefill_info), "failed": dict(self.failed)}

    def metric_lines(self, base: list) -> list[str]:
        """SGLang's PD metric families for this side (observability/metrics_collector.py)."""
        ranks = base + [("tp_rank", 0), ("pp_rank", 0)]
        lines: list[str] = []
        with self.lock:
            gauges = (("num_prefill_prealloc_queue_reqs", "bootstrap", "prefill prealloc"),
                      ("num_prefill_inflight_queue_reqs", "inflight", "prefill inflight")) if self.mode == "prefill" else \
                (("num_decode_prealloc_queue_reqs", "prealloc", "decode prealloc"),
                 ("num_decode_transfer_queue_reqs", "transfer", "decode transfer"))
            for name, key, what in gauges:
                lines += [f"# HELP sglang:{name} The number of requests in the {what} queue.", f"# TYPE sglang:{name} gauge",
                          f"sglang:{name}{_labels(ranks)} {_num(self.queue[key])}"]
            for name, key in (("num_bootstrap_failed_reqs_total", "bootstrap"), ("num_transfer_failed_reqs_total", "transfer")):
                lines += [f"# HELP sglang:{name} The number of {key} failed requests.", f"# TYPE sglang:{name} counter",
                          f"sglang:{name}{_labels(ranks)} {_num(self.failed[key])}"]
            if self.mode == "prefill":
                for key, doc in (("total_mb", "KV cache transfer size in MB"), ("latency_ms", "KV cache transfer latency in ms"),
                                 ("speed_gb_s", "KV cache transfer speed in GB/s"),
                                 ("bootstrap_ms", "KV transfer bootstrap time in ms")):
                    lines += _histogram(f"sglang:kv_transfer_{key}", f"Histogram of {doc}.", ranks, self.hist[key])
            else:
                lines += ["# HELP sglang:per_stage_req_latency_seconds The latency of each stage of requests.",
                          "# TYPE sglang:per_stage_req_latency_seconds histogram"]
                for stage, hist in self.stages.items():
                    lines += _histogram("sglang:per_stage_req_latency_seconds", None, ranks + [("stage", stage)], hist)
        return lines


def _histogram(name: str, doc, labels: list, hist: Histogram) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"] if doc else []
    for bound, count in zip(hist.bounds, hist.counts):
        lines.append(f"{name}_bucket{_labels(labels + [('le', _num(bound))])} {_num(count)}")
    lines.append(f"{name}_bucket{_labels(labels + [('le', '+Inf')])} {_num(hist.total)}")
    lines.append(f"{name}_count{_labels(labels)} {_num(hist.total)}")
    lines.append(f"{name}_sum{_labels(labels)} {_num(hist.sum)}")
    return lines


def _item(value, i: int):
    return value[i] if isinstance(value, list) else value
