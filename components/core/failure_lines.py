"""What a failed start's journal says went wrong: a small table of SGLang's (and torch's and
NCCL's) real failure lines, and the phase of the start SGLang had reached, from its own progress
lines. Pure; cases under tests/data/ledger/.

The lines come from the sources that print them (SGLang's model_runner, memory pool and CUDA
graph runner, torch's caching allocator and ProcessGroupNCCL, the CUDA runtime, safetensors and
SGLang's weight loader). The first line of the journal that matches a class is the cause; what
follows it (SGLang's "Received sigquit from a child process", "Initialization failed") is the
consequence and is not read for the class.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorClass:
    key: str
    label: str  # in the operator's words: "CUDA out of memory"
    patterns: tuple[str, ...]


# In the order a line is tried: a line that names two (SGLang's "Capture cuda graph failed: CUDA
# out of memory ...") is the more specific cause, and the graph capture is its phase.
ERROR_CLASSES = (
    ErrorClass("out-of-memory", "CUDA out of memory", (
        r"torch\.(?:cuda\.)?OutOfMemoryError",  # torch's caching allocator
        r"CUDA out of memory\. Tried to allocate",
        r"CUDA error: out of memory",  # the runtime, outside the allocator
    )),
    ErrorClass("kv-cache-memory", "not enough memory for the KV cache (--mem-fraction-static)", (
        r"Not enough memory\. Please try to increase --mem-fraction-static",  # SGLang's memory pool
    )),
    ErrorClass("nccl-timeout", "NCCL timeout", (
        r"Watchdog caught collective operation timeout",  # torch ProcessGroupNCCL
        r"Some NCCL operations have failed or timed out",
        r"NCCL WARN .*[Tt]imeout",
        r"DistStoreError: .*[Tt]imed? ?out",  # the rendezvous store: a peer never came
    )),
    ErrorClass("nccl-error", "NCCL error", (
        r"NCCL error in: ",  # torch: "NCCL error in: .../NCCLUtils.hpp:..., unhandled cuda error ..."
        r"nccl(?:UnhandledCudaError|SystemError|InternalError|InvalidUsage|RemoteError)",
        r"NCCL error: (?:unhandled|remote process exited|internal)",
        r"DistBackendError",
    )),
    ErrorClass("missing-kernel", "no kernel for this GPU (unsupported architecture)", (
        r"no kernel image is available for execution on the device",  # the CUDA runtime
        r"is not compatible with the current PyTorch installation",  # torch: an sm_XX it was not built for
        r"the provided PTX was compiled with an unsupported toolchain",
        r"[Uu]nsupported (?:GPU )?arch(?:itecture)?",
        r"undefined symbol: ",  # a kernel library built against another torch
    )),
    ErrorClass("weight-loading", "weight loading failed", (
        r"Cannot find any model weights with",  # SGLang's loader: no shard where the model path points
        r"SafetensorError",  # safetensors: a shard cut short or not a safetensors file
        r"Error while deserializing header",
        r"does not appear to have a file named",  # transformers: config.json or a shard missing
        r"incomplete metadata, file not fully covered",
    )),
    ErrorClass("cuda-graph", "CUDA graph capture failed", (
        r"Capture cuda graph failed",  # SGLang's cuda_graph_runner, for a cause none of the above names
    )),
)
OTHER = ErrorClass("other", "failed", ())

# SGLang's progress lines during a start (model_runner), in order: the last one before the error
# is the phase the start had reached.
PHASES = (
    ("Load weight begin", "while loading the weights"),
    ("Load weight end", "after the weights loaded"),
    ("KV Cache is allocated", "after the KV cache was allocated"),
    ("Memory pool end", "after the KV cache was allocated"),
    ("Capture cuda graph begin", "during CUDA graph capture"),
    ("Capture cuda graph end", "after CUDA graph capture"),
    ("The server is fired up and ready to roll", "after the server was ready"),
)
# What SGLang prints after the cause, whatever it was.
CONSEQUENCES = ("Scheduler hit an exception", "Received sigquit from a child process", "Initialization failed",
                "During handling of the above exception")
# The journal's own prefix (`journalctl -o short-iso`: time, host, unit[pid]:), stripped.
_JOURNAL_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ [^:\s]+(?:\[\d+\])?: ", re.ASCII)
# SGLang's own log prefix (its logger's format: time, then the rank it runs as, "[2026-12-04
# 10:14:02 TP0 EP0] "), stripped too: the ledger says when; the line says what.
_SGLANG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z]+\d+)*\] ", re.ASCII)
MAX_LINE = 240


@dataclass(frozen=True)
class Cause:
    key: str
    label: str  # "CUDA out of memory during CUDA graph capture"
    line: str  # the journal line it was read from (cut to MAX_LINE)


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."


def _lines(journal: str) -> list[str]:
    return [_SGLANG_PREFIX.sub("", _JOURNAL_PREFIX.sub("", line).strip()) for line in journal.splitlines() if line.strip()]


def phase_of(lines: list[str], upto: int) -> str:
    """The phase the start had reached before line `upto`; a capture that failed is the capture."""
    if any("Capture cuda graph failed" in line for line in lines):
        return "during CUDA graph capture"
    reached = ""
    for line in lines[:upto]:
        for marker, phase in PHASES:
            if marker in line:
                reached = phase
    return reached


def classify(journal: str, outcome: str = "") -> Cause:
    """The cause of a failed start from its journal tail (`outcome`: the readiness status, for a
    start that printed no error: a timeout, a server that never answered)."""
    lines = _lines(journal)
    for n, line in enumerate(lines):
        for cls in ERROR_CLASSES:
            if any(re.search(p, line) for p in cls.patterns):
                phase = phase_of(lines, n)
                return Cause(cls.key, f"{cls.label} {phase}".strip(), _cut(line))
    # Unclassified: the first line that names an error (SGLang's own consequences of it left
    # out), else what the readiness check saw.
    named = [n for n, line in enumerate(lines) if re.search(r"(Error|Exception)\b", line, re.ASCII)
             and not any(c in line for c in CONSEQUENCES)]
    if named:
        return Cause(OTHER.key, f"{OTHER.label} {phase_of(lines, named[0])}".strip(), _cut(lines[named[0]]))
    phase = phase_of(lines, len(lines))
    said = {"timed_out": "did not become ready in time", "unhealthy": "never generated",
            "layout_mismatch": "served another layout"}.get(outcome, OTHER.label)
    return Cause(OTHER.key, f"{said} {phase}".strip(), _cut(lines[-1]) if lines else "")
