"""How long a start takes, by a documented model of what really costs time (issue 40).

On by REHEARSAL_DISK_MIB_S (the host's disk read rate); REHEARSAL_LOAD_SECONDS, when set, still
fixes the weight load instead, and with neither the load takes checkpoint GiB / 100 s with no
init or graph-capture time (the timings the tests had before this model).

  start = init + load + graph capture (+ warm-up, REHEARSAL_WARMUP_SECONDS)
  init  = init_base_s + init_per_gpu_s x GPUs of this node + init_per_stage_s x (pp - 1)
          (processes, NCCL communicators, one per stage boundary)
  load  = bytes not in the page cache / disk rate + bytes in it / page-cache rate
  graph = graph_cold_s, or graph_warm_s when this layout's kernels are in the kernel cache

The checkpoint's bytes are its safetensors shards in the model directory: their residency is
asked of the kernel (mincore(2) over a read-only mapping of each shard), and the shards are then
really read, so a start leaves them in the page cache as a real load does (the next start is
warm; dropping the cache or fadvise(DONTNEED) makes it cold again). A model directory without
shards (the 590 GB stand-ins) counts its declared checkpoint_bytes as read from disk. The wait is
the model's figure; reading that takes longer (a slow disk here) is not hidden: it shows.

The kernel cache: Triton's cache directory (TRITON_CACHE_DIR, default ~/.triton/cache). After a
capture the engine writes its layout's entry there (sglang-rehearsal-kernels-<key>.json, the
architecture and layout in the key); a later start of the same layout finds it and captures in
graph_warm_s. Another layout's entry does not help (other shapes, other kernels).

Parameters: load.json beside this file (assumptions, with the measurement each one leans on);
REHEARSAL_PAGE_CACHE_MIB_S, REHEARSAL_INIT_SECONDS, REHEARSAL_GRAPH_SECONDS and
REHEARSAL_GRAPH_WARM_SECONDS override them (tests use seconds, not minutes).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PARAMETERS = Path(__file__).with_name("load.json")
MiB = 1 << 20
READ_CHUNK = 16 * MiB


def resident_bytes(path: str) -> int:
    """Bytes of the file now in the page cache (mincore over a read-only shared mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident = pages - bytes(vec).count(0)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(resident * page, size)


def shards(model_dir: str) -> list[str]:
    try:
        return sorted(str(p) for p in Path(model_dir).glob("*.safetensors") if p.is_file())
    except OSError:
        return []


def kernel_cache_dir(env: dict) -> Path:
    return Path(env.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache"))


@dataclass
class LoadPlan:
    files: list = field(default_factory=list)
    total_bytes: int = 0
    resident_bytes: int = 0
    disk_mib_s: float = 0.0
    cache_mib_s: float = 0.0
    init_seconds: float = 0.0
    graph_seconds: float = 0.0
    graph_warm: bool = False
    cache_entry: Path | None = None
    note: str = ""

    @property
    def load_seconds(self) -> float:
        cold = self.total_bytes - self.resident_bytes
        return cold / MiB / self.disk_mib_s + self.resident_bytes / MiB / self.cache_mib_s

    def describe(self) -> str:
        gib = 1 << 30
        return (f"rehearsal: load model: {self.total_bytes / gib:.2f} GiB checkpoint, {self.resident_bytes / gib:.2f} GiB "
                f"in the page cache; disk {self.disk_mib_s:g} MiB/s, page cache {self.cache_mib_s:g} MiB/s -> load "
                f"{self.load_seconds:.2f} s; init {self.init_seconds:.2f} s; graph capture {self.graph_seconds:.2f} s "
                f"({'warm: this layout is in' if self.graph_warm else 'cold: this layout is not in'} the kernel cache "
                f"{self.cache_entry.parent if self.cache_entry else '-'}){self.note}")


def _number(env: dict, key: str, default: float) -> float:
    value = env.get(key)
    return max(float(value), 0.0) if value not in (None, "") else float(default)


def plan(model, args, env: dict, gpus_on_node: int, layout: str) -> LoadPlan | None:
    """The start's modelled times, or None when the model is off (see the module docstring)."""
    if env.get("REHEARSAL_LOAD_SECONDS") not in (None, "") or env.get("REHEARSAL_DISK_MIB_S") in (None, ""):
        return None
    params = json.loads(PARAMETERS.read_text(encoding="utf-8"))
    p = LoadPlan(disk_mib_s=max(float(env["REHEARSAL_DISK_MIB_S"]), 1e-3),
                 cache_mib_s=max(_number(env, "REHEARSAL_PAGE_CACHE_MIB_S", params["page_cache_mib_s"]), 1e-3))
    p.files = shards(model.path)
    if p.files:
        p.total_bytes = sum(os.path.getsize(f) for f in p.files)
        try:
            p.resident_bytes = sum(resident_bytes(f) for f in p.files)
        except OSError as exc:
            p.note = f"; mincore failed ({exc}): every byte counted as read from disk"
        stand_in = model.checkpoint.get("stand_in")
        if stand_in and int(model.checkpoint["checkpoint_bytes"]) > p.total_bytes:
            # A stand-in's small shards (rehearsal/checkpoint.py) stand for the declared checkpoint:
            # their share in the page cache is its share; they are what is really read.
            real, declared = p.total_bytes, int(model.checkpoint["checkpoint_bytes"])
            p.total_bytes, p.resident_bytes = declared, declared * p.resident_bytes // real
            p.note += f"; stand-in shards ({real / MiB:.1f} MiB, read) counted as the declared checkpoint_bytes"
    else:
        p.total_bytes = int(model.checkpoint["checkpoint_bytes"])
        p.note = "; no shard files: the declared checkpoint_bytes count as read from disk"
    init = params["init"]
    p.init_seconds = _number(env, "REHEARSAL_INIT_SECONDS", init["base_s"] + init["per_gpu_s"] * gpus_on_node
                             + init["per_stage_s"] * (int(args.pp_size) - 1))
    key = hashlib.sha256(f"{model.architecture}|{model.num_layers}|{layout}".encode()).hexdigest()[:16]
    p.cache_entry = kernel_cache_dir(env) / f"sglang-rehearsal-kernels-{key}.json"
    p.graph_warm = p.cache_entry.is_file()
    graph = params["graph_capture"]
    p.graph_seconds = (_number(env, "REHEARSAL_GRAPH_WARM_SECONDS", graph["warm_s"]) if p.graph_warm
                       else _number(env, "REHEARSAL_GRAPH_SECONDS", graph["cold_s"]))
    return p


def read_checkpoint(p: LoadPlan, stop) -> float:
    """Read every shard through (into the page cache, as a real load leaves it); seconds taken."""
    began = time.monotonic()
    buf = bytearray(READ_CHUNK)
    for path in p.files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                if stop.is_set():
                    return time.monotonic() - began
    return time.monotonic() - began


def remember_kernels(p: LoadPlan, layout: str, log) -> None:
    """After a capture: this layout's entry in the kernel cache, so its next start is warm."""
    if p.cache_entry is None or p.graph_warm:
        return
    try:
        p.cache_entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.cache_entry.with_suffix(".tmp")
        tmp.write_text(json.dumps({"layout": layout, "written_by": "sglang-rehearsal", "at": time.time()}))
        os.replace(tmp, p.cache_entry)
    except OSError as exc:
        log.warning(f"rehearsal: cannot write the kernel cache entry {p.cache_entry}: {exc}")


# ------------------------------------------------------------------ the engine's start, phase by phase
def init_wait(engine) -> None:
    """The init phase's time (processes, NCCL), when the model is on."""
    if engine.load_plan is not None:
        engine.wait(engine.load_plan.init_seconds)


def load_seconds(engine) -> float:
    return engine.load_plan.load_seconds if engine.load_plan is not None else engine.load_seconds()


def load_weights(engine) -> float:
    """The weight load with the port closed: the model's figure (the shards really read), or the
    fixed time. Returns the seconds it took, for 'Load weight end. elapsed=...'."""
    began = engine.clock()
    p = engine.load_plan
    if p is None:
        engine.wait(engine.load_seconds())
    else:
        engine.log.info(p.describe())
        took = read_checkpoint(p, engine.stop)
        left = p.load_seconds - took
        if took > p.load_seconds:
            engine.log.warning(f"rehearsal: reading the shards took {took:.2f} s, more than the model's "
                               f"{p.load_seconds:.2f} s (the disk here is slower than REHEARSAL_DISK_MIB_S)")
        engine.wait(max(left, 0.0))
    engine.start_phases["load_weight"] = round(engine.clock() - began, 3)
    return engine.clock() - began


def capture_graphs(engine, avail_gib: float, during=None) -> None:
    """SGLang's CUDA graph capture lines, with the model's time between them when it is on;
    `during`: what fails inside the capture (DeepEP's NVLink check), called after its first line."""
    log = engine.log
    began = engine.clock()
    log.info(f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail_gib:.2f} GB", rank=True)
    if during is not None:
        during()
    p = engine.load_plan
    if p is not None:
        engine.wait(p.graph_seconds)
        remember_kernels(p, engine.layout_key, log)
    elapsed = engine.clock() - began
    engine.start_phases["cuda_graph"] = round(elapsed, 3)
    log.info(f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage=0.00 GB. avail mem={avail_gib:.2f} GB.",
             rank=True)
