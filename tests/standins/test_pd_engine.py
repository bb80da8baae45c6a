"""The rehearsal engine's prefill/decode mode, for real on loopback (issue 41): a prefill and a
decode engine process, each with its own simulated GPUs, and the request sent to both with the
same bootstrap host/port/room, as SGLang's router does. The KV cache crosses a TCP connection
between them; a wrong port, a dead prefill server, a prefill that dies mid-transfer and a
bootstrap server that never starts fail with SGLang's messages and counters."""
from __future__ import annotations

import random
import re
import threading
import time

import pytest

from tests.standins.helpers import free_port, run_engine

KIMI_KV_BYTES = (512 + 64) * 61 * 2   # 70,272 B a token
LAYOUT = ["--tp-size", "8", "--ep-size", "8", "--host", "127.0.0.1", "--enable-metrics"]
FAST = {"REHEARSAL_PERFORMANCE": "off", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "4", "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2"}
PROMPT = " ".join(f"w{i}" for i in range(40))  # 40 tokens of the stand-in tokenizer


@pytest.fixture
def pair(launch, engine_env, tmp_path):
    """start(role, **env) -> Engine with its own GPU state directory; `bootstrap_port` shared."""
    bootstrap_port = free_port()

    def start(role: str, port=None, **env):
        state = tmp_path / f"gpu-{role}-{time.monotonic_ns()}"
        state.mkdir()
        flags = [*LAYOUT, "--disaggregation-mode", role]
        if role == "prefill":
            flags += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
        engine = launch(*flags, port=port, env=engine_env(REHEARSAL_GPU_STATE_DIR=state, **{**FAST, **env}))
        engine.wait_ready(60)
        return engine

    start.bootstrap_port = bootstrap_port
    return start


def route(prefill, decode, bootstrap_port: int, prompt: str = PROMPT, max_new_tokens: int = 8, only_decode=False):
    """What SGLang's router does in PD mode: the same body, with the prefill server's bootstrap
    host, port and a room, to both servers at once. Returns (prefill answer, decode answer)."""
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap_port, "bootstrap_room": random.randrange(2 ** 63)}
    out: dict = {}
    thread = None
    if not only_decode:
        thread = threading.Thread(target=lambda: out.update(prefill=_post(prefill, body)))
        thread.start()
    out["decode"] = _post(decode, body)
    if thread:
        thread.join(60)
    return out.get("prefill"), out["decode"]


def _post(engine, body):
    try:
        return engine.post("/generate", body, timeout=60)
    except OSError as exc:  # the prefill server died with the request open
        return (0, str(exc))


def metric(engine, name: str, **labels) -> float:
    status, text = engine.get("/metrics")
    assert status == 200
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    assert seen, f"{name} {labels} not in /metrics"
    return total


def pd_info(engine) -> dict:
    return engine.get("/server_info")[1]["rehearsal"]["disaggregation"]


def test_a_generation_moves_the_prompts_kv_cache_from_prefill_to_decode(pair):
    prefill, decode = pair("prefill"), pair("decode")
    p, d = route(prefill, decode, pair.bootstrap_port)
    assert p[0] == 200 and p[1]["meta_info"]["completion_tokens"] == 1  # the prefill server answers one token
    assert d[0] == 200 and d[1]["meta_info"]["completion_tokens"] == 8
    assert d[1]["output_ids"][0] == p[1]["output_ids"][0]  # decode continues from the prefill's first token
    moved = 40 * KIMI_KV_BYTES
    assert pd_info(prefill)["kv_bytes"] == pd_info(decode)["kv_bytes"] == moved
    # Where SGLang shows it: the prefill side's transfer histogram, the decode side's stage.
    assert metric(prefill, "sglang:kv_transfer_total_mb_sum") == pytest.approx(moved / 2 ** 20)
    assert metric(prefill, "sglang:kv_transfer_total_mb_count") == 1
    assert metric(decode, "sglang:per_stage_req_latency_seconds_count", stage="decode_transferred") == 1
    info = prefill.get("/server_info")[1]
    assert info["disaggregation_mode"] == "prefill" and info["disaggregation_decode_tp"] == 8
    assert info["disaggregation_bootstrap_port"] == pair.bootstrap_port
    assert decode.get("/server_info")[1]["disaggregation_mode"] == "decode"


def test_a_green_pair_has_moved_no_kv_cache_yet(pair):
    """SGLang's warm-up and /health_generate use the fake bootstrap host 2.2.2.2: ready and
    healthy on both sides while no byte of KV cache crossed."""
    prefill, decode = pair("prefill"), pair("decode")
    assert prefill.get("/health_generate")[0] == decode.get("/health_generate")[0] == 200
    assert metric(decode, "sglang:per_stage_req_latency_seconds_count", stage="fake_output") == 1
    assert metric(decode, "sglang:per_stage_req_latency_seconds_count", stage="decode_transferred") == 0
    assert metric(prefill, "sglang:kv_transfer_total_mb_count") == 0
    assert pd_info(prefill)["kv_bytes"] == pd_info(decode)["kv_bytes"] == 0


def test_a_wrong_bootstrap_port_fails_both_sides_with_sglangs_messages(pair):
    prefill, decode = pair("prefill"), pair("decode")
    wrong = free_port()
    p, d = route(prefill, decode, wrong)
    assert d[0] == 500
    assert re.search(r"Decode handshake failed for request rank=0 .*KVTransferError\(bootstrap_room=\d+\): Could not fetch "
                     rf"prefill parallel info from 127\.0\.0\.1:{wrong} after 15 attempts", d[1]["error"]["message"]), d
    # The prefill server never hears from the decode side: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.
    assert p[0] == 500 and "timed out after 3.0s in KVPoll.Bootstrapping" in p[1]["error"]["message"], p
    assert metric(decode, "sglang:num_bootstrap_failed_reqs_total") == 1
    assert metric(prefill, "sglang:num_bootstrap_failed_reqs_total") == 1
    assert pd_info(decode)["kv_bytes"] == 0


def test_the_decode_side_times_out_waiting_for_kv_that_never_comes(pair):
    """The decode side bootstrapped (the prefill server is up), but no prefill request for the
    room arrives: SGLANG_DISAGGREGATION_WAITING_TIMEOUT."""
    prefill, decode = pair("prefill"), pair("decode")
    _, d = route(prefill, decode, pair.bootstrap_port, only_decode=True)
    assert d[0] == 500 and re.search(r"Decode transfer failed .*: Request \d+ timed out after 4\.\ds in "
                                     r"KVPoll\.WaitingForInput", d[1]["error"]["message"]), d
    assert metric(decode, "sglang:num_transfer_failed_reqs_total") == 1


def test_a_dead_prefill_server_is_lost_by_the_heartbeat_and_found_again_when_it_returns(pair):
    prefill, decode = pair("prefill"), pair("decode")
    port = prefill.port
    assert route(prefill, decode, pair.bootstrap_port)[1][0] == 200
    prefill.proc.kill()
    prefill.proc.wait(10)
    # Two missed heartbeats 2 s apart: the decode side drops the prefill server.
    assert decode.wait_log(f"Lost connection with prefill instance (bootstrap_addr: 127.0.0.1:{pair.bootstrap_port}), "
                           "0 requests affected", timeout=20), decode.log[-3000:]
    _, d = route(prefill, decode, pair.bootstrap_port, only_decode=True)
    assert d[0] == 500 and "Decode handshake failed" in d[1]["error"]["message"], d
    # Back on the same ports: the decode server looks it up again, no restart.
    again = pair("prefill", port=port)
    p, d = route(again, decode, pair.bootstrap_port)
    assert p[0] == d[0] == 200
    assert pd_info(decode)["kv_bytes"] == 2 * 40 * KIMI_KV_BYTES


def test_a_prefill_server_that_dies_mid_transfer_fails_the_request_on_the_decode_side(pair):
    prefill, decode = pair("prefill", REHEARSAL_FAULT="prefill_dies_mid_transfer"), pair("decode")
    p, d = route(prefill, decode, pair.bootstrap_port, prompt=" ".join(["w"] * 400))
    assert d[0] == 500 and re.search(r"Decode transfer failed for request rank=0 .*KVTransferError\(bootstrap_room=\d+\): "
                                     "Failed to get kvcache from prefill instance, it might be dead",
                                     d[1]["error"]["message"]), d
    assert p[0] in (0, 500), p  # the prefill server died with the request open
    assert prefill.wait_exit(10) == 1
    assert "rehearsal fault prefill_dies_mid_transfer" in prefill.log
    assert pd_info(decode)["kv_bytes"] == 0 and metric(decode, "sglang:num_transfer_failed_reqs_total") == 1


def test_a_bootstrap_server_that_never_starts_leaves_the_decode_side_nothing_to_look_up(pair):
    prefill = pair("prefill", REHEARSAL_FAULT="bootstrap_never_starts")
    decode = pair("decode")
    for line in ("Prefill register attempt 1/5 failed: ConnectionRefusedError",
                 "Prefill instance failed to register to bootstrap server after 5 retries"):
        assert line in prefill.log, prefill.log[-3000:]
    p, d = route(prefill, decode, pair.bootstrap_port)
    assert d[0] == 500 and "Could not fetch prefill parallel info" in d[1]["error"]["message"], d
    assert p[0] == 500 and "KVPoll.Bootstrapping" in p[1]["error"]["message"], p


@pytest.mark.parametrize("flags, text", [
    (["--disaggregation-mode", "decode", "--disaggregation-decode-tp", "8"],
     "AssertionError: Cannot set --disaggregation-decode-tp for the decode engine."),
    (["--disaggregation-mode", "prefill", "--disaggregation-decode-tp", "3"],
     "AssertionError: Different tp size is supported only when one tp is multiple of the other. decode_tp=3, prefill_tp=8"),
])
def test_sglangs_disaggregation_rules_refuse_at_start(engine_env, flags, text):
    done = run_engine(engine_env(), *LAYOUT, *flags, "--port", str(free_port()))
    assert done.returncode == 1 and text in done.stderr, done.stderr[-2000:]


def test_a_prefill_fault_on_a_decode_server_is_refused(engine_env):
    done = run_engine(engine_env(REHEARSAL_FAULT="prefill_dies_mid_transfer"), *LAYOUT, "--disaggregation-mode", "decode",
                      "--port", str(free_port()))
    assert done.returncode == 1 and "needs a prefill server (--disaggregation-mode prefill)" in done.stderr
