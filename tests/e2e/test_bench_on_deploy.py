"""Issue 15, point 1, `benchmark.onDeploy: true` on a rehearsal host with the real engine, the
real Pulumi engine and the REAL SGLang client: a preview runs nothing; `pulumi up` deploys,
waits for readiness, then benchmarks, and the stack output `benchmark` has every level with
positive throughput and says rehearsal; an `up` that changes nothing does not benchmark again;
new benchmark settings do."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

# Seconds, not minutes: two small levels (5 x 4 requests of 8 tokens at the most).
BENCH = {"concurrency": [1, 4], "inputLen": 32, "outputLen": 8, "client": "rehearsal", "seed": 5, "onDeploy": True}


def runs(d) -> list:
    base = d.project / "results" / "bench" / "tp8"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def test_up_benchmarks_after_readiness_once(deployment):
    d = deployment
    d.edit_project(lambda config: config.update({"gpu-serving:benchmark": {"value": BENCH}}))
    stack = d.stack("tp8")

    preview = stack.preview(on_output=print)
    assert preview.change_summary.get("create", 0) >= 1
    assert runs(d) == [], "a preview ran the benchmark"

    up = stack.up(on_output=print)
    out = up.outputs["benchmark"].value
    assert up.outputs["readiness"].value["status_when_checked"] == "ready"
    assert out["status"] == "done", out
    assert out["rehearsal"] is True and "not a GPU measurement" in out["note"]
    assert out["sglang_version"].startswith("0.5.") and "rehearsal" in out["server_version"]
    assert sorted(out["levels"], key=int) == ["1", "4"]
    for c, level in out["levels"].items():
        assert level["output_throughput"] > 0 and level["completed"] == 5 * int(c)
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms"):
            assert set(level[metric]) == {"mean", "median", "p99"} and level[metric]["median"] > 0, (c, metric, level)
    [first] = runs(d)
    assert out["results"] == f"results/bench/tp8/{first}"
    folder = d.project / out["results"]
    assert {p.name for p in folder.iterdir()} == {"c1.jsonl", "c4.jsonl", "meta.json"}
    # The benchmark said so in `pulumi up`'s output.
    assert "REHEARSAL: performance model, not a GPU measurement" in up.stdout + up.stderr

    again = stack.up(on_output=print)
    assert runs(d) == [first], "an up that changed nothing ran the benchmark again"
    assert again.outputs["benchmark"].value == out
    assert again.summary.resource_changes.get("update", 0) == 0, again.summary.resource_changes

    # New benchmark settings are a new measurement (the server itself is not touched).
    d.edit_project(lambda config: config["gpu-serving:benchmark"]["value"].update({"concurrency": [2]}))
    third = stack.up(on_output=print)
    assert len(runs(d)) == 2 and sorted(third.outputs["benchmark"].value["levels"]) == ["2"]
    assert third.summary.resource_changes.get("update", 0) == 1, third.summary.resource_changes
