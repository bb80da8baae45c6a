"""SGLang's HTTP surface, served by the standard library.

Endpoints and shapes follow SGLang's entrypoints/http_server.py: /health and /health_generate
(503 until the warmup generation succeeded and while shutting down), /server_info (and the
deprecated /get_server_info) = {**server_args, **scheduler_info, internal_states, version},
/model_info (/get_model_info), /v1/models, POST /generate, POST /v1/chat/completions,
POST /v1/completions (JSON content type required: 400 otherwise), GET /ping, /get_load and
/metrics (with --enable-metrics), both counting the requests being decoded now. Generations are fake: deterministic words, one per token.
Nodes >= 1 of a multi-node world serve DummyHealthServer instead (SGLang's dummy health server).
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang._rehearsal import answers as answers_mod
from sglang._rehearsal import metrics

# The filler words of the stand-in tokenizer (rehearsal/tokenizer.py puts them first in the
# vocabulary); answers now come from answers.py.
WORDS = ("this is a rehearsal engine answering without a model and without a gpu so every "
         "word here is a stand in for a token").split()


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # uvicorn's listen backlog: with socketserver's 5, a benchmark opening 32 connections at once
    # has some SYNs dropped and retried a second later (a TTFT p99 of 1.3 s that SGLang never shows).
    request_queue_size = 2048

    def __init__(self, address, engine):
        self.engine = engine
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-rehearsal"

    # ------------------------------------------------------------------ plumbing
    @property
    def engine(self):
        return self.server.engine

    def log_message(self, fmt, *args):  # access lines go through the engine's log, uvicorn-style
        pass

    def _access(self, code: int):
        if self.path.startswith("/health") and code == 200 and not self.engine.log_health:
            return
        self.engine.log.access(self.client_address, self.command, self.path, code)

    def _send(self, code: int, body=b"", content_type="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        if body or code != 200 or content_type != "application/json":
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._access(code)

    def _error(self, code: int, message: str):
        self._send(code, {"object": "error", "message": message, "type": _phrase(code), "param": None,
                          "code": code})

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self, require_json_type: bool):
        raw = self._body()
        if require_json_type:
            media = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                self._error(400, "[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: "
                                 "Only 'application/json' is allowed\", 'type': 'value_error'}]")
                return None
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            self._error(400, f"JSON decode error: {exc}")
            return None

    def _authorized(self) -> bool:
        key = self.engine.args.api_key
        if not key or self.path.startswith("/health") or self.path.startswith("/metrics"):
            return True
        if self.headers.get("Authorization") == "Bearer " + key:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    # ------------------------------------------------------------------ routing
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if not self._authorized():
            return
        route = {
            "/health": self._health, "/health_generate": self._health,
            "/server_info": self._server_info, "/get_server_info": self._get_server_info,
            "/model_info": self._model_info, "/get_model_info": self._model_info,
            "/v1/models": self._models, "/ping": self._ping, "/get_load": self._load,
            "/metrics": self._metrics,
        }.get(path)
        if route is None:
            self._send(404, {"detail": "Not Found"})
        else:
            route()

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if not self._authorized():
            self._body()
            return
        route = {"/generate": self._generate, "/v1/chat/completions": self._chat,
                 "/v1/completions": self._completions}.get(path)
        if route is None:
            self._body()
            self._send(404, {"detail": "Not Found"})
        else:
            route()

    do_PUT = do_POST

    # ------------------------------------------------------------------ endpoints
    def _health(self):
        ok = self.engine.health_generate()
        self._send(200 if ok else 503, b"", content_type="text/plain" if not ok else "application/json")

    def _ping(self):
        self._send(200, b"")

    def _server_info(self):
        self._send(200, self.engine.server_info())

    def _get_server_info(self):
        self.engine.log.warning("The /get_server_info endpoint is deprecated and will be removed in a "
                                "future version. Please use /server_info instead.")
        self._server_info()

    def _model_info(self):
        self._send(200, self.engine.model_info())

    def _models(self):
        e = self.engine
        self._send(200, {"object": "list", "data": [{
            "id": e.args.served_model_name, "object": "model", "created": int(e.started_at),
            "owned_by": "sglang-rehearsal", "root": e.args.served_model_name, "parent": None,
            "max_model_len": e.args.context_length}]})

    def _load(self):
        # SGLang's shape: one entry per DP rank, each counting the requests it runs.
        e = self.engine
        self._send(200, [{"dp_rank": r, "num_reqs": e.ranks.load(r), "num_waiting_reqs": 0,
                          "num_tokens": e.used_tokens(r)} for r in range(e.dp_ranks)])

    def _metrics(self):
        e = self.engine
        if not e.args.enable_metrics:
            self._send(404, {"detail": "Not Found"})
            return
        self._send(200, metrics.render(e), content_type=metrics.CONTENT_TYPE)

    def _generate(self):
        body = self._json_body(require_json_type=False)
        if body is None:
            return
        source = body.get("text", body.get("input_ids"))
        if source is None:
            self._send(400, {"error": {"message": "Either text or input_ids should be provided."}})
            return
        batch = isinstance(source, list) and source and not isinstance(source[0], int)
        items = source if batch else [source]
        params = body.get("sampling_params") or {}
        if isinstance(params, list):
            params = params[0] if params else {}
        max_new = int(params.get("max_new_tokens", 128))
        answers = self.engine.answers
        results = []
        for item in items:
            ids = [int(i) for i in item] if isinstance(item, list) else answers.tokenize(item)
            result = self.engine.generate(len(ids), max_new, body.get("routed_dp_rank"))
            start, refusal = answers_mod.logprob_start(body, len(ids))
            if isinstance(result, str) or refusal:
                self._send(400, {"error": {"message": refusal or result}})
                return
            result["logprob"] = dict(body, logprob_start_len=start) if body.get("return_logprob") else None
            self.engine.answer(result, ids)
            results.append(result)
        try:
            if body.get("stream") and not batch:
                with self.engine.decoding(results[0]):
                    self._stream_generate(results[0])
            else:
                self.engine.decode_all(results)
                out = [self._generate_json(r) for r in results]
                self._send(200, out if batch else out[0])
        except ConnectionAbortedError:
            self.close_connection = True  # a wedged DP rank: no answer, the connection is cut
            return
        self.engine.after_request()

    def _generate_json(self, r, upto=None):
        n = r["completion_tokens"] if upto is None else upto
        latency = r["latency"] if "latency" in r else round(time.time() - r["started"], 4)
        answers = self.engine.answers
        ids = r["output_ids"][:n]
        meta = {"id": r["id"], "finish_reason": {"type": "length", "length": r["completion_tokens"]}
                if upto is None or upto == r["completion_tokens"] else None,
                "prompt_tokens": r["prompt_tokens"], "weight_version": self.engine.args.weight_version,
                "completion_tokens": n, "cached_tokens": 0, "e2e_latency": latency}
        if r.get("logprob"):
            meta.update(answers_mod.logprob_fields(answers, r["prompt_ids"], ids, r["output_lps"][:n], r["logprob"]))
        # A stream's chunk carries the text so far and the newest token id (SGLang's output_ids
        # from the last offset); the whole answer carries every id.
        return {"text": answers.decode(ids), "output_ids": ids if upto is None else ids[-1:], "meta_info": meta}

    def _stream_generate(self, r):
        # Like SGLang's /generate stream: every chunk carries the text so far and the token count
        # (meta_info.completion_tokens), which is what bench_serving measures TTFT and ITL from.
        self._start_stream()
        for n in range(1, r["completion_tokens"] + 1):
            self.engine.token_delay(r)
            self.engine.emit_token(r)
            self._chunk(self._generate_json(r, upto=n))
        self._chunk("[DONE]")

    def _openai(self, chat: bool):
        body = self._json_body(require_json_type=True)
        if body is None:
            return
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                self._error(400, "messages: a non-empty list is required")
                return
            # The chat template is the stand-in's: the messages' contents, one after the other.
            text = " ".join(str(m.get("content", "")) if isinstance(m, dict) else "[UNK]" for m in messages)
        else:
            if "prompt" not in body:
                self._error(400, "prompt: field required")
                return
            text = body["prompt"]
        answers = self.engine.answers
        ids = [int(i) for i in text] if isinstance(text, list) else answers.tokenize(text)
        prompt = len(ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        n_out = int(max_tokens) if max_tokens is not None else 16
        finish = "length" if max_tokens is not None else "stop"
        r = self.engine.generate(prompt, n_out)
        if isinstance(r, str):
            self._error(400, r)
            return
        self.engine.answer(r, ids)
        model = body.get("model") or self.engine.args.served_model_name
        created = int(time.time())
        rid = r["id"]
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + n_out, "completion_tokens": n_out,
                 "prompt_tokens_details": None}
        try:
            if body.get("stream"):
                with self.engine.decoding(r):
                    self._stream_openai(body, chat, r, model, created, finish, usage)
                self.engine.after_request()
                return
            self.engine.decode_all([r])
        except ConnectionAbortedError:
            self.close_connection = True  # a wedged DP rank: no answer, the connection is cut
            return
        text = answers.decode(r["output_ids"])
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                              "tool_calls": None}, "logprobs": None,
                      "finish_reason": finish, "matched_stop": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            obj = "text_completion"
        self._send(200, {"id": rid, "object": obj, "created": created, "model": model,
                         "choices": [choice], "usage": usage})
        self.engine.after_request()

    def _stream_openai(self, body, chat, r, model, created, finish, usage):
        """OpenAI server-sent events: one chunk per token (a delta), a last chunk with the finish
        reason (and the usage when stream_options.include_usage), then [DONE]."""
        rid = r["id"]
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._start_stream()
        for i in range(r["completion_tokens"]):
            self.engine.token_delay(r)
            self.engine.emit_token(r)
            word = (" " if i else "") + self.engine.answers.word(r["output_ids"][i])
            if chat:
                delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            else:
                choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": None}
            self._chunk({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
        last = {"index": 0, "logprobs": None, "finish_reason": finish}
        last.update({"delta": {}} if chat else {"text": ""})
        final = {"id": rid, "object": obj, "created": created, "model": model, "choices": [last]}
        if (body.get("stream_options") or {}).get("include_usage"):
            final["usage"] = usage
        self._chunk(final)
        self._chunk("[DONE]")

    def _chat(self):
        self._openai(chat=True)

    def _completions(self):
        self._openai(chat=False)

    # ------------------------------------------------------------------ server-sent events
    def _start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self._access(200)

    def _chunk(self, data):
        payload = data if isinstance(data, str) else json.dumps(data)
        self.wfile.write(b"data: " + payload.encode() + b"\n\n")
        self.wfile.flush()


class DummyHealthServer(ThreadingHTTPServer):
    """What SGLang runs on --port of a node >= 1 (launch_dummy_health_check_server): /ping,
    /health and /health_generate answer 200 with no body whatever the world's state; /metrics
    with --enable-metrics; nothing else (no generation, no /server_info). Its uvicorn logs at
    warning level, so no access lines."""
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, engine):
        self.engine = engine
        super().__init__(address, DummyHandler)


class DummyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-rehearsal"
    ROUTES = ("/ping", "/health", "/health_generate")

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, body: bytes = b"", content_type: str | None = None):
        self.send_response(code)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in self.ROUTES:
            self._send(200)
        elif path == "/metrics" and self.server.engine.args.enable_metrics:
            self._send(200, b"", "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?", 1)[0]
        if path in self.ROUTES:
            self._send(405, b'{"detail":"Method Not Allowed"}', "application/json")
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    do_PUT = do_POST


def _phrase(code: int) -> str:
    return {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}.get(code, str(code))


def new_request_id() -> str:
    return uuid.uuid4().hex


def serve(server: EngineHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                              name="http")
    thread.start()
    return thread
