"""The answer check's rule (components/core/golden.py), one JSON file a case (tests/data/golden)."""
import pytest

from components.core import golden as G

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("golden"), ids=lambda x: x if isinstance(x, str) else "")
def test_verdict(name, case):
    verdict = G.judge(case["reference"], case["observed"])
    expect = case["expect"]
    assert verdict.status == expect["status"], verdict.reason
    for text in expect.get("reason_contains", []):
        assert text in verdict.reason, verdict.reason
    for text in expect.get("reason_lacks", []):
        assert text not in verdict.reason, verdict.reason


@pytest.mark.parametrize("name,case", cases("golden/applies"), ids=lambda x: x if isinstance(x, str) else "")
def test_a_reference_applies_to_its_weights(name, case):
    for check in case["checks"]:
        assert G.applies(case["reference"], **check["now"]) == check["expect"]
    assert "no reference recorded" in G.applies(None, model="m", revision=None, manifest=None)


def test_requests_are_sglangs_shapes():
    assert G.forced_request([5, 6, 7], [8, 9]) == {
        "input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True, "logprob_start_len": 2}
    answer = {"meta_info": {"input_token_logprobs": [[None, 7, None], [-0.5, 8, None], [-1.25, 9, None]]}}
    assert G.forced_from_response(answer, [8, 9]) == [-0.5, -1.25]
    with pytest.raises(G.GoldenError, match="not the reference continuation"):
        G.forced_from_response(answer, [8, 10])
    with pytest.raises(G.GoldenError, match="return_logprob"):
        G.greedy_from_response({"meta_info": {}})
