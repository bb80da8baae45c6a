"""Benchmark results as the advisor reads them: one measured level of one stack's layout, and the
workload it was measured at (issue 36.16: the advisor calibrates only on measurements of the
workload it advises for, docs/advise.md).

Result files: results/bench/<stack>/<time>/*.json or *.jsonl, SGLang bench_serving's objects
(`max_concurrency`, `output_throughput`; a `{"result": ...}` or `{"results": [...]}` wrapper is
read too). The workload comes from SGLang's own fields (`random_input_len`, `random_output_len`,
`random_range_ratio`), else from the run's meta.json as `components bench` writes it
(`settings.inputLen`, `outputLen`, `rangeRatio`); a result that says neither is of an unknown
workload, and is not calibrated on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .strategy import Layout


@dataclass(frozen=True)
class Measurement:
    """One benchmark level of one layout (SGLang bench_serving's result fields)."""

    stack: str
    layout: Layout
    concurrency: int
    output_throughput: float
    path: str = ""
    rehearsal: bool = False
    # The workload measured: tokens in and out a request (None: not recorded), and bench_serving's
    # --random-range-ratio (lengths drawn from [ratio x len, len]; 1 = every request that long).
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    range_ratio: float = 1.0

    @property
    def workload(self) -> str:
        if self.input_len is None or self.output_len is None:
            return "an unrecorded workload"
        ratio = f", lengths x{self.range_ratio:g}..1" if self.range_ratio != 1.0 else ""
        return f"{self.input_len} in / {self.output_len} out{ratio}"

    def is_at(self, input_len: int, output_len: int) -> bool:
        return (self.input_len, self.output_len, self.range_ratio) == (input_len, output_len, 1.0)


def read_results(folder: Path, stack_layouts: dict[str, Layout],
                 not_comparable: Optional[Callable[[dict[str, Any]], Optional[str]]] = None
                 ) -> tuple[list[Measurement], list[str]]:
    """Benchmark results under `folder` (results/bench/<stack>/<time>/*.json or .jsonl): the
    newest result per stack, workload and concurrency. Files that are not such results are
    skipped with a note, never an error. `not_comparable(meta.json)`: why a run measured another
    machine than its host is now ("not comparable: ..."), or None; such a run is left out of the
    calibration, with a note."""
    found: dict[tuple[Any, ...], tuple[str, Measurement]] = {}
    notes: list[str] = []
    left_out: set[Path] = set()
    if not folder.is_dir():
        return [], notes
    for stack_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        layout = stack_layouts.get(stack_dir.name)
        files = sorted(f for f in list(stack_dir.rglob("*.json")) + list(stack_dir.rglob("*.jsonl")) if f.name != "meta.json")
        if layout is None:
            if files:
                notes.append(f"results for {stack_dir.name} skipped: no valid Pulumi.{stack_dir.name}.yaml to say its layout")
            continue
        for f in files:
            why = not_comparable(run_meta(f.parent)) if not_comparable is not None else None
            if why:
                if f.parent not in left_out:
                    left_out.add(f.parent)
                    notes.append(f"results of {stack_dir.name}/{f.parent.relative_to(stack_dir)} left out of the "
                                 f"calibration: {why}")
                continue
            settings = _meta_settings(f.parent)
            for doc in _documents(f):
                try:
                    conc = int(doc.get("max_concurrency") or doc.get("concurrency") or 0)
                    tput = float(doc["output_throughput"])
                except (KeyError, TypeError, ValueError):
                    continue
                if conc <= 0 or tput <= 0:
                    continue
                # SGLang's client records the server's own version in server_info: the rehearsal
                # engine's says so even where nothing else in the line does.
                info = doc.get("server_info")
                info = info if isinstance(info, dict) else {}
                rehearsal = any("rehearsal" in str(doc.get(k, "")).lower()
                                for k in ("version", "sglang_version", "backend", "engine", "note")) \
                    or doc.get("rehearsal") is True or "rehearsal" in str(info.get("version", "")).lower()
                lengths = _workload(doc, settings)
                key = (stack_dir.name, conc, lengths)
                stamp = str(f.relative_to(stack_dir))
                if key not in found or stamp > found[key][0]:
                    found[key] = (stamp, Measurement(stack_dir.name, layout, conc, tput, str(f), rehearsal, *lengths))
    return [m for _, m in sorted(found.values(), key=lambda x: (x[1].stack, x[1].concurrency, x[1].workload))], notes


def _whole(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _workload(doc: dict[str, Any], settings: dict[str, Any]) -> tuple[Optional[int], Optional[int], float]:
    """(input tokens, output tokens, range ratio) of one result: SGLang's fields, else meta.json's."""
    inp, out = _whole(doc.get("random_input_len")), _whole(doc.get("random_output_len"))
    ratio = doc.get("random_range_ratio")
    if inp is None or out is None:
        inp, out = _whole(settings.get("inputLen")), _whole(settings.get("outputLen"))
        ratio = settings.get("rangeRatio", 1.0)
    ratio = float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else 1.0
    return inp, out, ratio


def run_meta(run_dir: Path) -> dict[str, Any]:
    """The run's meta.json as `components bench` wrote it ({} without one)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _meta_settings(run_dir: Path) -> dict[str, Any]:
    """The benchmark settings `components bench` wrote in the run's meta.json ({} without one)."""
    settings = run_meta(run_dir).get("settings")
    return settings if isinstance(settings, dict) else {}


def _documents(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except ValueError:
        docs = []
        for line in text.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for d in docs:
        if isinstance(d, dict):
            # A wrapper {"result": {...}} or {"results": [...]} as a runner may write it.
            results = d.get("results")
            inner = results if isinstance(results, list) else [d.get("result", d)]
            out += [x for x in inner if isinstance(x, dict)]
    return out
