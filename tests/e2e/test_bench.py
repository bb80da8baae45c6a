"""Issue 15, points 1 and 3, on a rehearsal host with the real engine and the REAL SGLang client:
`python -m components bench` installs sglang's benchmark client (the real wheel, no GPU
dependencies, from wheels pushed from this machine), runs it on the host against the ready
server, one level per concurrency, and keeps the client's JSONL plus meta.json; the rehearsal
engine's performance model makes PP8 win one stream and TP8 win 32; a stack that does not
serve (or is not ready) is refused before any benchmark runs."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.pulumi_env import REPO

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

# Short runs: the shape, not a long measurement (a level of 5 x 32 requests of 16 tokens).
BENCH = {"concurrency": [1, 32], "inputLen": 64, "outputLen": 16, "client": "rehearsal", "seed": 3}


def bench(d, stack: str) -> subprocess.CompletedProcess:
    env = {**d.env, "PATH": f"{REPO / '.venv' / 'bin'}:{d.env.get('PATH', '')}"}
    return subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "components", "bench", "--stack", stack],
                          cwd=d.project, env=env, capture_output=True, text=True, timeout=1500)


def results(d, stack: str) -> tuple[dict, dict]:
    runs = sorted((d.project / "results" / "bench" / stack).iterdir())
    meta = json.loads((runs[-1] / "meta.json").read_text())
    by_level = {}
    for c in BENCH["concurrency"]:
        lines = (runs[-1] / f"c{c}.jsonl").read_text().strip().splitlines()
        by_level[c] = json.loads(lines[-1])
    return meta, by_level


def test_bench_tp8_then_pp8_with_the_real_client(deployment):
    d = deployment
    d.edit_project(lambda config: config.update({"gpu-serving:benchmark": {"value": BENCH}}))
    d.stack("tp8").up(on_output=print)

    # pp8 does not serve: refused before anything runs
    refused = bench(d, "pp8")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "stack pp8 does not serve" in refused.stderr and "sglang-kimi-k2.6-tp8.service" in refused.stderr

    done = bench(d, "tp8")
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "level 1/2: concurrency 1" in done.stdout and "level 2/2: concurrency 32" in done.stdout
    assert "REHEARSAL" in done.stdout
    tp_meta, tp = results(d, "tp8")
    assert tp_meta["rehearsal"] is True and "rehearsal" in tp_meta["server_version"]
    assert tp_meta["sglang_version"].startswith("0.5.") and tp_meta["client"]["module"].startswith("sglang.")
    assert tp_meta["layout"]["tp_size"] == 8 and tp_meta["stack"] == "tp8"
    for c, record in tp.items():  # the real client measured streamed tokens
        assert record["completed"] == 5 * c and record["max_concurrency"] == c
        assert record["median_ttft_ms"] > 0 and record["median_itl_ms"] > 0

    d.stack("pp8").up(on_output=print)
    done = bench(d, "pp8")
    assert done.returncode == 0, done.stdout + done.stderr
    _, pp = results(d, "pp8")
    print({c: (tp[c]["output_throughput"], pp[c]["output_throughput"]) for c in tp})
    # PP wins one stream, TP wins concurrency (PCIe), as on the seed's host
    assert pp[1]["output_throughput"] > tp[1]["output_throughput"]
    assert tp[32]["output_throughput"] > 1.5 * pp[32]["output_throughput"]
    # ITL per stream follows the model: TP8 ~38 ms, PP8 ~27 ms at one request
    assert 30 < tp[1]["median_itl_ms"] < 50 and 20 < pp[1]["median_itl_ms"] < 35
