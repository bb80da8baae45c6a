"""Benchmark results as `components bench` stores them, read back for `components compare`.

One folder per run: ``results/bench/<stack>/<UTC time>/`` holds ``meta.json`` (what was
measured: stack, strategy, layout, host, model, SGLang version, rehearsal, time) and one file
per concurrency level written by SGLang's own client (``python -m sglang.benchmark.serving
--output-file``, formerly ``sglang.bench_serving``). That file is JSONL: the client *appends*
one JSON object per run, so the last line of a file is its newest measurement. The field names
are SGLang's (``output_throughput``, ``median_ttft_ms``, ``p99_ttft_ms``, ``median_itl_ms``,
...); ``request_rate`` is ``Infinity`` when only concurrency limits the load, which Python's
json reads as a float.

Pure: reads local files only, never a host.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

META_FILE = "meta.json"
# What a comparison needs from each level; the rest of SGLang's fields are kept in `raw`.
REQUIRED_FIELDS = ("max_concurrency", "completed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                   "median_itl_ms")


class BenchResultError(Exception):
    """A result file that cannot be read as SGLang's output: names the file, what is wrong and
    what to do."""


@dataclass(frozen=True)
class Level:
    """One concurrency level of one run, in SGLang's units (tok/s, ms)."""
    concurrency: int
    completed: int
    output_throughput: float
    request_throughput: float | None
    median_ttft_ms: float
    p99_ttft_ms: float
    median_itl_ms: float
    duration: float | None
    source: str  # the file it came from, for messages
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Run:
    """One `components bench` run of one stack."""
    stack: str
    folder: str  # the run's folder name (its UTC time)
    time: datetime | None
    strategy: str  # e.g. "TP8": the name a reader compares by
    layout: str  # e.g. "tp 8, pp 1, ep 8, dp 1"; "" when not recorded
    host: str
    model: str
    sglang_version: str  # the benchmark client's SGLang (meta.json `sglang_version`)
    rehearsal: bool
    levels: dict[int, Level]
    notes: tuple[str, ...] = ()  # levels or files skipped, and why
    # The server's own version (what /server_info said): the serving SGLang, or the rehearsal
    # engine's; the client's when nothing else recorded it (a venv client is the server's SGLang).
    server_version: str = ""
    # The benchmark settings `components bench` recorded (inputLen, outputLen, rangeRatio,
    # promptsPerConcurrency); {} for runs stored without them.
    settings: dict[str, Any] = field(default_factory=dict, compare=False)
    # The host's fitness facts as the run started (meta.json `fitness`; core/fitness_baseline.py
    # compares them with the host's now); None for a run recorded before they were read.
    fitness: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def date(self) -> str:
        return self.time.strftime("%Y-%m-%d") if self.time else self.folder


def _number(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise BenchResultError(f"{where}: field {name!r} is {value!r}, not a number (is this a file written by "
                               f"`sglang.benchmark.serving --output-file`?)")
    return float(value)


def parse_level(obj: dict[str, Any], where: str) -> Level:
    """One JSON object of SGLang's output file. Raises BenchResultError naming the file and
    the missing or malformed field."""
    if not isinstance(obj, dict):
        raise BenchResultError(f"{where}: a line is {type(obj).__name__}, not a JSON object of SGLang's benchmark output")
    missing = [f for f in REQUIRED_FIELDS if f not in obj]
    if missing:
        raise BenchResultError(f"{where}: SGLang's benchmark output lacks {', '.join(missing)} (a file written by "
                               f"`sglang.benchmark.serving --output-file` has them; rerun `components bench`)")
    concurrency = obj["max_concurrency"]
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise BenchResultError(f"{where}: max_concurrency is {concurrency!r}: a comparison needs a run limited by "
                               f"--max-concurrency N (N >= 1), as `components bench` runs it")

    def optional(name: str) -> float | None:
        return _number(obj[name], name, where) if obj.get(name) is not None else None

    return Level(concurrency=concurrency, completed=int(_number(obj["completed"], "completed", where)),
                 output_throughput=_number(obj["output_throughput"], "output_throughput", where),
                 request_throughput=optional("request_throughput"),
                 median_ttft_ms=_number(obj["median_ttft_ms"], "median_ttft_ms", where),
                 p99_ttft_ms=_number(obj["p99_ttft_ms"], "p99_ttft_ms", where),
                 median_itl_ms=_number(obj["median_itl_ms"], "median_itl_ms", where),
                 duration=optional("duration"), source=where, raw=obj)


def parse_output_file(text: str, where: str) -> list[Level]:
    """Every line of an output file, oldest first (the client appends). A file holding one
    JSON document over several lines (an object re-indented, or a list of them) is read as that."""
    levels = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            whole = _one_document(text, where)
            if whole is not None:
                return whole
            raise BenchResultError(f"{where}:{n}: not JSON ({exc.msg}); a run cut short leaves a partial line: "
                                   f"delete the file or rerun `components bench`") from None
        levels.append(parse_level(obj, f"{where}:{n}"))
    return levels


def _one_document(text: str, where: str) -> list[Level] | None:
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(whole, dict):
        return [parse_level(whole, where)]
    if isinstance(whole, list):
        return [parse_level(o, f"{where}[{i}]") for i, o in enumerate(whole)]
    return None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    for text in (value, value.replace("Z", "+00:00")):
        try:
            t = datetime.fromisoformat(text)
            return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    for fmt in ("%Y%m%dT%H%M%SZ", "%Y-%m-%dT%H-%M-%SZ", "%Y-%m-%dT%H%M%SZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return None


def _server_info(levels: list[Level]) -> dict[str, Any]:
    """SGLang's client records the server's /server_info in every result: the version and the
    resolved layout the server itself reported, a check on what meta.json says."""
    for level in reversed(levels):
        info = level.raw.get("server_info")
        if isinstance(info, dict):
            return info
    return {}


def parse_run(stack: str, folder: str, meta: dict[str, Any], files: dict[str, str]) -> Run:
    """A run from its meta.json (already parsed) and its output files (name -> text). The
    newest line per concurrency wins; a later file wins over an earlier one (by name)."""
    notes: list[str] = []
    by_level: dict[int, Level] = {}
    all_levels: list[Level] = []
    for name in sorted(files):
        try:
            levels = parse_output_file(files[name], f"{stack}/{folder}/{name}")
        except BenchResultError as exc:
            # One broken file (a level cut short) leaves the run's other levels usable.
            notes.append(f"{exc}: left out")
            continue
        if not levels:
            notes.append(f"{stack}/{folder}/{name} is empty (a level that never finished?)")
        for level in levels:
            if level.completed < 1 or level.output_throughput <= 0:
                notes.append(f"{level.source}: no request completed at concurrency {level.concurrency} "
                             f"(completed {level.completed}, {level.output_throughput:g} tok/s): left out")
                continue
            by_level[level.concurrency] = level
            all_levels.append(level)
    info = _server_info(all_levels)
    version = str(meta.get("sglang_version") or info.get("version") or "unknown")
    server_version = str(meta.get("server_version") or info.get("version") or version)
    # A rehearsal figure must never pass for a GPU measurement: the engine's version says
    # "rehearsal" even when meta.json is missing or wrong.
    rehearsal = bool(meta.get("rehearsal")) or "rehearsal" in version or "rehearsal" in str(info.get("version", "")) \
        or "rehearsal" in str(meta.get("server_version", ""))
    strategy = meta.get("strategy")
    # `components bench` records the stack's strategy name as the operator spelled it (tp8);
    # a comparison names strategies as the field writes them (TP8).
    strategy = (strategy if isinstance(strategy, str) and strategy else stack).upper()
    layout = meta.get("layout")
    if isinstance(layout, dict):
        # `components bench` writes the declared layout (the readiness comparison's fields) with
        # its one-line description beside them: the description is what a reader wants.
        layout = layout.get("describe") or ", ".join(f"{k.removesuffix('_size')} {layout[k]}"
                                                    for k in ("tp_size", "pp_size", "ep_size", "dp_size") if k in layout)
    model = meta.get("model")
    if isinstance(model, dict):  # {"name": ..., "path": ...} as `components bench` writes it
        model = model.get("name") or model.get("path")
    if not layout and info:
        layout = ", ".join(f"{k.removesuffix('_size')} {info[k]}" for k in ("tp_size", "pp_size", "ep_size", "dp_size")
                           if k in info)
    return Run(stack=stack, folder=folder, time=_parse_time(meta.get("time")) or _parse_time(folder),
               strategy=strategy, layout=str(layout or ""), host=str(meta.get("host") or "unknown host"),
               model=str(model or info.get("served_model_name") or info.get("model_path") or "unknown model"),
               sglang_version=version, rehearsal=rehearsal, levels=dict(sorted(by_level.items())), notes=tuple(notes),
               server_version=server_version,
               settings=meta["settings"] if isinstance(meta.get("settings"), dict) else {},
               fitness=meta.get("fitness") if isinstance(meta.get("fitness"), dict) else None)


def load_run(folder: Path, stack: str) -> Run:
    meta_path = folder / META_FILE
    meta: dict[str, Any] = {}
    notes = []
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise BenchResultError(f"{meta_path}: not JSON ({exc.msg}): delete the run folder or rerun "
                                   f"`components bench --stack {stack}`") from None
        if not isinstance(meta, dict):
            raise BenchResultError(f"{meta_path}: a JSON object was expected (stack, host, model, sglang_version, "
                                   f"rehearsal, time)")
    else:
        notes.append(f"{stack}/{folder.name} has no {META_FILE}: host, model and version taken from SGLang's output")
    files = {p.name: p.read_text() for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix in (".json", ".jsonl") and p.name != META_FILE}
    run = parse_run(stack, folder.name, meta, files)
    return Run(**{**run.__dict__, "notes": tuple(notes) + run.notes})


def load_runs(results_dir: Path, stack: str) -> list[Run]:
    """Every run of `stack` under `results_dir` (results/bench), oldest first."""
    base = results_dir / stack
    if not base.is_dir():
        return []
    runs = [load_run(p, stack) for p in base.iterdir() if p.is_dir()]
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(runs, key=lambda r: (r.time or oldest, r.folder))


def stacks_with_results(results_dir: Path) -> list[str]:
    if not results_dir.is_dir():
        return []
    return sorted(p.name for p in results_dir.iterdir() if p.is_dir() and any(c.is_dir() for c in p.iterdir()))
