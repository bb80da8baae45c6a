"""The weight load's file checks, as SGLang's loader meets them (no tensor is read into a GPU).

SGLang's DefaultModelLoader._prepare_weights (python/sglang/srt/model_loader/loader.py) globs
``*.safetensors`` in the model directory, keeps those ``model.safetensors.index.json`` names
(weight_utils.filter_duplicate_safetensors_files), raises ``RuntimeError: Cannot find any model
weights with `<path>``` when none is left, and then opens every shard with safetensors'
``safe_open``, which reads the 8-byte header length and the JSON header and refuses a file whose
data does not end where the header says (safetensors/src/tensor.rs, read_metadata and
Metadata::validate): the messages below are that library's (0.8.0), raised in the scheduler as
``safetensors._safetensors_rust.SafetensorError: Error while deserializing header: ...``.

A shard the index names but the directory lacks: SGLang 0.5.x's filter drops it without a word
and loads a model with part of its weights missing; vLLM's loader (and later forks) refuse it
with ``FileNotFoundError: Weight files referenced in index but missing: {...}``. The rehearsal
refuses it that way, so a rehearsal run shows what an incomplete checkpoint costs (a failed
start after the serving strategy was stopped) instead of serving from half a model.
"""
from __future__ import annotations

import glob
import json
import os
import re
import struct

from sglang._rehearsal.rules import Refusal

INDEX = "model.safetensors.index.json"
MAX_HEADER_SIZE = 100_000_000
# Bits per element of each safetensors dtype (safetensors/src/tensor.rs, Dtype::bitsize).
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
        "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
        "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
SAFETENSOR_ERROR = "safetensors._safetensors_rust.SafetensorError"


class HeaderError(Exception):
    """What safetensors' read_metadata refuses, in its words."""


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"([0-9]+)", name)]


def read_header(path: str) -> tuple[int, dict]:
    """(header length, tensors) of one shard, checked as safetensors checks it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError("header too small")
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER_SIZE:
            raise HeaderError("header too large")
        if 8 + n > size:
            raise HeaderError("invalid header length")
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"invalid UTF-8 in header: {exc}") from None
    try:
        header = json.loads(text)
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        ordered = sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HeaderError(f"invalid JSON in header: {exc}") from None
    start = 0
    for name, info in ordered:
        s, e = info["data_offsets"]
        if s != start or e < s:
            raise HeaderError(f"invalid offset for tensor `{name}`")
        elements = 1
        for dim in info.get("shape", []):
            elements *= int(dim)
        bits = elements * BITS.get(info.get("dtype"), 0)
        if bits % 8 or e - s != bits // 8:
            raise HeaderError("invalid shape, data type, or offset for tensor")
        start = e
    if 8 + n + start != size:
        raise HeaderError("incomplete metadata, file not fully covered")
    return n, tensors


def check(model_path: str) -> list[str]:
    """The shards SGLang would load, in its order, each checked; a Refusal("load", ...) shaped like
    SGLang's failure otherwise."""
    index = os.path.join(model_path, INDEX)
    found = sorted(glob.glob(os.path.join(model_path, "*.safetensors")), key=_natural)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                named = set(json.load(f)["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise Refusal("load", type(exc).__name__, str(exc), f"{index} is not a safetensors index") from None
        missing = sorted(name for name in named if not os.path.isfile(os.path.join(model_path, name)))
        if missing:
            shown = "{" + ", ".join(repr(os.path.join(model_path, m)) for m in missing) + "}"
            raise Refusal("load", "FileNotFoundError", f"Weight files referenced in index but missing: {shown}",
                          f"{len(missing)} of the {len(named)} shards {INDEX} names are not in {model_path} "
                          "(SGLang 0.5.x would load without them)")
        found = [p for p in found if os.path.basename(p) in named]
    if not found:
        raise Refusal("load", "RuntimeError", f"Cannot find any model weights with `{model_path}`")
    for path in found:
        try:
            read_header(path)
        except HeaderError as exc:
            raise Refusal("load", SAFETENSOR_ERROR, f"Error while deserializing header: {exc}",
                          f"{os.path.basename(path)} ({os.path.getsize(path):,} bytes) is cut short or damaged") from None
        except OSError as exc:
            raise Refusal("load", type(exc).__name__, str(exc)) from None
    return found


def progress_line(found: list[str]) -> str:
    """SGLang's load progress bar (tqdm with _BAR_FORMAT), as it reads when the load is over."""
    n = len(found)
    return f"Loading safetensors checkpoint shards: 100% Completed | {n}/{n} [00:00<00:00, rehearsal]"
