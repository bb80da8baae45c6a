"""Servers' and the router's /metrics read with Prometheus' own parser (components/core/server_metrics.py):
each request counted once whatever reports it (cases tests/data/traffic/in-flight.json, texts from
the rehearsal engine and a captured smg 1.13.0), the counters and histograms the watch reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core import router as R
from components.core import server_metrics as M

DATA = Path(__file__).parent / "data" / "traffic"
CASES = json.loads((DATA / "in-flight.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["why"][:60])
def test_in_flight_counts_each_request_once(case):
    text = (DATA / case["text"]).read_text()
    assert M.in_flight(text, case["attn_tp_size"]) == case["in_flight"]
    # The roll's drain reads the same count (core/router.py keeps its name).
    assert R.in_flight(text, case["attn_tp_size"]) == case["in_flight"]


def test_every_series_summed_would_count_a_request_once_per_tp_rank():
    # What core/router.py:in_flight did before: the sum of every series. The capture has 8 series of 5.
    rows = M.samples((DATA / "sglang-tp8-all-schedulers-five-running.prom").read_text())
    assert sum(v for n, _, v in rows if n in (M.RUNNING, M.QUEUED)) == 40


def test_no_gauge_or_not_prometheus_text_is_none():
    assert R.in_flight("# HELP x\nother_metric 3\n") is None
    assert R.in_flight('sglang:num_running_reqs{model_name="m"} 0.0\n') == 0
    assert R.in_flight("<html>Not Found</html>\n") is None


def test_server_sample_reads_counters_and_histograms():
    s = M.server_sample((DATA / "sglang-tp8-all-schedulers-five-running.prom").read_text(), at=100.0, attn_tp_size=8)
    assert (s.running, s.queued, s.in_flight) == (5.0, 0.0, 5.0)
    assert (s.prompt_tokens, s.generation_tokens, s.requests) == (6.0, 358.0, 3.0)
    assert s.e2e.count == 3.0 and s.ttft.count == 8.0 and s.itl.count == 350.0
    # Round trip through status.json.
    assert M.ServerSample.from_dict(json.loads(json.dumps(s.as_dict()))) == s


def test_histogram_quantile_is_prometheus_linear_interpolation():
    h = M.Histogram(((0.1, 0.0), (0.2, 3.0), (0.4, 4.0), (float("inf"), 4.0)), 4.0, 0.7)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.1 * (2 / 3))
    assert h.quantile(1.0) == pytest.approx(0.4)
    assert M.Histogram().quantile(0.5) is None
    later = M.Histogram(((0.1, 1.0), (0.2, 5.0), (0.4, 8.0), (float("inf"), 8.0)), 8.0, 2.0)
    assert later.minus(h).count == 4.0 and later.minus(h).buckets[0] == (0.1, 1.0)


def test_router_sample_reads_smg_in_flight_per_worker():
    r = M.router_sample((DATA / "smg-1.13.0-five-in-flight.prom").read_text(), at=5.0)
    assert r.active == {"http://127.0.0.1:39101": 5.0}
    assert r.requests == 8.0
