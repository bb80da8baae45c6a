"""The rehearsal engine's stop (shutdown.py: SGLang's SIGTERM drain, the scheduler child, KillMode
shapes), the speed and rank faults, and /metrics with SGLang's names, for real processes."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.standins.helpers import MODELS, port_open

TP8 = ["--tp-size", "8", "--host", "127.0.0.1"]
DP4 = ["--tp-size", "8", "--dp-size", "4", "--enable-dp-attention", "--mem-fraction-static", "0.88", "--host", "127.0.0.1"]


def stream(port, tokens, out: dict, key):
    """A streamed /generate; out[key] = (chunks with a token, finished with [DONE], error)."""
    body = json.dumps({"text": "this is a rehearsal", "sampling_params": {"max_new_tokens": tokens}, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body, headers={"Content-Type": "application/json"})
    chunks, done, error = 0, False, None
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunks += 1
    except Exception as exc:  # a cut stream: what the test asserts about
        error = repr(exc)
    out[key] = (chunks, done, error)


def start(launch, engine_env, flags, **env):
    e = launch(*flags, env=engine_env(**{"REHEARSAL_SECONDS_PER_TOKEN": "0.05", **env}))
    e.wait_ready()
    return e


def in_flight(e, n, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(r["num_reqs"] for r in e.get("/get_load")[1]) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("requests never ran")


def test_sigterm_drains_requests_in_flight_and_health_says_503(launch, engine_env):
    e = start(launch, engine_env, TP8, REHEARSAL_DRAIN_POLL_SECONDS="0.2")
    out: dict = {}
    threads = [threading.Thread(target=stream, args=(e.port, 40, out, i)) for i in range(3)]
    for t in threads:
        t.start()
    in_flight(e, 3)
    e.proc.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process only
    assert e.wait_log("Draining requests and shutting down")
    assert e.get("/health_generate")[0] == 503
    # SGLang takes a new request during the drain (only health says 503), and finishes it too.
    status, late = e.post("/generate", {"text": "late", "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and late["meta_info"]["completion_tokens"] == 2
    for t in threads:
        t.join(30)
    assert e.wait_exit(30) == 0  # REHEARSAL_EXIT_AFTER_DRAIN=clean (the default)
    assert all(out[i] == (40, True, None) for i in range(3)), out
    assert "Gracefully exiting... Remaining number of requests 3." in e.log
    assert "Remaining number of requests 0. Remaining requests remaining_rids=[]." in e.log
    assert "Health check request received during shutdown. Returning 503." in e.log
    assert not port_open(e.port)


def test_control_group_stop_cuts_requests_in_flight(launch, engine_env):
    """KillMode=control-group: SIGTERM reaches the scheduler too; it dies, the subprocess watchdog
    kills the tree, and the requests in flight are cut, as with SGLang."""
    e = start(launch, engine_env, TP8, REHEARSAL_EXIT_AFTER_DRAIN="sigkill")
    out: dict = {}
    t = threading.Thread(target=stream, args=(e.port, 200, out, 0))
    t.start()
    in_flight(e, 1)
    children = [int(p) for p in open(f"/proc/{e.proc.pid}/task/{e.proc.pid}/children").read().split()]
    assert len(children) == 1 and "sglang::scheduler" in open(f"/proc/{children[0]}/cmdline").read()
    for pid in [e.proc.pid, *children]:  # what control-group does: every process at once
        os.kill(pid, signal.SIGTERM)
    assert e.wait_exit(15) == -signal.SIGKILL  # SGLang's kill_process_tree ends with SIGKILL
    t.join(15)
    chunks, done, _ = out[0]
    assert not done and chunks < 200, out
    assert "Subprocess scheduler_0" in e.log and "crashed with exit code -15" in e.log


def test_force_shutdown_and_slow_drain(launch, engine_env):
    e = start(launch, engine_env, TP8, SGL_FORCE_SHUTDOWN="1")
    out: dict = {}
    t = threading.Thread(target=stream, args=(e.port, 200, out, 0))
    t.start()
    in_flight(e, 1)
    e.proc.send_signal(signal.SIGTERM)
    assert e.wait_exit(15) == 0
    t.join(15)
    assert not out[0][1] and "force shutdown flag set. Force exiting." in e.log

    slow = start(launch, engine_env, TP8, REHEARSAL_FAULT="slow_drain:3", REHEARSAL_DRAIN_POLL_SECONDS="0.2")
    out = {}
    t = threading.Thread(target=stream, args=(slow.port, 20, out, 0))
    t.start()
    in_flight(slow, 1)
    signalled = time.monotonic()
    slow.proc.send_signal(signal.SIGTERM)
    assert slow.wait_exit(30) == 0
    t.join(15)
    assert out[0] == (20, True, None)
    # 20 tokens at 0.05 s would end within 1 s; the slow drain stretches them to 3 s after the signal.
    assert time.monotonic() - signalled >= 2.5


def test_itl_factor_slows_every_token(launch, engine_env):
    # The figure the engine paces tokens by (engine.token_step: what token_delay waits, reported
    # as /server_info's seconds_per_token), not a stopwatch around a request: three times the
    # fixed 0.05 s with the fault, which still answers.
    def pace(e) -> float:
        status, _ = e.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10}})
        assert status == 200
        return e.get("/server_info")[1]["rehearsal"]["performance"]["seconds_per_token"]
    fast = start(launch, engine_env, TP8)
    normal = pace(fast)
    fast.terminate()  # one engine at a time: the simulated GPUs hold one server's memory
    slow = start(launch, engine_env, TP8, REHEARSAL_FAULT="itl_factor:3")
    assert normal == pytest.approx(0.05) and pace(slow) == pytest.approx(3 * normal)
    assert slow.get("/server_info")[1]["rehearsal"]["fault"] == "itl_factor:3"


def test_a_dead_dp_rank_hangs_its_requests_while_health_passes(launch, engine_env):
    e = start(launch, engine_env, DP4, REHEARSAL_FAULT="dead_dp_rank:2", REHEARSAL_SECONDS_PER_TOKEN="0")
    assert e.get("/health_generate")[0] == 200
    for rank in (0, 1, 3):
        status, body = e.post("/generate", {"text": "ping", "sampling_params": {"max_new_tokens": 1}, "routed_dp_rank": rank})
        assert status == 200, body
    with pytest.raises(Exception):  # the wedged rank never answers: the client gives up
        e.post("/generate", {"text": "ping", "sampling_params": {"max_new_tokens": 1}, "routed_dp_rank": 2}, timeout=2)
    status, body = e.post("/generate", {"text": "ping", "routed_dp_rank": 4})
    assert status == 400 and body["error"]["message"] == "routed_dp_rank=4 out of range [0, 4)"
    states = e.get("/server_info")[1]["internal_states"]
    assert [s["dp_rank"] for s in states] == [0, 1, 2, 3] and states[2]["#running-req"] == 1
    assert e.get("/health_generate")[0] == 200


def test_dead_dp_rank_needs_dp(engine_env):
    from tests.standins.helpers import run_engine
    res = run_engine(engine_env(REHEARSAL_FAULT="dead_dp_rank:1"), *TP8)
    assert res.returncode == 1 and "needs a DP rank of this server: --dp-size is 1" in res.stderr


@pytest.mark.parametrize("flags, series", [
    (TP8 + ["--enable-metrics"], [{"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}]),
    (DP4 + ["--enable-metrics"], [{"tp_rank": str(2 * r), "pp_rank": "0", "moe_ep_rank": "0", "dp_rank": str(r)}
                                  for r in range(4)]),
    (["--pp-size", "2", "--tp-size", "4", "--host", "127.0.0.1", "--enable-metrics", "--enable-metrics-for-all-schedulers"],
     [{"tp_rank": str(t), "pp_rank": str(p), "moe_ep_rank": "0"} for p in range(2) for t in range(4)]),
])
def test_metrics_have_sglangs_names_and_labels(launch, engine_env, flags, series):
    e = start(launch, engine_env, flags, REHEARSAL_SECONDS_PER_TOKEN="0")
    e.post("/generate", {"text": "this is a rehearsal", "sampling_params": {"max_new_tokens": 3}})
    with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the real Prometheus parser
    base = {"model_name": str(MODELS / "kimi-k2.6"), "engine_type": "unified"}
    running = families["sglang:num_running_reqs"]
    assert [{k: v for k, v in s.labels.items() if k not in base} for s in running.samples] == series
    for name in ("sglang:token_usage", "sglang:gen_throughput", "sglang:num_queue_reqs", "sglang:cache_hit_rate"):
        assert families[name].type == "gauge"
    assert families["sglang:prompt_tokens"].type == "counter"
    assert [s.value for s in families["sglang:prompt_tokens"].samples if s.name.endswith("_total")] == [4.0]
    assert [s.value for s in families["sglang:generation_tokens"].samples if s.name.endswith("_total")] == [3.0]
    ttft = families["sglang:time_to_first_token_seconds"]
    assert ttft.type == "histogram" and any(s.name.endswith("_count") and s.value == 1.0 for s in ttft.samples)
    assert families["sglang:inter_token_latency_seconds"].type == "histogram"
    # The length histograms only with --collect-tokens-histogram, as in SGLang.
    assert "sglang:prompt_tokens_histogram" not in families and "sglang:generation_tokens_histogram" not in families


def test_collect_tokens_histogram_gives_each_requests_lengths(launch, engine_env):
    """SGLang's --collect-tokens-histogram: every finished request's prompt and generation lengths,
    in the collector's buckets, which the watch reads as a distribution."""
    from components.core import server_metrics as M
    e = start(launch, engine_env, TP8 + ["--enable-metrics", "--collect-tokens-histogram"], REHEARSAL_SECONDS_PER_TOKEN="0",
              REHEARSAL_PERFORMANCE="off")
    for tokens in (3, 3, 150):
        e.post("/generate", {"text": "this is a rehearsal", "sampling_params": {"max_new_tokens": tokens}})
    with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["sglang:prompt_tokens_histogram"].type == "histogram"
    sample = M.server_sample(text, at=1.0, attn_tp_size=8)
    assert sample.prompt_lengths.count == 3 and sample.prompt_lengths.total == 12
    assert sample.generation_lengths.count == 3 and sample.generation_lengths.total == 156
    # Two of three requests under the first bucket (100 tokens), one between 100 and 300.
    assert dict(sample.generation_lengths.buckets)[100.0] == 2 and dict(sample.generation_lengths.buckets)[300.0] == 3
