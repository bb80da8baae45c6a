"""Answers that depend on the weights: a small deterministic stand-in language model.

What the readiness answer check needs from a stand-in is what a real model gives it:

- greedy output is a deterministic function of the prompt and of the checkpoint's identity (other
  weights, other answers);
- two layouts of the same weights (TP8, PP8, EP8) give the same distribution up to a small
  layout-dependent numeric noise (real kernels reduce in another order): greedy outputs agree
  except where two tokens are nearly tied, and teacher-forced logprobs differ by a few hundredths;
- a broken kernel (the `wrong_tokens` fault) answers garbage: the reference tokens become as
  unlikely as any other token.

The model: the next token depends on the last CONTEXT tokens. For each context a hash of
(identity, context) picks CANDIDATES token ids and their logits (the first 0, each next one lower
by an exponentially distributed gap of mean 1 nat, so a few contexts in a hundred are near-ties);
TAIL of the probability is spread evenly over every other token. The layout adds to each logit a
uniform noise in [-noise, +noise] (REHEARSAL_LOGPROB_NOISE, default 0.02) drawn from a hash of
(layout, context): the same layout always gives the same numbers.

Tokens: the model directory's word-level tokenizer.json (one word a token). Text is split on
whitespace; a word outside the vocabulary gets an id by hash (the tokenizer files say [UNK]),
so every text prompt has ids of its own. `checkpoint_identity` is the one place that says
which weights these are (the stand-in checkpoints' shards plug in there).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from typing import Optional

CONTEXT = 4          # tokens of context the next token depends on
CANDIDATES = 8       # tokens with a logit of their own at each position
TAIL = 0.05          # probability spread over every other token
DEFAULT_NOISE = 0.02  # nats, the layout's numeric noise on each logit
SAMPLES = 16         # data blocks hashed per shard (besides its header)
SAMPLE_BYTES = 4096


# ---------------------------------------------------------------------------------- identity
def checkpoint_files(model_dir: str) -> list[str]:
    """The files whose bytes are the weights: config.json, the safetensors index and shards."""
    names = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    wanted = [n for n in ("config.json", "model.safetensors.index.json") if n in names]
    wanted += [n for n in names if n.endswith(".safetensors")]
    return [os.path.join(model_dir, n) for n in wanted]


def _shard_digest(path: str, h) -> None:
    """A safetensors shard's size, its header (names, dtypes, shapes, offsets) and SAMPLES blocks
    of its data: cheap at start (a 4 GB shard is not read whole), and any other seed of the
    stand-in's weights, or another shape, gives another identity."""
    size = os.path.getsize(path)
    h.update(struct.pack("<Q", size))
    with open(path, "rb") as f:
        head = f.read(8)
        h.update(head)
        header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        if 0 < header_len < min(size, 100 << 20):
            h.update(f.read(header_len))
        start = 8 + header_len
        span = max(size - start, 0)
        for i in range(SAMPLES if span else 0):
            f.seek(start + span * i // SAMPLES)
            h.update(f.read(SAMPLE_BYTES))


def checkpoint_identity(model_dir: str) -> str:
    """Which weights the model directory holds, as a hex digest: what the answers depend on."""
    h = hashlib.sha256(b"sglang-rehearsal checkpoint identity 1\0")
    for path in checkpoint_files(model_dir):
        h.update(os.path.basename(path).encode() + b"\0")
        if path.endswith(".safetensors"):
            _shard_digest(path, h)
        else:
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- tokens
def load_vocab(model_dir: str) -> list[str]:
    """id -> word from the model directory's word-level tokenizer.json (w0, w1, ... without one)."""
    try:
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
        words = [""] * len(vocab)
        for word, i in vocab.items():
            words[int(i)] = word
        if len(words) > CANDIDATES + 1 and all(words):
            return words
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    return ["[UNK]"] + [f"w{i}" for i in range(4095)]


def layout_key(args) -> str:
    """What changes a server's numerics: the parallel layout and the kernels chosen."""
    return (f"tp{args.tp_size}-pp{args.pp_size}-ep{args.ep_size}-dp{args.dp_size}"
            f"-dpa{int(bool(args.enable_dp_attention))}-a2a{getattr(args, 'moe_a2a_backend', None)}"
            f"-attn{getattr(args, 'attention_backend', None)}")


def _uniform(data: bytes) -> list[float]:
    """Numbers in (0, 1] from 2-byte chunks of a digest."""
    return [(v + 1) / 65536 for v in struct.unpack(f"<{len(data) // 2}H", data)]


class Answers:
    """The stand-in model of one server: its weights' identity and its layout's noise."""

    def __init__(self, identity: str, vocab: list[str], layout: str, noise: float = DEFAULT_NOISE):
        self.identity = identity
        self.vocab = vocab
        self.index = {w: i for i, w in enumerate(vocab)}
        self.layout = layout
        self.noise = noise
        self._seed = hashlib.sha256(identity.encode()).digest()
        self._layout_seed = hashlib.sha256(layout.encode()).digest()
        self._cache: dict = {}

    # ---------------------------------------------------------------- tokens
    def tokenize(self, text: str) -> list[int]:
        ids = []
        for word in str(text).split():
            i = self.index.get(word)
            if i is None:
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                i = 1 + int.from_bytes(digest, "little") % (len(self.vocab) - 1)
            ids.append(i)
        return ids or [0]

    def word(self, token: int) -> str:
        return self.vocab[int(token) % len(self.vocab)]

    def decode(self, ids) -> str:
        return " ".join(self.word(i) for i in ids)

    # ---------------------------------------------------------------- the distribution
    def _position(self, context: tuple) -> tuple[list[int], list[float], float]:
        """(candidate ids, their log-probabilities, the log-probability of any other token)."""
        cached = self._cache.get(context)
        if cached is not None:
            return cached
        packed = struct.pack(f"<{len(context)}q", *context)
        digest = hashlib.blake2b(self._seed + packed, digest_size=64).digest()
        size = len(self.vocab)
        ids: list[int] = []
        for v in struct.unpack("<16H", digest[:32]):
            token = 1 + v % (size - 1)
            if token not in ids:
                ids.append(token)
            if len(ids) == CANDIDATES:
                break
        gaps = [-math.log(u) for u in _uniform(digest[32:32 + 2 * (len(ids) - 1)])]
        logits = [0.0]
        for gap in gaps:
            logits.append(logits[-1] - gap)
        noise = hashlib.blake2b(self._layout_seed + digest[:16], digest_size=2 * len(ids)).digest()
        logits = [lg + self.noise * (2 * u - 1) for lg, u in zip(logits, _uniform(noise))]
        top = max(logits)
        z = sum(math.exp(lg - top) for lg in logits)
        logprobs = [math.log(1 - TAIL) + lg - top - math.log(z) for lg in logits]
        rest = math.log(TAIL / (size - len(ids)))
        if len(self._cache) > 200_000:
            self._cache.clear()
        self._cache[context] = (ids, logprobs, rest)
        return ids, logprobs, rest

    @staticmethod
    def _context(ids: list[int], i: int) -> tuple:
        """The CONTEXT tokens before position i (-1 before the start)."""
        before = ids[max(0, i - CONTEXT):i]
        return tuple([-1] * (CONTEXT - len(before)) + before)

    def logprob(self, ids: list[int], i: int) -> float:
        """log p(ids[i] | ids[:i])."""
        cands, lps, rest = self._position(self._context(ids, i))
        token = ids[i]
        return lps[cands.index(token)] if token in cands else rest

    def top(self, ids: list[int], i: int, k: int) -> list[tuple[float, int]]:
        """The k likeliest tokens at position i, as (logprob, id), likeliest first."""
        cands, lps, _ = self._position(self._context(ids, i))
        return sorted(zip(lps, cands), reverse=True)[:k]

    def continue_greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        """n greedy tokens after the prompt, and the logprob of each."""
        seq = list(prompt)
        out, lps = [], []
        for _ in range(n):
            best_lp, best = self.top(seq, len(seq), 1)[0]
            seq.append(best)
            out.append(best)
            lps.append(best_lp)
        return out, lps


def garbage(answers: Answers) -> Answers:
    """What a broken kernel answers: another distribution altogether over the same tokens."""
    return Answers("garbage:" + answers.identity, answers.vocab, answers.layout, answers.noise)


# ---------------------------------------------------------------------------------- SGLang's shapes
def _entries(answers: Answers, pairs, with_text: bool) -> list:
    """SGLang's (logprob, token_id, text or None) tuples (JSON arrays)."""
    return [[lp, tid, answers.word(tid) if with_text else None] for lp, tid in pairs]


def logprob_fields(answers: Answers, prompt: list[int], output: list[int], output_lps: list[float],
                   params: dict) -> dict:
    """meta_info's logprob fields for a /generate with return_logprob, as SGLang's tokenizer
    manager returns them: input_token_logprobs from logprob_start_len (default -1: the last prompt
    token only), the first entry's logprob None (nothing precedes it to score it);
    output_token_logprobs for every generated token; with top_logprobs_num > 0 the k likeliest
    tokens of each position too."""
    start = params["logprob_start_len"]
    with_text = bool(params.get("return_text_in_logprobs"))
    k = int(params.get("top_logprobs_num") or 0)
    ids = list(prompt) + list(output)
    inputs = [(None if i == start else answers.logprob(ids, i), ids[i]) for i in range(start, len(prompt))]
    fields = {"input_token_logprobs": _entries(answers, inputs, with_text),
              "output_token_logprobs": _entries(answers, zip(output_lps, output), with_text)}
    if k > 0:
        fields["input_top_logprobs"] = [None if i == start else _entries(answers, answers.top(ids, i, k), with_text)
                                        for i in range(start, len(prompt))]
        fields["output_top_logprobs"] = [_entries(answers, answers.top(ids, len(prompt) + j, k), with_text)
                                         for j in range(len(output))]
    return fields


def logprob_start(body: dict, prompt_len: int) -> tuple[Optional[int], str]:
    """(the resolved logprob_start_len, or None with SGLang's refusal) for a request body."""
    value = body.get("logprob_start_len", -1)
    start = -1 if value is None else int(value)
    if start == -1 or not body.get("return_logprob"):
        return prompt_len - 1, ""
    if start >= prompt_len:
        return None, (f"req.logprob_start_len={start} is higher than the number of input tokens "
                      f"len(req.origin_input_ids)={prompt_len}. Please use a smaller logprob_start_len.")
    return max(start, 0), ""


def for_server(model_dir: str, args, env: dict, garbled: bool, log) -> Answers:
    """The server's answers: its checkpoint's, with its layout's noise; garbage under wrong_tokens."""
    noise = float(env.get("REHEARSAL_LOGPROB_NOISE") or DEFAULT_NOISE)
    answers = Answers(checkpoint_identity(model_dir), load_vocab(model_dir), layout_key(args), noise)
    log.info(f"rehearsal: answers from checkpoint identity {answers.identity[:16]} (layout noise {noise:g} nats)")
    if garbled:
        log.warning("rehearsal fault wrong_tokens: this server answers garbage (a broken kernel's output)")
        answers = garbage(answers)
    return answers
