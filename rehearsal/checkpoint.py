"""A stand-in checkpoint in the real layout, made deterministically from a seed.

What a model directory on a real host holds, small: the model's own files from
rehearsal/models/<model>/ (the real config.json, the rehearsal engine's rehearsal-checkpoint.json,
the tokenizer), ``model.safetensors.index.json`` (``metadata.total_size`` and ``weight_map``:
tensor -> shard), and the shards ``model-0000K-of-0000N.safetensors`` in the safetensors format:
8 bytes of little-endian header length, a JSON header (each tensor's dtype, shape and
data_offsets, in offset order, plus ``__metadata__``; padded with spaces to 8 bytes as the
safetensors writer pads it), then the data. Tensor names follow the architecture's (DeepSeek-V3 /
Kimi K2: embeddings, per-layer attention and MLP or expert weights, the final norm, lm_head),
spread over the shards in layer order as real checkpoints are; each 2-D tensor is [rows,
hidden_size] in BF16 with as many rows as fill the shard's size.

The data bytes come from the seed (`random.Random` seeded with a string: the same on every
machine and Python 3.x), so two writes with one seed are byte for byte equal and another seed
makes "other weights" of the same shapes and sizes. A few MB a shard by default; a benchmark asks
for 2-4 GB (``--shard-mb 512 --shards 8``).

``python -m rehearsal.checkpoint DEST [--model kimi-k2.6] [--shards 4] [--shard-mb 2] [--seed 0]``.
`standin(model)` is the default one every rehearsal host mounts at /models/<model>: built once in
the cache, keyed by what it is made from.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Optional

from .common import cache_root, flock

MODELS_DIR = Path(__file__).resolve().parent / "models"
INDEX = "model.safetensors.index.json"
# What a rehearsal host's default model directory holds: 4 shards of 2 MiB.
DEFAULT_SHARDS = 4
DEFAULT_SHARD_BYTES = 2 << 20
BF16 = 2
# Written per piece, so a 4 GB shard never sits in memory whole.
PIECE = 64 << 20
# Bumped when the layout written here changes (it keys the cached default stand-ins).
LAYOUT_VERSION = 2


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _tensor_names(config: dict) -> list[tuple[str, bool]]:
    """(name, is 2-D) in the order a real checkpoint lays them out."""
    text = config.get("text_config", config)
    layers = int(text["num_hidden_layers"])
    dense = int(text.get("first_k_dense_replace", 0))
    names = [("model.embed_tokens.weight", True)]
    for i in range(layers):
        p = f"model.layers.{i}"
        names += [(f"{p}.input_layernorm.weight", False), (f"{p}.self_attn.kv_a_proj_with_mqa.weight", True),
                  (f"{p}.self_attn.o_proj.weight", True), (f"{p}.post_attention_layernorm.weight", False)]
        if i < dense:
            names.append((f"{p}.mlp.down_proj.weight", True))
        else:
            names += [(f"{p}.mlp.experts.0.down_proj.weight", True), (f"{p}.mlp.shared_experts.down_proj.weight", True)]
    names += [("model.norm.weight", False), ("lm_head.weight", True)]
    return names


def _header(tensors: list[tuple[str, list[int]]]) -> tuple[bytes, int]:
    """The safetensors header for `tensors` (name, shape), BF16, in this order: (bytes, data size)."""
    header, offset = {}, 0
    for name, shape in tensors:
        n = BF16
        for dim in shape:
            n *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, offset


def _plan(config: dict, shards: int, shard_bytes: int) -> list[list[tuple[str, list[int]]]]:
    """Each shard's tensors and shapes: the names split in order, 2-D tensors sized to fill it."""
    text = config.get("text_config", config)
    hidden = int(text["hidden_size"])
    names = _tensor_names(config)
    per = -(-len(names) // shards)
    out = []
    for k in range(shards):
        part = names[k * per:(k + 1) * per] or [(f"model.rehearsal_pad_{k}.weight", True)]
        flat = sum(1 for _, two_d in part if not two_d) * hidden * BF16
        two = sum(1 for _, two_d in part if two_d)
        floor = flat + two * hidden * BF16
        if shard_bytes < floor:
            raise ValueError(f"{shards} shards of {shard_bytes:,} bytes cannot hold the model's tensors (one row of "
                             f"{hidden} each): give at least {floor:,} bytes a shard, or more shards")
        # The shard's rows shared out, the first tensors one row more: the shard comes within a
        # row (hidden_size x 2 bytes) of the size asked for.
        rows, extra = divmod(max(shard_bytes - flat, 0) // (hidden * BF16), max(two, 1))
        shapes, i = [], 0
        for name, two_d in part:
            if two_d:
                shapes.append((name, [max(1, rows + (i < extra)), hidden]))
                i += 1
            else:
                shapes.append((name, [hidden]))
        out.append(shapes)
    return out


def write(dest: Path, model: str = "kimi-k2.6", *, shards: int = DEFAULT_SHARDS, shard_bytes: int = DEFAULT_SHARD_BYTES,
          seed: int = 0) -> dict:
    """Write the stand-in into `dest` (created; files replaced). Returns {path: size} of what it wrote."""
    if shards < 1 or shard_bytes < 1:
        raise ValueError("at least one shard of at least one byte")
    source = Path(model) if "/" in model else MODELS_DIR / model
    config = json.loads((source / "config.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    written: dict[str, int] = {}
    for f in sorted(source.iterdir()):
        if f.is_file() and f.name != "README.md":
            shutil.copyfile(f, dest / f.name)
            written[f.name] = f.stat().st_size
    declared = dest / "rehearsal-checkpoint.json"
    if declared.is_file():
        # Said to the engine: these shards stand for the declared checkpoint_bytes (its start-time
        # model, loading.py, counts those while it reads these).
        d = json.loads(declared.read_text())
        d["stand_in"] = {"seed": seed, "shards": shards, "shard_bytes": shard_bytes}
        declared.write_text(json.dumps(d, indent=2) + "\n")
        written[declared.name] = declared.stat().st_size
    weight_map, total = {}, 0
    for k, tensors in enumerate(_plan(config, shards, shard_bytes), start=1):
        name = shard_name(k, shards)
        raw, size = _header(tensors)
        rng_key = f"gpu-serving-standin/{seed}/{name}"
        with open(dest / name, "wb") as out:
            out.write(len(raw).to_bytes(8, "little"))
            out.write(raw)
            for i, start in enumerate(range(0, size, PIECE)):
                out.write(random.Random(f"{rng_key}/{i}").randbytes(min(PIECE, size - start)))
        written[name] = 8 + len(raw) + size
        total += size
        weight_map.update({t: name for t, _ in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    written[INDEX] = (dest / INDEX).stat().st_size
    return written


def _key(source: Path, shards: int, shard_bytes: int, seed: int) -> str:
    h = hashlib.sha256(f"{LAYOUT_VERSION}/{shards}/{shard_bytes}/{seed}".encode())
    for f in sorted(source.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def standin(model: str = "kimi-k2.6", *, shards: int = DEFAULT_SHARDS, shard_bytes: int = DEFAULT_SHARD_BYTES,
            seed: int = 0, root: Optional[Path] = None) -> Path:
    """The cached stand-in of `model` (a name under rehearsal/models/ or a directory), built once
    (under a lock, into a temporary directory renamed into place): what /models/<model> is on a
    rehearsal host, and what the local engine tests load."""
    source = Path(model) if "/" in model else MODELS_DIR / model
    # <key>/<model>: the directory keeps the model's name, as --model-path shows it.
    base = (root or cache_root() / "checkpoints") / _key(source, shards, shard_bytes, seed)
    path = base / source.name
    if (path / INDEX).is_file():
        return path
    base.mkdir(parents=True, exist_ok=True)
    with flock(base / ".lock"):
        if (path / INDEX).is_file():
            return path
        tmp = base / f".{path.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp, str(source), shards=shards, shard_bytes=shard_bytes, seed=seed)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rehearsal.checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("dest", type=Path)
    p.add_argument("--model", default="kimi-k2.6", help="a name under rehearsal/models/ or a directory (default kimi-k2.6)")
    p.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    p.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_BYTES / (1 << 20), help="MiB a shard (default 2)")
    p.add_argument("--seed", type=int, default=0, help="another seed: other weights of the same shapes")
    a = p.parse_args(argv)
    files = write(a.dest, a.model, shards=a.shards, shard_bytes=int(a.shard_mb * (1 << 20)), seed=a.seed)
    print(f"{a.dest}: {len(files)} files, {sum(files.values()) / 1e9:.3f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
