"""The rehearsal engine's performance model (pure): calibration against the founding scenario.

The calibration points are the seed's measurements, read from performance.json's "calibration"
block; the model must reproduce each within its stated tolerance (10 %), and the shape the
operator saw must hold: PP8 wins a single stream, TP8 wins concurrency on PCIe.
"""
from __future__ import annotations

import json
import sys

import pytest

from tests.standins.helpers import ENGINE_SRC, MODELS, smi

sys.path.insert(0, str(ENGINE_SRC))
from sglang._rehearsal.performance import (  # noqa: E402
    PARAMETERS,
    Layout,
    PerformanceModel,
    interconnect_from_topology,
)

MODEL = PerformanceModel.load()
CALIBRATION = json.loads(PARAMETERS.read_text())["calibration"]
KIMI_LAYERS = json.loads((MODELS / "kimi-k2.6" / "config.json").read_text())["num_hidden_layers"]


@pytest.mark.parametrize("point", CALIBRATION["points"],
                         ids=lambda p: f"tp{p['layout']['tp']}pp{p['layout']['pp']}-c{p['concurrency']}")
def test_calibration_point_within_tolerance(point):
    layout = Layout(**point["layout"], interconnect="pcie")
    got = MODEL.output_tok_s(layout, KIMI_LAYERS, point["concurrency"])
    want = point["output_tok_s"]
    # Printed so that `pytest -s` shows the calibration numbers.
    print(f"{layout.tp=} {layout.pp=} C={point['concurrency']}: model {got:.1f} tok/s, seed {want} tok/s "
          f"({(got - want) / want:+.1%})")
    assert abs(got - want) <= CALIBRATION["tolerance"] * want


def test_pp_wins_one_stream_tp_wins_concurrency_on_pcie():
    tp8, pp8 = Layout(tp=8, ep=8), Layout(pp=8)
    assert MODEL.output_tok_s(pp8, KIMI_LAYERS, 1) > MODEL.output_tok_s(tp8, KIMI_LAYERS, 1)
    for c in (32, 64):
        assert MODEL.output_tok_s(tp8, KIMI_LAYERS, c) > 1.5 * MODEL.output_tok_s(pp8, KIMI_LAYERS, c)


def test_throughput_grows_and_per_stream_rate_falls_with_concurrency():
    for layout in (Layout(tp=8), Layout(pp=8), Layout(tp=4, pp=2), Layout(tp=8, ep=8, all_to_all=True),
                   Layout(tp=8, dp=8, dp_attention=True)):
        rates = [MODEL.stream_tok_s(layout, KIMI_LAYERS, c) for c in (1, 8, 32, 64)]
        totals = [MODEL.output_tok_s(layout, KIMI_LAYERS, c) for c in (1, 8, 32, 64)]
        assert rates == sorted(rates, reverse=True), layout
        assert totals == sorted(totals), layout


def test_nvlink_is_faster_than_pcie_for_tensor_parallel():
    pcie, nvlink = Layout(tp=8), Layout(tp=8, interconnect="nvlink")
    assert MODEL.output_tok_s(nvlink, KIMI_LAYERS, 1) > 2 * MODEL.output_tok_s(pcie, KIMI_LAYERS, 1)


def test_prefill_is_longer_for_longer_prompts_and_for_a_pipeline():
    tp8, pp8 = Layout(tp=8), Layout(pp=8)
    assert MODEL.prefill_ms(tp8, KIMI_LAYERS, 1024) > MODEL.prefill_ms(tp8, KIMI_LAYERS, 128)
    assert MODEL.prefill_ms(pp8, KIMI_LAYERS, 1024) > MODEL.prefill_ms(tp8, KIMI_LAYERS, 1024)


def test_unknown_interconnect_is_refused():
    with pytest.raises(ValueError, match="interconnect 'infiniband'"):
        MODEL.round_ms(Layout(tp=8, interconnect="infiniband"), KIMI_LAYERS, 1)


@pytest.mark.parametrize("profile, want", [("rtx-pro-6000-8", "pcie"), ("h200-8", "nvlink")])
def test_interconnect_read_from_the_simulated_topology(profile, want):
    topo = smi(profile, "topo", "-m")
    assert topo.returncode == 0, topo.stderr
    assert interconnect_from_topology(topo.stdout, range(8)) == want
    assert interconnect_from_topology("garbage", range(8)) == "pcie"


def test_the_model_directories_ship_the_tokenizer_rehearsal_tokenizer_writes():
    from rehearsal import tokenizer
    for model in ("kimi-k2.6", "deepseek-v3"):
        for name, text in tokenizer.files().items():
            assert (MODELS / model / name).read_text() == text, f"{model}/{name}: run python -m rehearsal.tokenizer"
    vocab = tokenizer.vocabulary()
    assert len(vocab) == tokenizer.VOCAB_SIZE and sorted(vocab.values()) == list(range(tokenizer.VOCAB_SIZE))
    # the engine's filler words are tokens, so its output tokenizes to known ids
    sys.path.insert(0, str(ENGINE_SRC))
    from sglang._rehearsal.server import WORDS
    assert set(WORDS) <= set(vocab)
