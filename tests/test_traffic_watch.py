"""The watch's traffic section (components/core/traffic_status.py, core/workload.py): two ticks of
a server's /metrics make a window with the load, the rate and the request lengths; a restart's
reset counters give no figure; the recommendation is a change when it changes; its Prometheus
line. And `python -m components recommend` on this project with the seed's results."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from components.__main__ import main
from components.core import server_metrics as M
from components.core import traffic_status as T
from components.core import workload as W

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "tests" / "data" / "traffic" / "sglang-tp8-all-schedulers-five-running.prom").read_text()


def sample(at: float, requests: float, busy: float, prompt: float, generated: float, running: float = 5.0) -> M.ServerSample:
    base = M.server_sample(TEXT, at, 8)
    return M.ServerSample(at, running, 0.0, prompt, generated, requests,
                          M.Histogram(base.e2e.buckets, requests, busy), base.ttft, base.itl)


def test_two_ticks_give_the_load_by_littles_law_the_rate_and_the_lengths():
    first = T.group_doc(None, "tp8", ["gpu1"], {"gpu1": sample(1000, 100, 500, 102400, 25600)}, 3600)
    assert first["window"][0]["basis"] == "gauges" and first["window"][0]["concurrency"] == 5.0
    # 600 s later: 60 more requests finished, having spent 19,200 s in the system: 32 in flight on average.
    second = T.group_doc(json.loads(json.dumps(first)), "tp8", ["gpu1"],
                         {"gpu1": sample(1600, 160, 500 + 19200, 102400 + 60 * 1024, 25600 + 60 * 256)}, 3600)
    last = second["window"][-1]
    assert last["basis"] == "little" and last["concurrency"] == pytest.approx(32.0)
    assert last["request_rate"] == pytest.approx(0.1) and last["seconds"] == 600
    assert (last["input_len"], last["output_len"]) == (pytest.approx(1024), pytest.approx(256))
    assert second["summary"]["ticks"] == 2 and second["summary"]["concurrency"] == pytest.approx(18.5)
    assert "requests in flight" in second["workload"]


def lengths(counts: list[float], total: float) -> M.Histogram:
    """A length histogram in SGLang's first buckets (cumulative counts at 100, 300, 500, +Inf)."""
    return M.Histogram(tuple(zip((100.0, 300.0, 500.0, float("inf")), counts)), counts[-1], total)


def test_two_ticks_give_the_output_rate_and_with_sglangs_length_histograms_each_requests_lengths():
    def at(when, requests, generated, inputs, outputs):
        base = sample(when, requests, requests * 2.0, requests * 200.0, generated)
        return M.ServerSample(**{**base.__dict__, "prompt_lengths": inputs, "generation_lengths": outputs})

    # Two hosts; in 100 s, gpu1 finished 10 requests (8 with prompts under 100 tokens, 2 at 300-500) and
    # gpu2 10 more (all under 300); outputs: 18 under 100 tokens, 2 at 100-300. 3,000 + 1,000 tokens generated.
    first = T.group_doc(None, "tp8", ["gpu1", "gpu2"], {
        "gpu1": at(1000, 0, 0, lengths([0, 0, 0, 0], 0), lengths([0, 0, 0, 0], 0)),
        "gpu2": at(1000, 5, 500, lengths([5, 5, 5, 5], 250), lengths([5, 5, 5, 5], 250))}, 3600)
    second = T.group_doc(first, "tp8", ["gpu1", "gpu2"], {
        "gpu1": at(1100, 10, 3000, lengths([8, 8, 10, 10], 1600), lengths([9, 10, 10, 10], 900)),
        "gpu2": at(1100, 15, 1500, lengths([5, 15, 15, 15], 2250), lengths([14, 15, 15, 15], 750))}, 3600)
    last = second["window"][-1]
    assert last["output_tok_s"] == pytest.approx(40.0)  # (3000 + 1000) / 100 s
    summary = second["summary"]
    assert summary["lengths_basis"] == "each request" and summary["output_tok_s"] == pytest.approx(40.0)
    # 20 requests: the 10th input is the last of the 8 under 100 and 10 in 100-300 -> p50 in 100-300;
    # the 18th output is the last under 100 -> p90 = 100.
    assert 100 < summary["input_len_p50"] < 300 and summary["output_len_p90"] == pytest.approx(100.0)
    assert "input p50" in second["workload"] and "output tok/s" in second["workload"]
    # Without the histograms (serving.collectTokensHistogram off), the means only, said so.
    plain = T.group_doc(T.group_doc(None, "tp8", ["gpu1"], {"gpu1": sample(1000, 100, 500, 102400, 25600)}, 3600),
                        "tp8", ["gpu1"], {"gpu1": sample(1600, 160, 19700, 102400 + 60 * 1024, 25600 + 60 * 256)}, 3600)
    assert plain["summary"]["lengths_basis"] == "means only" and plain["summary"]["input_len_p50"] is None
    assert "(means only)" in plain["workload"]


def test_a_restarted_server_gives_no_figure_for_its_tick():
    first = T.group_doc(None, "tp8", ["gpu1"], {"gpu1": sample(1000, 100, 500, 1000, 1000)}, 3600)
    again = T.group_doc(first, "tp8", ["gpu1"], {"gpu1": sample(1600, 3, 2, 10, 10, running=1.0)}, 3600)
    last = again["window"][-1]
    assert last["basis"] == "gauges" and last["concurrency"] == 1.0 and last["request_rate"] is None


def test_the_window_drops_what_is_older_than_its_length():
    window = []
    for k in range(10):
        window = W.keep(window, W.Observation(k * 600.0, 600.0, 1, 1.0, float(k), None, None, None), 1800)
    assert [o.at for o in window] == [3600.0, 4200.0, 4800.0, 5400.0]  # 30 min back from the last, inclusive


def test_a_changed_recommendation_is_a_change_and_a_prometheus_line():
    group = {"stack": "pp8", "hosts": ["gpu1", "gpu2"], "summary": {"concurrency": 40.0},
             "recommendation": {"action": "switch", "recommended": "tp8", "reason": "TP8 826 vs PP8 363"}}
    now = {"groups": [group]}
    found = T.changes(None, now)
    assert [c["kind"] for c in found] == ["recommended"] and "tp8 instead of pp8" in found[0]["line"]
    assert T.changes(now, now) == []
    prom = T.render_prometheus(now)
    assert 'gpu_serving_recommended_strategy{stack="tp8",host="gpu2",serving="pp8"} 1' in prom
    assert re.search(r'^gpu_serving_observed_concurrency\{stack="pp8"\} 40\.000$', prom, re.M)


@pytest.fixture
def project(tmp_path):
    for p in ROOT.glob("Pulumi*.yaml"):
        shutil.copy(p, tmp_path / p.name)
    shutil.copytree(ROOT / "tests" / "data" / "compare" / "seed" / "results", tmp_path / "results")
    return tmp_path


def test_recommend_prints_the_switch_with_its_numbers(project, capsys):
    assert main(["recommend", "--stack", "tp8", "--concurrency", "1", "--project-dir", str(project)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("recommend pp8 (switch from tp8): PP8 37.2 tok/s (measured at C=1) vs TP8 26.1")
    assert "ep8      EP8" in out and "advisor's estimate" in out  # a stack without results, labelled


def test_recommend_reads_the_watchs_window_and_its_json(project, tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps({"traffic": {"groups": [{"stack": "pp8", "summary": {"concurrency": 40}}]}}))
    assert main(["recommend", "--stack", "pp8", "--state-dir", str(state), "--json", "--project-dir", str(project)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["action"] == "switch" and doc["recommended"] == "tp8" and doc["concurrency"] == 40
    assert {f["stack"]: f["basis"] for f in doc["figures"]}["tp8"] == "interpolated"


def test_recommend_without_a_load_says_where_it_looked(project, tmp_path, capsys):
    assert main(["recommend", "--stack", "tp8", "--state-dir", str(tmp_path / "none"), "--project-dir", str(project)]) == 2
    err = capsys.readouterr().err
    assert "--concurrency" in err and "no load observed for stack tp8" in err
