"""The answer check: is a started server still answering as the model did when the reference was
recorded? Pure: requests to send and the verdict on the answers; the probe sends them.

The reference is recorded once from a ready server (greedy continuations of the golden prompts,
with SGLang's per-token logprobs) and kept with the model, the revision or manifest digest and the
layout it came from. A later start of the same weights (a restart, a repair, a switch to another
layout) is compared with it by a rule chosen to survive layout numerics and to fail anything else:

1. Teacher forcing. The reference continuation is fed back (input_ids = prompt + continuation,
   return_logprob, logprob_start_len = len(prompt) - 1) and SGLang returns the logprob the running
   server gives each reference token. Each token is scored on the reference's own prefix, so one
   token where the layouts disagree does not change what follows: the mean |logprob now - logprob
   recorded| stays at the layouts' numeric noise (hundredths of a nat), while other weights, a
   broken kernel or garbage make the reference tokens unlikely (several nats a token).
   Pass: mean <= logprob_tolerance (0.25 nats a token).
2. Greedy prefix. The greedy continuation now must equal the reference's on its first
   prefix_tokens tokens (8), unless it departs at a near tie: at the first differing position the
   running server gives the reference token a logprob within tie_margin (0.2 nats) of its own
   choice. Greedy decoding legitimately flips between two nearly equal tokens across layouts, and
   after a flip the texts share nothing, so a whole-text comparison would fail TP8 vs PP8 of the
   same weights; a flip where the server strongly prefers its own token is a real difference.
Both must hold for every prompt; any prompt failing makes the verdict `output_mismatch`, naming the
prompts and how far off they are. A reference recorded for other weights (model, revision or
manifest) does not apply: the check is skipped and says so (record it again), never judged against it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Optional

LOGPROB_TOLERANCE = 0.25  # nats a token: layouts differ by ~0.01-0.05, wrong weights by several
PREFIX_TOKENS = 8         # greedy tokens that must agree (or depart at a near tie)
TIE_MARGIN = 0.2          # nats between the server's choice and the reference token: a tie
CONTINUATION_TOKENS = 16  # tokens recorded after each prompt
# Built-in prompts (readiness.goldenPrompts replaces them): short, varied, any language model's.
DEFAULT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Translate to German: good morning, how are you?",
    "1, 1, 2, 3, 5, 8, 13,",
)


class GoldenError(ValueError):
    """An answer that is not SGLang's /generate shape: says what is missing."""


@dataclass(frozen=True)
class Rule:
    logprob_tolerance: float = LOGPROB_TOLERANCE
    prefix_tokens: int = PREFIX_TOKENS
    tie_margin: float = TIE_MARGIN


# ------------------------------------------------------------------------------ requests
def greedy_request(text: str, tokens: int = CONTINUATION_TOKENS) -> dict[str, Any]:
    """The /generate body recording (or re-running) a prompt's greedy continuation; with
    logprob_start_len 0 SGLang returns the prompt's token ids in input_token_logprobs."""
    return {"text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}


def forced_request(prompt_ids: list[int], continuation_ids: list[int]) -> dict[str, Any]:
    """The /generate body scoring the reference continuation by teacher forcing."""
    return {"input_ids": list(prompt_ids) + list(continuation_ids),
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": len(prompt_ids) - 1}


def _meta(response: dict[str, Any], key: str) -> list[Any]:
    entries = ((response or {}).get("meta_info") or {}).get(key)
    if not isinstance(entries, list):
        raise GoldenError(f"the answer has no meta_info.{key} (was return_logprob sent?)")
    return entries


def greedy_from_response(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, greedy ids, their logprobs) from a greedy_request's answer."""
    prompt = [int(e[1]) for e in _meta(response, "input_token_logprobs")]
    output = _meta(response, "output_token_logprobs")
    return prompt, [int(e[1]) for e in output], [float(e[0]) for e in output]


def forced_from_response(response: dict[str, Any], continuation_ids: list[int]) -> list[float]:
    """The logprobs the server gives the reference continuation (input_token_logprobs after the
    prompt's last token, whose own entry is None)."""
    entries = _meta(response, "input_token_logprobs")[1:]
    got = [int(e[1]) for e in entries]
    if got != list(continuation_ids):
        raise GoldenError(f"the forced answer scores tokens {got[:8]}..., not the reference continuation")
    return [float(e[0]) for e in entries]


# ------------------------------------------------------------------------------ the reference
def record(prompts: list[str], responses: list[dict[str, Any]], *, model: str, revision: Optional[str],
           manifest: Optional[str], layout: dict[str, Any], rule: Rule = Rule()) -> dict[str, Any]:
    """The reference to keep in the state, from the greedy answers of a ready server."""
    if len(prompts) != len(responses):
        raise GoldenError(f"{len(prompts)} prompts but {len(responses)} answers")
    entries = []
    for text, response in zip(prompts, responses):
        prompt_ids, ids, lps = greedy_from_response(response)
        entries.append({"text": text, "prompt_ids": prompt_ids, "continuation_ids": ids, "continuation_logprobs": lps})
    return {"schema": 1, "model": model, "revision": revision, "manifest": manifest, "layout": dict(layout),
            "rule": {"logprob_tolerance": rule.logprob_tolerance, "prefix_tokens": rule.prefix_tokens,
                     "tie_margin": rule.tie_margin}, "prompts": entries}


def applies(reference: Optional[dict[str, Any]], *, model: str, revision: Optional[str], manifest: Optional[str]) -> str:
    """Why the reference cannot judge this start ("" when it can)."""
    if not reference:
        return "no reference recorded for this stack: record one from a ready deploy"
    for key, now in (("model", model), ("revision", revision), ("manifest", manifest)):
        then = reference.get(key)
        if then and now and then != now:
            return f"the reference was recorded for {key} {then}, the stack now serves {now}: record it again"
    return ""


# ------------------------------------------------------------------------------ the verdict
@dataclass(frozen=True)
class PromptResult:
    text: str
    mean_delta: float        # mean |logprob now - recorded| over the reference continuation
    worst_token: int         # position of the largest difference
    worst_delta: float
    prefix: int              # greedy tokens agreeing with the reference
    tie: bool                # the greedy output departs at a near tie
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class GoldenVerdict:
    status: str              # "ok", "output_mismatch" or "skipped"
    reason: str
    prompts: list[PromptResult] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason,
                "prompts": [{"text": p.text, "mean_logprob_delta": round(p.mean_delta, 4), "prefix": p.prefix,
                             "tie": p.tie, "problems": list(p.problems)} for p in self.prompts]}


def judge_prompt(ref: dict[str, Any], forced: list[float], greedy_ids: list[int], greedy_lps: list[float], rule: Rule) -> PromptResult:
    cont, ref_lps = ref["continuation_ids"], ref["continuation_logprobs"]
    if len(forced) != len(cont) or not cont:
        raise GoldenError(f"{len(forced)} forced logprobs for {len(cont)} reference tokens")
    deltas = [abs(a - b) for a, b in zip(forced, ref_lps)]
    worst = max(range(len(deltas)), key=deltas.__getitem__)
    mean = fmean(deltas)
    prefix = 0
    while prefix < min(len(cont), len(greedy_ids)) and greedy_ids[prefix] == cont[prefix]:
        prefix += 1
    need = min(rule.prefix_tokens, len(cont))
    tie = prefix < need and prefix < len(greedy_lps) and greedy_lps[prefix] - forced[prefix] <= rule.tie_margin
    problems = []
    if mean > rule.logprob_tolerance:
        problems.append(f"the reference continuation scores {fmean(forced):.2f} nats a token now, "
                        f"{fmean(ref_lps):.2f} when recorded (mean difference {mean:.2f} > {rule.logprob_tolerance:g})")
    if prefix < need and not tie:
        margin = greedy_lps[prefix] - forced[prefix] if prefix < len(greedy_lps) else float("nan")
        problems.append(f"greedy output departs from the reference at token {prefix} of {need} "
                        f"(the server prefers its own token by {margin:.2f} nats, more than a tie's {rule.tie_margin:g})")
    return PromptResult(ref["text"], mean, worst, deltas[worst], prefix, tie, tuple(problems))


def judge(reference: dict[str, Any], observed: list[dict[str, Any]], rule: Optional[Rule] = None) -> GoldenVerdict:
    """`observed`: per reference prompt, {"forced": logprobs of the reference continuation,
    "greedy_ids": ..., "greedy_logprobs": ...} from this start's answers."""
    rule = rule or Rule(**(reference.get("rule") or {}))
    refs = reference["prompts"]
    if len(observed) != len(refs):
        raise GoldenError(f"{len(observed)} observations for {len(refs)} reference prompts")
    results = [judge_prompt(ref, o["forced"], o["greedy_ids"], o["greedy_logprobs"], rule) for ref, o in zip(refs, observed)]
    bad = [r for r in results if not r.ok]
    if not bad:
        ties = sum(r.tie for r in results)
        worst = max(r.mean_delta for r in results)
        return GoldenVerdict("ok", f"{len(results)} golden prompt(s) answer as recorded (largest mean logprob "
                                   f"difference {worst:.3f} nats a token" + (f"; {ties} greedy departure(s) at a near tie"
                                                                             if ties else "") + ")", results)
    shown = "; ".join(f"prompt {i + 1} ({r.text[:40]!r}): " + "; ".join(r.problems)
                      for i, r in enumerate(results) if not r.ok)
    return GoldenVerdict("output_mismatch", f"{len(bad)} of {len(results)} golden prompt(s) answer otherwise than "
                                            f"recorded: {shown}", results)
