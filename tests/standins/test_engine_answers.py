"""The rehearsal engine's answers depend on the weights (answers.py), in SGLang's /generate shape,
and the answer check's rule (components/core/golden.py) holds against it: the same weights pass
across TP8, PP8 and EP8; other weights and a garbling kernel fail."""
from __future__ import annotations

import json
import random
import shutil
import struct

import pytest

from components.core import golden as G
from tests.standins.helpers import EP8_FLAGS, MODELS, model_dir

LAYOUTS = {"tp8": ["--tp-size", "8"], "pp8": ["--pp-size", "8"], "ep8": EP8_FLAGS}


def checkpoint(root, seed: int):
    """A model directory: kimi-k2.6's files plus one real safetensors shard of seeded weights."""
    d = root / f"ckpt-{seed}"
    shutil.copytree(MODELS / "kimi-k2.6", d)
    data = random.Random(seed).randbytes(1 << 20)
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [512, 1024],
                                                       "data_offsets": [0, len(data)]}}).encode()
    (d / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": len(data)}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
    return d


def answers(engine, reference=None):
    """Greedy answers to the golden prompts, and (with a reference) the forced scores of it."""
    greedy = [engine.post("/generate", G.greedy_request(p))[1] for p in G.DEFAULT_PROMPTS]
    if reference is None:
        return greedy
    observed = []
    for ref, g in zip(reference["prompts"], greedy):
        _, ids, lps = G.greedy_from_response(g)
        status, forced = engine.post("/generate", G.forced_request(ref["prompt_ids"], ref["continuation_ids"]))
        assert status == 200, forced
        observed.append({"forced": G.forced_from_response(forced, ref["continuation_ids"]), "greedy_ids": ids,
                         "greedy_logprobs": lps})
    return observed


def start(launch, engine_env, model_dir, flags, **env):
    e = launch(*flags, "--host", "127.0.0.1", model=str(model_dir), env=engine_env(**env))
    e.wait_ready()
    return e


def test_the_golden_rule_holds_across_layouts_and_fails_other_weights_and_garbage(launch, engine_env, tmp_path):
    weights, other = checkpoint(tmp_path, 1), checkpoint(tmp_path, 2)
    tp8 = start(launch, engine_env, weights, LAYOUTS["tp8"])
    reference = G.record(list(G.DEFAULT_PROMPTS), answers(tp8), model="kimi-k2.6", revision=None, manifest=None,
                         layout={"tp_size": 8})
    assert tp8.terminate() == 0
    verdicts = {}
    for name, flags in LAYOUTS.items():
        engine = start(launch, engine_env, weights, flags)
        verdicts[name] = G.judge(reference, answers(engine, reference))
        engine.terminate()
    for name in ("other-weights", "garbage-on-ep8"):
        engine = start(launch, engine_env, other if name == "other-weights" else weights, LAYOUTS["ep8"],
                       **({"REHEARSAL_FAULT": "wrong_tokens:ep_size=8"} if name.startswith("garbage") else {}))
        verdicts[name] = G.judge(reference, answers(engine, reference))
        engine.terminate()
    for name in LAYOUTS:
        assert verdicts[name].status == "ok", (name, verdicts[name].reason)
    # Layout numerics are visible (not identical), yet far under the tolerance.
    assert 0 < max(p.mean_delta for p in verdicts["pp8"].prompts) < 0.1
    for name in ("other-weights", "garbage-on-ep8"):
        v = verdicts[name]
        assert v.status == "output_mismatch", (name, v.reason)
        assert f"{len(G.DEFAULT_PROMPTS)} of {len(G.DEFAULT_PROMPTS)} golden prompt(s)" in v.reason
        assert min(p.mean_delta for p in v.prompts) > 2


def test_generate_returns_logprobs_in_sglangs_shape(launch, engine_env):
    e = start(launch, engine_env, model_dir("kimi-k2.6"), LAYOUTS["tp8"])
    prompt = "this is a rehearsal engine"  # words of the stand-in vocabulary
    status, full = e.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 4},
                                        "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
                                        "return_text_in_logprobs": True})
    assert status == 200, full
    meta = full["meta_info"]
    ins, outs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert len(ins) == 5 and ins[0][0] is None and all(isinstance(x[0], float) and x[0] < 0 for x in ins[1:])
    assert [x[2] for x in ins] == prompt.split()  # words of the stand-in vocabulary keep their text
    assert [x[1] for x in outs] == full["output_ids"] and len(outs) == 4 and full["text"].split() == [x[2] for x in outs]
    assert meta["input_top_logprobs"][0] is None and len(meta["output_top_logprobs"][0]) == 2
    # Greedy: each output token is the likeliest at its position.
    assert all(o[1] == top[0][1] for o, top in zip(outs, meta["output_top_logprobs"]))
    # Default logprob_start_len (-1): the prompt's last token only; SGLang's refusal past the prompt.
    _, short = e.post("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True})
    assert short["meta_info"]["input_token_logprobs"] == [[None, ins[-1][1], None]]
    status, refused = e.post("/generate", {"text": prompt, "return_logprob": True, "logprob_start_len": 5})
    assert status == 400 and "is higher than the number of input tokens" in refused["error"]["message"]
    # Deterministic, and a function of the prompt: input_ids answer as the text they tokenize to.
    ids = [x[1] for x in ins]
    _, again = e.post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}})
    _, other = e.post("/generate", {"text": "engine rehearsal a is this", "sampling_params": {"max_new_tokens": 4}})
    assert again["output_ids"] == full["output_ids"] and other["output_ids"] != full["output_ids"]
    assert e.terminate() == 0


@pytest.mark.parametrize("fault, flags, garbled", [
    ("wrong_tokens:attention_backend=flashinfer", ["--attention-backend", "flashinfer"], True),
    ("wrong_tokens:attention_backend=flashinfer", ["--attention-backend", "triton"], False),
])
def test_wrong_tokens_only_under_its_setting(launch, engine_env, fault, flags, garbled):
    e = start(launch, engine_env, model_dir("kimi-k2.6"), LAYOUTS["tp8"] + flags, REHEARSAL_FAULT=fault)
    assert e.get("/server_info")[1]["rehearsal"]["garbage"] is garbled
    assert ("this server answers garbage" in e.log) is garbled
    e.terminate()
