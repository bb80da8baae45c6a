"""The rehearsal engine: SGLang's command line, rules, HTTP surface and injected faults, for real."""
from __future__ import annotations

import sys
import time

import pytest

from tests.standins.helpers import ENGINE_SRC, EP8_FLAGS, MODELS, free_port, http, port_open, run_engine

sys.path.insert(0, str(ENGINE_SRC))
from sglang._rehearsal import rules  # noqa: E402
from sglang._rehearsal.args import parse  # noqa: E402
from sglang._rehearsal.main import read_model  # noqa: E402


# --------------------------------------------------------------------------- pure rules

def kimi():
    return read_model(str(MODELS / "kimi-k2.6"))


def test_pp_split_puts_the_remainder_on_the_last_stages():
    assert rules.pp_partition(61, 8, None) == [7, 7, 7, 8, 8, 8, 8, 8]
    assert rules.pp_partition(61, 2, None) == [30, 31]
    assert rules.pp_partition(61, 2, "31,30") == [31, 30]
    with pytest.raises(rules.Refusal, match="does not match num_hidden_layers=61"):
        rules.pp_partition(61, 2, "30,30")


def test_mla_kv_bytes_per_token_are_not_divided_by_tp():
    args = parse(["--model-path", "x", "--tp-size", "8"])
    model = kimi()
    assert rules.kv_per_token(args, model, 61, 2) == (512 + 64) * 61 * 2 == 70272


def test_world_size_and_ep():
    args = parse(["--model-path", "x", "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention", "--ep-size", "8"])
    assert rules.compute_world_size(args) == 8
    args = parse(["--model-path", "x", "--tp-size", "8", "--dp-size", "8"])
    assert rules.compute_world_size(args) == 64


def test_memory_plan_for_ep8_on_rtx_pro_6000():
    args = parse(["--model-path", "x", *EP8_FLAGS])
    model = kimi()
    rules.resolve_args(args, model, {}, 97887 - 637)
    free = [(97887 - 637) * rules.MiB] * 8
    plan = rules.plan_memory(args, model, free, {})
    rules.finish_memory(args, plan)
    weights = 590 * rules.GiB / 8
    assert plan.weights_per_gpu == [pytest.approx(weights)]
    assert plan.max_total_num_tokens == int((free[0] * 0.88 - weights) // 70272)
    assert plan.max_running_requests == 64


def test_default_max_running_requests_follows_the_token_budget():
    args = parse(["--model-path", "x", "--tp-size", "8", "--context-length", "32768"])
    model = kimi()
    rules.resolve_args(args, model, {}, 97250)
    plan = rules.plan_memory(args, model, [97250 * rules.MiB] * 8, {})
    rules.finish_memory(args, plan)
    assert plan.max_running_requests == min(max(int(plan.max_total_num_tokens / 32768 * 512), 2048), 4096)


# --------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("flags, message", [
    (["--pp", "8"], "ambiguous option: --pp could match --pp-size"),
    (["--enable-ep-moe"], "unrecognized arguments: --enable-ep-moe"),
    (["--enable-deepep-moe"], "unrecognized arguments: --enable-deepep-moe"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--attention-backend", "bogus"], "argument --attention-backend: invalid choice: 'bogus'"),
    (["--grammar-backend", "bogus"], "argument --grammar-backend: invalid choice: 'bogus'"),
])
def test_argparse_errors_exit_2(engine_env, flags, message):
    res = run_engine(engine_env(), "--tp-size", "8", *flags)
    assert res.returncode == 2, res.stderr
    assert "usage: sglang serve" in res.stderr and "sglang serve: error: " + message in res.stderr


def test_tp_and_dp_work_as_prefixes(launch):
    engine = launch("--tp", "8", "--dp", "8", "--enable-dp-attention", "--ep", "8", "--mem-fraction-static", "0.92")
    engine.wait_ready()
    info = engine.get("/server_info")[1]
    assert (info["tp_size"], info["dp_size"], info["ep_size"], info["enable_dp_attention"]) == (8, 8, 8, True)
    assert len(info["internal_states"]) == 8
    assert engine.terminate() == 0


# --------------------------------------------------------------------------- refused starts

def test_tp8_pp8_needs_64_gpus(engine_env):
    res = run_engine(engine_env(), "--tp-size", "8", "--pp-size", "8", "--port", str(free_port()))
    assert res.returncode != 0
    assert "CUDA error: invalid device ordinal" in res.stderr
    assert "world size 64" in res.stderr and "only 8 are visible" in res.stderr
    assert "ready to roll" not in res.stderr


def test_cuda_visible_devices_limits_the_gpus(engine_env):
    res = run_engine(engine_env(CUDA_VISIBLE_DEVICES="0,1,2,3"), "--tp-size", "8", "--port", str(free_port()))
    assert res.returncode != 0 and "only 4 are visible" in res.stderr
    res = run_engine(engine_env(CUDA_VISIBLE_DEVICES=""), "--tp-size", "1", "--port", str(free_port()))
    assert res.returncode != 0 and "No CUDA GPUs are available" in res.stderr


def test_memory_that_cannot_fit(engine_env):
    res = run_engine(engine_env(), "--tp-size", "8", "--ep-size", "8", "--mem-fraction-static", "0.5",
                     "--port", str(free_port()))
    assert res.returncode != 0
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in res.stderr
    assert "Load weight begin" in res.stderr and "ready to roll" not in res.stderr


def test_weights_larger_than_a_gpu_run_out_of_memory_while_loading(engine_env):
    res = run_engine(engine_env(), "--tp-size", "4", "--port", str(free_port()))
    assert res.returncode != 0 and "torch.OutOfMemoryError: CUDA out of memory" in res.stderr


@pytest.mark.parametrize("flags, message", [
    (["--tp-size", "1", "--ep-size", "8"], "ZeroDivisionError"),
    (["--tp-size", "8", "--ep-size", "5"], "tp_size (8) is not divisible by ep_size (5)"),
    (["--tp-size", "8", "--dp-size", "3", "--enable-dp-attention"], "tp_size (8) must be divisible by dp_size (3)"),
    (["--tp-size", "2", "--pp-size", "4", "--speculative-algorithm", "EAGLE"],
     "Pipeline parallelism is not compatible with overlap schedule, speculative decoding"),
    (["--tp-size", "8", "--moe-a2a-backend", "flashinfer"],
     "Flashinfer MoE A2A is only supported with dp_size == tp_size and --enable-dp-attention"),
    (["--tp-size", "8", "--context-length", "300000"], "is greater than the derived context_length (262144)"),
    (["--tp-size", "6"], "64 is not divisible by 6"),
])
def test_sglang_rules_refuse_bad_layouts(engine_env, flags, message):
    res = run_engine(engine_env(), *flags, "--port", str(free_port()))
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_pp_layer_partition_env_is_checked(engine_env):
    res = run_engine(engine_env(SGLANG_PP_LAYER_PARTITION="30,30"), "--pp-size", "2", "--tp-size", "4",
                     "--port", str(free_port()))
    assert res.returncode != 0 and "does not match num_hidden_layers=61" in res.stderr


def test_missing_model_directory(engine_env, tmp_path):
    res = run_engine(engine_env(), "--tp-size", "8", model=str(tmp_path / "no-such-model"))
    assert res.returncode == 1 and "HFValidationError" in res.stderr and "does not exist" in res.stderr
    (tmp_path / "empty").mkdir()
    res = run_engine(engine_env(), model=str(tmp_path / "empty"))
    assert res.returncode == 1 and "does not appear to have a file named config.json" in res.stderr


# --------------------------------------------------------------------------- resolved values

def test_dp_size_1_turns_dp_attention_off_and_a2a_rewrites_ep(launch, engine_env):
    # DeepEP needs NVLink (below): the H200 board has it between every pair.
    engine = launch("--tp-size", "8", "--enable-dp-attention", "--moe-a2a-backend", "deepep", env=engine_env("h200-8"))
    engine.wait_ready()
    info = engine.get("/server_info")[1]
    assert info["enable_dp_attention"] is False and info["dp_size"] == 1
    assert info["ep_size"] == 8 and info["moe_a2a_backend"] == "deepep"
    assert "deepep MoE is enabled. The expert parallel size is adjusted" in engine.log
    assert engine.terminate() == 0


def test_deepep_on_a_pcie_host_fails_while_loading_as_deepep_does(launch, engine_env):
    """Issue 36.1: DeepEP's normal mode asserts NVLink between every pair of the node's GPUs when
    SGLang makes its buffer (the graph capture): after the weights loaded, the port never open."""
    engine = launch("--tp-size", "8", "--ep-size", "8", "--moe-a2a-backend", "deepep",
                    env=engine_env(REHEARSAL_LOAD_SECONDS="0.3"))
    assert engine.wait_exit() == 1, engine.log
    log = engine.log
    assert "AssertionError: GPU 0 and GPU 1 are not connected via NVLink" in log, log
    assert log.index("Load weight end") < log.index("Capture cuda graph begin") < log.index("AssertionError")
    assert "rehearsal: --moe-a2a-backend deepep: DeepEP moves tokens over NVLink" in log
    assert "HTTP server listening" not in log and "fired up" not in log
    # The same layout without DeepEP, or on the NVLink board, starts.
    for flags, profile in ((["--moe-a2a-backend", "none"], "rtx-pro-6000-8"), (["--moe-a2a-backend", "deepep"], "h200-8")):
        engine = launch("--tp-size", "8", "--ep-size", "8", *flags, env=engine_env(profile))
        engine.wait_ready()
        assert engine.terminate() == 0


def test_pp8_on_8_gpus_splits_layers(launch):
    engine = launch("--pp-size", "8")
    engine.wait_ready()
    info = engine.get("/server_info")[1]
    assert info["pp_size"] == 8 and info["tp_size"] == 1 and info["disable_overlap_schedule"] is True
    assert info["rehearsal"]["pp_layer_partition"] == [7, 7, 7, 8, 8, 8, 8, 8]
    assert " PP0] Load weight begin" in engine.log
    assert engine.terminate() == 0


def test_deepseek_v3_tp8_on_h200(launch, engine_env):
    engine = launch("--tp-size", "8", model="deepseek-v3", env=engine_env("h200-8"))
    engine.wait_ready()
    info = engine.get("/server_info")[1]
    assert info["served_model_name"] == info["model_path"] and info["context_length"] == 163840
    assert info["rehearsal"]["weights_per_gpu_gib"] == [80.25]  # 642 GiB FP8 / 8
    assert info["rehearsal"]["gpus"][0]["name"] == "NVIDIA H200"
    assert engine.terminate() == 0


# --------------------------------------------------------------------------- HTTP surface

def test_http_surface(launch):
    engine = launch("--tp-size", "8", "--ep-size", "8", "--served-model-name", "kimi-k2.6", "--context-length", "32768")
    engine.wait_ready()
    port = engine.port
    status, models = engine.get("/v1/models")
    assert status == 200 and models["data"][0]["id"] == "kimi-k2.6" and models["data"][0]["max_model_len"] == 32768
    status, out = engine.post("/generate", {"text": "hello there", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and len(out["text"].split()) == 4
    assert out["meta_info"]["completion_tokens"] == 4 and out["meta_info"]["finish_reason"]["type"] == "length"
    status, batch = engine.post("/generate", {"text": ["a", "b c"], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and [b["meta_info"]["prompt_tokens"] for b in batch] == [1, 2]
    status, err = http("POST", port, "/v1/chat/completions", body=b'{"messages": []}',
                       headers={"Content-Type": "text/plain"})
    assert status == 400 and "application/json" in err["message"]
    status, chat = engine.post("/v1/chat/completions", {"model": "kimi-k2.6", "max_tokens": 3,
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3
    assert chat["choices"][0]["message"]["role"] == "assistant"
    status, info = engine.get("/model_info")
    assert status == 200 and info["model_path"].endswith("kimi-k2.6") and info["is_generation"] is True
    assert engine.get("/get_model_info")[0] == 200
    assert engine.get("/ping")[0] == 200
    status, old = engine.get("/get_server_info")
    assert status == 200 and old["tp_size"] == 8
    assert "/get_server_info endpoint is deprecated" in engine.log
    assert engine.get("/no/such/path")[0] == 404
    status, err = engine.post("/generate", {"text": "x " * 40000})
    assert status == 400 and "longer than the model's context length" in err["error"]["message"]
    assert engine.terminate() == 0


def test_api_key(launch):
    engine = launch("--tp-size", "8", "--api-key", "sekret")
    engine.wait_ready()
    assert engine.get("/health")[0] == 200  # health stays open, as in SGLang
    assert engine.get("/server_info")[0] == 401
    assert engine.get("/server_info", headers={"Authorization": "Bearer sekret"})[0] == 200
    assert engine.terminate() == 0


# --------------------------------------------------------------------------- faults

def test_fault_crash_during_load(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="crash_during_load", REHEARSAL_LOAD_SECONDS="0.4"))
    assert engine.wait_exit() != 0
    assert "Scheduler hit an exception: Traceback (most recent call last):" in engine.log
    assert "rehearsal fault crash_during_load" in engine.log and "HTTP server listening" not in engine.log


def test_fault_crash_printing_environment_logs_the_token_it_was_given(launch, engine_env):
    # The server's own leak, for the deploy's redaction to be tested against (e2e/test_hardening_secrets.py):
    # the token's value on the traceback's last line, other variables' beside it, nothing else's.
    token = "hf_StandInTokenForTheLeakingFault0123"
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="crash_printing_environment", REHEARSAL_LOAD_SECONDS="0.4",
                                                     HF_TOKEN=token, NCCL_ALGO="Ring", PT_NOT_DUMPED="x"))
    assert engine.wait_exit() != 0
    line = next(x for x in engine.log.splitlines() if "TP0] OSError: could not load the checkpoint's weights" in x)
    assert "environment of the failed process: " in line and f"HF_TOKEN={token}" in line and "NCCL_ALGO=Ring" in line, line
    assert "PT_NOT_DUMPED" not in engine.log and "HTTP server listening" not in engine.log


def test_fault_oom_during_load(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="oom_during_load"))
    assert engine.wait_exit() != 0 and "torch.OutOfMemoryError" in engine.log


def test_fault_hang_during_load(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="hang_during_load"))
    assert engine.wait_log("Load weight begin")
    time.sleep(1.0)
    assert engine.proc.poll() is None and not port_open(engine.port)
    assert engine.terminate() == 0  # SIGTERM still stops it cleanly


def test_fault_die_after_requests(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="die_after_requests:2"))
    engine.wait_ready()
    assert engine.get("/health_generate")[0] == 200  # health checks do not count
    # Two tokens: a default 128-token answer is paced by the performance model at ~5 s, the
    # helper's whole timeout.
    assert engine.post("/generate", {"text": "one", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    assert engine.post("/v1/completions", {"prompt": "two", "max_tokens": 2})[0] == 200
    assert engine.wait_exit() == 1
    assert not port_open(engine.port)
    assert "die_after_requests:2" in engine.log


def test_fault_health_fail_after_ready(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_FAULT="health_fail_after_ready"))
    engine.wait_ready()
    assert engine.get("/health_generate")[0] == 503 and engine.get("/health")[0] == 503
    assert engine.get("/server_info")[0] == 200
    assert engine.terminate() == 0


def test_fault_rewrite_layout(launch, engine_env):
    engine = launch(*EP8_FLAGS, env=engine_env(REHEARSAL_FAULT="rewrite_layout"))
    engine.wait_ready()
    info = engine.get("/server_info")[1]
    assert info["tp_size"] == 8 and info["ep_size"] != 8
    assert engine.terminate() == 0


def test_unknown_fault_is_refused(engine_env):
    res = run_engine(engine_env(REHEARSAL_FAULT="explode"), "--tp-size", "8", "--port", str(free_port()))
    assert res.returncode == 1 and "is not a known fault" in res.stderr


def test_sigterm_during_load_exits_cleanly(launch, engine_env):
    engine = launch("--tp-size", "8", env=engine_env(REHEARSAL_LOAD_SECONDS="30"))
    assert engine.wait_log("Load weight begin")
    assert engine.terminate() == 0


def test_port_in_use(launch, engine_env):
    first = launch("--tp-size", "8")
    first.wait_ready()
    second = launch("--tp-size", "8", port=first.port, env=engine_env(REHEARSAL_GPU_STATE_DIR="/nonexistent-x"))
    assert second.wait_exit() == 1 and "address already in use" in second.log
    assert first.terminate() == 0
