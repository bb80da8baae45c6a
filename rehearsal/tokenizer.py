"""A small real tokenizer for the model stand-ins (rehearsal/models/<model>/tokenizer.json).

SGLang's benchmark client loads the tokenizer from the model directory with transformers'
AutoTokenizer, offline. The stand-ins ship a word-level tokenizer in the Hugging Face
`tokenizers` JSON format (a WordLevel model, whitespace pre-tokenizer, no decoder, so decoding
joins tokens with spaces): one token = one word, which is how the rehearsal engine counts prompt
tokens, so the benchmark's input lengths and the engine's agree. Written with the standard
library (same bytes as `tokenizers` would save), so building it needs no download.

`python -m rehearsal.tokenizer` rewrites the files of every stand-in; the tests check that the
committed files are what this module writes.
"""
from __future__ import annotations

import json
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent / "models"
VOCAB_SIZE = 4096
UNK = "[UNK]"
# The engine's filler words come first, so its generated text tokenizes to known ids.
ENGINE_WORDS = ("this is a rehearsal engine answering without a model and without a gpu so every "
                "word here is a stand in for a token").split()


def vocabulary(size: int = VOCAB_SIZE) -> dict[str, int]:
    vocab = {UNK: 0}
    for word in ENGINE_WORDS:
        vocab.setdefault(word, len(vocab))
    i = 0
    while len(vocab) < size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    return vocab


def tokenizer_json(size: int = VOCAB_SIZE) -> str:
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": UNK, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocabulary(size), "unk_token": UNK},
    }
    return json.dumps(doc, indent=1) + "\n"


def tokenizer_config_json() -> str:
    # tokenizer_class makes AutoTokenizer skip the model's config.json (kimi_k2 is no transformers
    # model type); no chat template: the benchmark's random-ids dataset needs none.
    doc = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK, "model_max_length": 262144,
           "clean_up_tokenization_spaces": False, "rehearsal": "word-level stand-in tokenizer, not the model's"}
    return json.dumps(doc, indent=1) + "\n"


def files() -> dict[str, str]:
    return {"tokenizer.json": tokenizer_json(), "tokenizer_config.json": tokenizer_config_json()}


def write(models_dir: Path = MODELS_DIR) -> list[Path]:
    written = []
    for model in sorted(p for p in models_dir.iterdir() if (p / "config.json").is_file()):
        for name, text in files().items():
            (model / name).write_text(text, encoding="utf-8")
            written.append(model / name)
    return written


if __name__ == "__main__":
    for path in write():
        print(path)
