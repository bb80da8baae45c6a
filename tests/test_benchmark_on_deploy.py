"""`benchmark.onDeploy` (issue 15, point 1): the Benchmark provider's decisions, with the run on
the host replaced (the real run is tests/e2e/test_bench_on_deploy.py): it runs only after a
`ready` verdict, a failure becomes the output's `failed` summary and a warning (never an error
that fails the update), a refresh reads nothing, and only a new server or new settings run it
again. The summary's shape comes from the real client's output (tests/data/bench/)."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from components.core import bench as B
from components.core.config import parse_settings
from components.remote import bench as RB

DATA = Path(__file__).parent / "data" / "bench"
RECORDS = [json.loads(line) for line in (DATA / "sglang-0.5.9-rehearsal-tp8-c1-c32.jsonl").read_text().splitlines()]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-key-body\n"


def props(tmp_path: Path, **over) -> dict:
    return {"connection": {"host": "10.213.9.2", "port": 22, "user": "root", "privateKey": KEY, "hostKey": "k"},
            "stack": "tp8", "strategy": "tp8", "unit": "sglang-kimi-k2.6-tp8.service", "declared": {"tp_size": 8},
            "describe": "tp 8, pp 1, ep 1, dp 1", "target": "10.213.9.2", "hostLabel": "10.213.9.2",
            "model": {"name": "kimi-k2.6", "path": "/models/kimi-k2.6"}, "python": "/opt/v/bin/python",
            "bind": "127.0.0.1", "port": 30001, "benchmark": {"concurrency": [1, 32]}, "rehearsalHost": True,
            "unitConfig": "a" * 64, "started": "2026-12-01T03:00:00Z", "readinessStatus": "ready", "mismatches": [],
            "projectDir": str(tmp_path), "resultsDir": "results/bench", **over}


def meta_doc() -> dict:
    settings = parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "host": {"rehearsal": "x"},
                                      "benchmark": {"concurrency": [1, 32]}}).benchmark
    t = datetime(2026, 12, 1, 3, 1, 0, tzinfo=timezone.utc)
    return B.meta(stack="tp8", strategy="tp8", layout={"tp_size": 8, "describe": "tp 8, pp 1, ep 1, dp 1"}, host="h",
                  model={"name": "kimi-k2.6", "path": "/m"}, sglang_version="0.5.9", client_module="sglang.bench_serving",
                  server_version="0.0.1+rehearsal", rehearsal=True, started=t, finished=t, settings=settings,
                  levels=[B.summarize(r) for r in RECORDS])


def test_the_stack_output_has_every_level_with_its_figures_and_says_rehearsal():
    summary = B.deploy_summary(meta_doc(), "results/bench/tp8/20261201T030100Z")
    assert summary["status"] == "done" and summary["rehearsal"] is True and "not a GPU measurement" in summary["note"]
    assert (summary["sglang_version"], summary["server_version"]) == ("0.5.9", "0.0.1+rehearsal")
    assert summary["results"] == "results/bench/tp8/20261201T030100Z" and summary["layout"] == "tp 8, pp 1, ep 1, dp 1"
    assert sorted(summary["levels"]) == ["1", "32"]
    for record in RECORDS:
        level = summary["levels"][str(record["max_concurrency"])]
        assert level["output_throughput"] == round(record["output_throughput"], 3) > 0
        for metric in ("ttft", "itl", "tpot", "e2e_latency"):
            assert level[f"{metric}_ms"] == {s: round(record[f"{s}_{metric}_ms"], 3) for s in ("mean", "median", "p99")}


@pytest.mark.parametrize("status, mismatches, why", [
    ("timed_out", [], "readiness is 'timed_out', not 'ready'"),
    (None, [], "readiness is None"),
    ("ready", ["tp_size: declared 8, running 4"], "does not run the declared layout"),
])
def test_no_run_unless_ready_in_the_declared_layout(tmp_path, monkeypatch, capsys, status, mismatches, why):
    monkeypatch.setattr(RB, "run_on_host", lambda *a, **k: pytest.fail("benchmarked a server that is not ready"))
    summary = RB.BenchmarkProvider()._run(props(tmp_path, readinessStatus=status, mismatches=mismatches))
    assert summary["status"] == "failed" and why in summary["reason"] and summary["levels"] == {}
    assert "warning: benchmark not run: " in capsys.readouterr().err


def test_a_failed_benchmark_is_the_outputs_failure_not_the_updates(tmp_path, monkeypatch, capsys):
    def fails(t, spec, root, progress):
        raise RB.ssh.RemoteError(f"benchmark level 32 timed out (key was {KEY.strip()})")
    monkeypatch.setattr(RB, "run_on_host", fails)
    result = RB.BenchmarkProvider().create(props(tmp_path))
    summary = result.outs["summary"]
    assert summary["status"] == "failed" and "benchmark level 32 timed out" in summary["reason"]
    assert "secret-key-body" not in json.dumps(summary)
    err = capsys.readouterr().err
    assert "warning: the benchmark failed; sglang-kimi-k2.6-tp8.service stays deployed and ready" in err
    assert "secret-key-body" not in err
    # Any exception, not only the expected ones: a measurement never fails a deployment.
    monkeypatch.setattr(RB, "run_on_host", lambda *a: {}["boom"])
    assert RB.BenchmarkProvider().update("id", {}, props(tmp_path)).outs["summary"]["reason"] == "KeyError: 'boom'"


def test_a_run_keeps_its_results_under_the_project_and_names_the_folder(tmp_path, monkeypatch, capsys):
    seen = {}

    def runs(t, spec, root, progress):
        seen.update(target=(t.host, t.port), root=root, spec=spec)
        out = root / "tp8" / "20261201T030100Z"
        out.mkdir(parents=True)
        return out, meta_doc()
    monkeypatch.setattr(RB, "run_on_host", runs)
    result = RB.BenchmarkProvider().create(props(tmp_path))
    assert result.id == "10.213.9.2:sglang-kimi-k2.6-tp8.service:benchmark"
    assert seen["root"] == tmp_path / "results" / "bench" and seen["target"] == ("10.213.9.2", 22)
    assert seen["spec"]["unit"] == "sglang-kimi-k2.6-tp8.service" and seen["spec"]["benchmark"]["concurrency"] == [1, 32]
    summary = result.outs["summary"]
    assert summary["status"] == "done" and summary["results"] == "results/bench/tp8/20261201T030100Z"
    assert "benchmark: results in results/bench/tp8/20261201T030100Z (REHEARSAL" in capsys.readouterr().err


def test_only_a_new_server_or_new_settings_run_it_again(tmp_path):
    p = RB.BenchmarkProvider()
    done = {**props(tmp_path), "summary": {"status": "done"}}
    assert not p.diff("id", done, props(tmp_path)).changes
    # Readiness re-read by a refresh, the project moved: no new measurement.
    assert not p.diff("id", done, props(tmp_path, readinessStatus="stopped", projectDir="/elsewhere")).changes
    for key, value in [("started", "2026-12-01T04:00:00Z"), ("unitConfig", "b" * 64), ("declared", {"tp_size": 4}),
                       ("benchmark", {"concurrency": [1]}), ("unit", "sglang-kimi-k2.6-pp8.service")]:
        assert p.diff("id", done, props(tmp_path, **{key: value})).changes, key
    # The last one failed: the next `up` tries again.
    assert p.diff("id", {**done, "summary": {"status": "failed"}}, props(tmp_path)).changes


def test_a_refresh_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(RB.ssh, "fetch", lambda *a, **k: pytest.fail("a refresh read the host"))
    state = {**props(tmp_path), "summary": {"status": "done", "levels": {"1": {}}}}
    assert RB.BenchmarkProvider().read("id", state).outs == state
