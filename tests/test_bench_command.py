"""`python -m components bench`: the pure parts (components/core/bench.py) with data. The JSONL
in tests/data/bench/ is what the real SGLang client (sglang 0.5.9 bench_serving) wrote against
the rehearsal engine: two levels (concurrency 1 and 32), TP8."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from components.core import bench as B
from components.core.config import parse_settings
from components.core.errors import ConfigError

DATA = Path(__file__).parent / "data" / "bench"
REPO = Path(__file__).resolve().parents[1]
RUN = (DATA / "sglang-0.5.9-rehearsal-tp8-c1-c32.jsonl").read_text()
BASE = {"model": {"profile": "kimi-k2.6"}, "host": {"rehearsal": "x"}}


def settings(**bench):
    return parse_settings("tp8", {**BASE, "benchmark": bench}).benchmark


def test_the_last_line_is_the_run_and_its_figures_are_summarized():
    raw = json.loads(RUN.strip().splitlines()[-1])
    summary = B.summarize(B.last_record(RUN))
    assert summary["concurrency"] == raw["max_concurrency"] == 32
    assert summary["completed"] == raw["completed"]
    for key in B.THROUGHPUTS:
        assert summary[key] == round(raw[key], 3)
    for metric in B.LATENCIES:
        for stat in ("mean", "median", "p99"):
            assert summary[f"{metric}_ms"][stat] == round(raw[f"{stat}_{metric}_ms"], 3)
    assert "rehearsal" in summary["server_version"]


@pytest.mark.parametrize("text, why", [("", "no result line"), ("{not json\n", "not JSON"),
                                       ('{"completed": 3}\n', "no output_throughput")])
def test_a_broken_result_file_is_an_error(text, why):
    with pytest.raises(B.BenchError, match=why):
        B.last_record(text)


def test_level_command_line():
    s = settings(concurrency=[1, 32], inputLen=256, outputLen=32, seed=7)
    argv = B.level_argv(python="/v/bin/python", module="sglang.bench_serving", client="rehearsal", address="127.0.0.1",
                        port=30001, model_path="/models/kimi-k2.6", served_name=None, settings=s, concurrency=32,
                        output_file="/r/c32.jsonl")
    assert argv[0] == "env" and f"PYTHONPATH={B.CLIENT_DIR}" in argv and "HF_HUB_OFFLINE=1" in argv
    flags = dict(zip(argv[argv.index("-m") + 2::2], argv[argv.index("-m") + 3::2]))
    assert flags["--dataset-name"] == "random-ids" and flags["--backend"] == "sglang"
    assert flags["--tokenizer"] == flags["--model"] == "/models/kimi-k2.6"
    assert flags["--num-prompts"] == str(5 * 32) and flags["--max-concurrency"] == "32"
    assert (flags["--random-input-len"], flags["--random-output-len"], flags["--seed"]) == ("256", "32", "7")
    assert flags["--output-file"] == "/r/c32.jsonl"
    venv = B.level_argv(python="/v/bin/python", module="sglang.benchmark.serving", client="venv", address="::1",
                        port=30001, model_path="/m", served_name=None, settings=s, concurrency=1, output_file="/r/c1.jsonl")
    assert not any(a.startswith("PYTHONPATH=") for a in venv) and "sglang.benchmark.serving" in venv
    assert B.level_script(venv, "/r/c1.jsonl").startswith("rm -f -- /r/c1.jsonl && exec env ")


@pytest.mark.parametrize("bench, setting", [
    ({"concurrency": []}, "gpu-serving:benchmark.concurrency"),
    ({"concurrency": [1, 1]}, "gpu-serving:benchmark.concurrency"),
    ({"concurrency": [True]}, "gpu-serving:benchmark.concurrency"),
    ({"concurrency": [0]}, "gpu-serving:benchmark.concurrency[0]"),
    ({"promptsPerConcurrency": 4}, "gpu-serving:benchmark.promptsPerConcurrency"),
    ({"client": "pip"}, "gpu-serving:benchmark.client"),
    ({"rangeRatio": 0}, "gpu-serving:benchmark.rangeRatio"),
    ({"onDeploy": "maybe"}, "gpu-serving:benchmark.onDeploy"),
    ({"concurency": [1]}, "gpu-serving:benchmark.concurency"),
])
def test_bad_benchmark_settings_name_the_setting(bench, setting):
    from components.core.errors import ConfigError
    with pytest.raises(ConfigError) as info:
        parse_settings("tp8", {**BASE, "benchmark": bench})
    assert setting + ":" in str(info.value)


def test_defaults():
    s = settings()
    assert (s.concurrency, s.prompts_per_concurrency, s.on_deploy, s.client) == ([1, 32, 64], 5, False, "venv")
    assert B.prompts(s, 64) == 320


def test_the_rehearsal_client_requirements_are_all_pinned_and_name_sglang():
    specs = B.parse_requirements((REPO / "rehearsal" / "bench_client.txt").read_text())
    assert specs[0].startswith("sglang==")
    assert not any(s.split("==")[0].lower() in ("torch", "triton", "flashinfer-python") for s in specs)
    with pytest.raises(B.BenchError, match="line 1: 'numpy' is not pinned"):
        B.parse_requirements("numpy\n")
    with pytest.raises(B.BenchError, match="no sglang"):
        B.parse_requirements("numpy==2.0.0\n")


def test_a_rehearsal_figure_says_so():
    assert B.is_rehearsal("0.0.1+rehearsal", False) and B.is_rehearsal(None, True)
    assert not B.is_rehearsal("0.5.23", False)
    t = datetime(2026, 12, 1, 2, 3, 4, tzinfo=timezone.utc)
    doc = B.meta(stack="tp8", strategy="tp8", layout={}, host="rehearsal:x", model={}, sglang_version="0.5.9",
                 client_module="sglang.bench_serving", server_version="0.0.1+rehearsal", rehearsal=True, started=t,
                 finished=t, settings=settings(), levels=[])
    assert doc["rehearsal"] is True and "not a GPU measurement" in doc["note"] and doc["time"] == "2026-12-01T02:03:04Z"
    assert B.run_name(t) == "20261201T020304Z"


@pytest.mark.parametrize("serving, readiness, words", [
    (None, None, "does not serve on rehearsal:x: nothing serves"),
    (("sglang-kimi-k2.6-pp8.service", "pp8"), None, "sglang-kimi-k2.6-pp8.service (stack pp8) serves"),
    (("sglang-kimi-k2.6-tp8.service", "tp8"), {"status": "layout_mismatch", "reason": "ep_size 1 != 8"},
     "is layout_mismatch: ep_size 1 != 8"),
    (("sglang-kimi-k2.6-tp8.service", "tp8"), {"status": "unhealthy", "reason": "/health_generate 503"}, "is unhealthy"),
    (("sglang-kimi-k2.6-tp8.service", "tp8"), {"status": "loading", "reason": "port closed"}, "is loading"),
])
def test_only_a_ready_server_of_the_stack_is_benchmarked(serving, readiness, words):
    why = B.refusal("tp8", "sglang-kimi-k2.6-tp8.service", "rehearsal:x", serving, readiness)
    assert why and words in why
    assert B.refusal("tp8", "sglang-kimi-k2.6-tp8.service", "rehearsal:x", ("sglang-kimi-k2.6-tp8.service", "tp8"),
                     {"status": "ready"}) is None


def test_bench_help_says_what_it_runs_and_names_every_flag(capsys):
    """Issue 36.19: `bench --help` listed --stack and --project-dir with no word of what they do."""
    from components.__main__ import main
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Run SGLang's own serving benchmark" in out and "results/bench/<stack>/<UTC time>/" in out
    for flag, says in (("--concurrency", "concurrency levels, comma-separated"), ("--input-len", "input tokens a request"),
                       ("--output-len", "output tokens a request"), ("--stack", "the stack whose serving strategy")):
        assert flag in out and says in out, (flag, out)


def test_bench_flags_replace_the_stacks_workload_for_one_run():
    stack = settings(concurrency=[1, 32, 64], inputLen=1024, outputLen=128)
    run = B.with_flags(stack, concurrency="4, 8", input_len=2048)
    assert (run.concurrency, run.input_len, run.output_len) == ([4, 8], 2048, 128)
    assert B.with_flags(stack) == stack
    with pytest.raises(ConfigError) as info:
        B.with_flags(stack, concurrency="1,x", input_len=0, output_len=2_000_000)
    named = {e.setting: e.rule for e in info.value.errors}
    assert set(named) == {"--concurrency", "--input-len", "--output-len"}, named
    assert "'1,x' is not a list of numbers" in named["--concurrency"]
    with pytest.raises(ConfigError) as info:
        B.with_flags(stack, concurrency="1,1")
    assert [e.setting for e in info.value.errors] == ["--concurrency"] and "levels must differ" in str(info.value)


def test_bad_bench_flags_are_refused_before_any_host_is_reached(tmp_path, capsys):
    """The flags are checked with the stack's settings, before a connection: a project whose host
    does not exist still gets the flag's refusal (exit 2), not a connection error."""
    from components.__main__ import main
    for name in ("Pulumi.yaml", "Pulumi.tp8.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text().replace("rehearsal: default", "rehearsal: nosuchhost"))
    assert main(["bench", "--stack", "tp8", "--project-dir", str(tmp_path), "--input-len", "0"]) == 2
    err = capsys.readouterr().err
    assert "--input-len: Input should be greater than or equal to 1" in err and "nosuchhost" not in err, err
