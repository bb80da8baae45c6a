"""The wire of prefill/decode disaggregation, as SGLang's common KV transfer layer has it
(python/sglang/srt/disaggregation/common/conn.py, 2026), over TCP between hosts. Stdlib only.

- The prefill server's bootstrap server (`CommonKVBootstrapServer`, an HTTP server on
  --disaggregation-bootstrap-port): `PUT /route` registers a prefill rank (its attention TP/CP/DP
  and PP rank, the rank's IP and port); `GET /route?prefill_dp_rank=-1&prefill_cp_rank=-1&
  target_tp_rank=-1&target_pp_rank=-1` answers the prefill server's parallel info once every rank
  registered (503 "Prefill server not fully registered yet (N workers registered)." before);
  with ranks it answers that rank's {rank_ip, rank_port} (404 when unknown, 400 without the four
  inputs); `GET /health` "OK"; `POST /register_dp_rank`, `/query_dp_ranks`.
- The rank's KV port: where SGLang's decode side sends its KV indices for a request (the
  bootstrap room) and the prefill side then writes the request's KV cache. Here one TCP
  connection a request: the decode server sends {"room": R} as a line; once the prefill server has
  prefilled R it writes {"room": R, "bytes": N} and N bytes; the decode server answers "OK".
"""
from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

CHUNK = 1 << 20          # bytes written or read at a time
REGISTER_RETRIES = 5     # CommonKVManager.register_to_bootstrap: 5 tries, backoff 1 s doubling to 30 s
ROUTE_TIMEOUT = 5.0      # requests.get(url, timeout=5) of the decode side's bootstrap lookups


def addr(host: str, port) -> str:
    """host:port as SGLang writes a bootstrap address (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if host and ":" in str(host) else f"{host}:{port}"


def http(method: str, url: str, body=None, timeout=ROUTE_TIMEOUT) -> tuple[int, str]:
    """(status, text) of one request without a proxy; raises OSError when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except urllib.error.URLError as e:
        reason = e.reason if isinstance(e.reason, BaseException) else OSError(str(e.reason))
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from None


def root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"


class BootstrapServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, log):
        self.log = log
        self.lock = threading.Lock()
        self.table: dict = {}             # (dp, cp, tp, pp) -> {rank_ip, rank_port}
        self.info: dict = {}              # the parallel info the first registration sets
        self.rooms: dict = {}             # bootstrap room -> dp rank (register_dp_rank)
        super().__init__((host, port), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                                       name="bootstrap")

    def start(self):
        self.thread.start()
        host, port = self.server_address[:2]
        self.log.info(f"CommonKVBootstrapServer started successfully on {host}:{port}")

    def close(self):
        self.shutdown()
        self.server_close()

    def expected(self) -> int:
        i = self.info
        return i["dp_size"] * i["attn_cp_size"] * i["attn_tp_size"] * i["pp_size"] if i else 0

    def ready(self) -> bool:
        return bool(self.info) and len(self.table) >= self.expected()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "aiohttp-rehearsal"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, text: str, json_body: bool = False):
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if json_body else "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self):
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self):
        url = urlsplit(self.path)
        s = self.server
        if url.path == "/health":
            self._send(200, "OK")
            return
        if url.path != "/route":
            self._send(404, "Not Found")
            return
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(k) for k in keys):
            self._send(400, "Missing inputs for bootstrap server.")
            return
        with s.lock:
            if not s.ready():
                self._send(503, f"Prefill server not fully registered yet ({len(s.table)} workers registered).")
                return
            wanted = tuple(int(q[k]) for k in keys)
            if wanted == (-1, -1, -1, -1):
                self._send(200, json.dumps(s.info), json_body=True)
                return
            rank = s.table.get(wanted)
        if rank is None:
            self._send(404, f"Bootstrap info not found for dp_rank={q['prefill_dp_rank']} cp_rank={q['prefill_cp_rank']} "
                            f"tp_rank={q['target_tp_rank']} pp_rank={q['target_pp_rank']}")
            return
        self._send(200, json.dumps(rank), json_body=True)

    def do_PUT(self):
        if urlsplit(self.path).path != "/route":
            self._send(405, "Method not allowed")
            return
        d = self._json()
        s = self.server
        with s.lock:
            if not s.info:
                dp = d["attn_dp_size"] if d["system_dp_size"] == 1 else d["system_dp_size"]
                s.info = {"attn_tp_size": d["attn_tp_size"], "attn_cp_size": d["attn_cp_size"], "dp_size": dp,
                          "pp_size": d["pp_size"], "page_size": d["page_size"], "kv_cache_dtype": d["kv_cache_dtype"],
                          "follow_bootstrap_room": d.get("load_balance_method", "follow_bootstrap_room")
                          in ("follow_bootstrap_room", "auto"),
                          "enable_dsa_cache_layer_split": False, "prefill_http_port": d.get("prefill_http_port")}
            group = d["attn_dp_rank"] if d["system_dp_size"] == 1 else d["system_dp_rank"]
            s.table[(group, d["attn_cp_rank"], d["attn_tp_rank"], d["pp_rank"])] = {
                "rank_ip": d["rank_ip"], "rank_port": int(d["rank_port"])}
        self._send(200, "OK")

    def do_POST(self):
        path = urlsplit(self.path).path
        d = self._json()
        s = self.server
        if path == "/register_dp_rank":
            with s.lock:
                s.rooms[int(d["bootstrap_room"])] = int(d["dp_rank"])
            self._send(200, "OK")
        elif path == "/query_dp_ranks":
            with s.lock:
                found = {str(r): s.rooms[int(r)] for r in d.get("bootstrap_rooms", []) if int(r) in s.rooms}
            self._send(200, json.dumps(found), json_body=True)
        elif path == "/route":
            self._send(405, "Method not allowed", json_body=True)
        else:
            self._send(404, "Not Found")


def register(host: str, port: int, payloads: list[dict], log, stop: threading.Event) -> bool:
    """Every rank's PUT /route to the bootstrap server, with SGLang's retries and lines."""
    url = f"http://{addr(host, port)}/route"
    for payload in payloads:
        for attempt in range(REGISTER_RETRIES):
            try:
                status, _ = http("PUT", url, payload)
                if status == 200:
                    break
                log.warning(f"Prefill register attempt {attempt + 1}/{REGISTER_RETRIES} failed: status {status}")
            except OSError as exc:
                log.warning(f"Prefill register attempt {attempt + 1}/{REGISTER_RETRIES} failed: {root_cause(exc)}")
            if attempt == REGISTER_RETRIES - 1:
                log.error(f"Prefill instance failed to register to bootstrap server after {REGISTER_RETRIES} retries")
                return False
            if stop.wait(min(2 ** attempt, 30) * 0.9):
                return False
    return True


class KvListener:
    """A prefill rank's KV port: each decode connection says which room it is for."""

    def __init__(self, bind: str, on_room):
        self.sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind, 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.on_room = on_room
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="kv-listener").start()

    def _accept(self):
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._first_line, args=(conn, peer), daemon=True).start()

    def _first_line(self, conn: socket.socket, peer):
        try:
            conn.settimeout(ROUTE_TIMEOUT)
            line = read_line(conn)
            conn.settimeout(None)
            self.on_room(int(json.loads(line)["room"]), conn, peer)
        except (OSError, ValueError, KeyError):
            conn.close()

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def read_line(conn: socket.socket, limit: int = 4096) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionResetError("the peer closed the connection")
        data += chunk
        if len(data) > limit:
            raise ValueError("line too long")
    return data.decode().strip()


def send_kv(conn: socket.socket, room: int, size: int, stop_after: int | None = None) -> None:
    """The room's KV cache: a header line, then `size` bytes (`stop_after`: cut after that many)."""
    conn.sendall((json.dumps({"room": room, "bytes": size}) + "\n").encode())
    block = bytes(min(CHUNK, max(size, 1)))
    sent = 0
    while sent < size:
        n = min(CHUNK, size - sent)
        if stop_after is not None and sent + n > stop_after:
            n = max(stop_after - sent, 0)
            conn.sendall(block[:n])
            raise InterruptedError(f"cut after {sent + n} of {size} bytes")
        conn.sendall(block[:n])
        sent += n


def recv_kv(conn: socket.socket, room: int, deadline: float) -> int:
    """Read the room's KV cache until `deadline` (time.monotonic); returns the bytes received."""
    conn.settimeout(max(deadline - time.monotonic(), 0.05))
    head = json.loads(read_line(conn))
    if int(head.get("room", -1)) != room:
        raise ValueError(f"the prefill side sent room {head.get('room')}, not {room}")
    size, got = int(head["bytes"]), 0
    while got < size:
        conn.settimeout(max(deadline - time.monotonic(), 0.05))
        chunk = conn.recv(min(CHUNK, size - got))
        if not chunk:
            raise ConnectionResetError(f"the prefill side closed the connection after {got} of {size} bytes")
        got += len(chunk)
    conn.sendall(b"OK\n")
    return got
