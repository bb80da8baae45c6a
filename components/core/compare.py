"""`components compare`: the stored benchmark runs of several stacks side by side.

For each stack and concurrency level the newest run that measured that level wins, so a rerun
of one level replaces only that level. Throughput decides the winner at each concurrency
(the operator's question: how many tokens per second does this layout give at this load);
TTFT and ITL are shown beside it. A figure from the rehearsal engine is labelled so wherever
it appears, and a comparison mixing rehearsal and GPU figures says that they do not compare.

A run records the machine's fitness as it started (meta.json); `with_fitness_now` marks each run
whose host reads otherwise now "not comparable: <what changed>" (core/fitness_read.py): its
figures measured another machine (a power cap, a link retrained, a driver upgraded since).

Pure: builds text and labels from parsed runs; the picture is drawn one floor up
(components/cli/compare.py), so matplotlib never loads for the rest of the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from .bench_results import Level, Run, load_runs, stacks_with_results
from .fitness import HostFitness
from .fitness_read import mark

# Throughputs closer than this are reported as a tie: run-to-run noise of a serving benchmark
# is a few percent, so a 1 % lead is no lead.
TIE_PERCENT = 2.0
_OLDEST = datetime.min.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Point:
    level: Level
    run: Run


@dataclass(frozen=True)
class Series:
    """One strategy's line: its newest figure at each concurrency."""
    stack: str
    points: dict[int, Point]

    @property
    def runs(self) -> list[Run]:
        seen: dict[str, Run] = {}
        for p in self.points.values():
            seen.setdefault(p.run.folder, p.run)
        return sorted(seen.values(), key=lambda r: r.folder)

    @property
    def newest(self) -> Run:
        return max(self.runs, key=lambda r: (r.time or _OLDEST, r.folder))

    @property
    def strategy(self) -> str:
        return self.newest.strategy

    @property
    def rehearsal(self) -> bool:
        return any(r.rehearsal for r in self.runs)

    def _joined(self, attr: str) -> str:
        return ", ".join(dict.fromkeys(getattr(r, attr) for r in self.runs))

    @property
    def hosts(self) -> str:
        return self._joined("host")

    @property
    def models(self) -> str:
        # A model directory's name is the model's name; the full path only adds noise to a legend.
        return ", ".join(dict.fromkeys(r.model.rstrip("/").rsplit("/", 1)[-1] for r in self.runs))

    @property
    def versions(self) -> str:
        """The server's version (what served the benchmark), not the benchmark client's."""
        return self._joined("server_version")

    @property
    def client_versions(self) -> str:
        return self._joined("sglang_version")

    @property
    def server(self) -> str:
        # The rehearsal engine is not SGLang: its version says so, and the legend too.
        what = "rehearsal engine" if "rehearsal" in self.versions else "SGLang"
        return f"{what} {self.versions}"

    @property
    def dates(self) -> str:
        dates = sorted({r.date for r in self.runs})
        return dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"

    def label(self) -> str:
        """The legend entry: what was measured, where, when, on which server."""
        text = f"{self.strategy} on {self.hosts}, {self.server}, {self.dates}"
        return text + (" (rehearsal)" if self.rehearsal else "")


@dataclass(frozen=True)
class Comparison:
    series: list[Series]  # in the order asked for
    missing: list[str]  # stacks asked for without any result, each with what to do
    notes: list[str]  # files or levels left out, and why
    # "<stack>/<folder>" of each run whose machine reads otherwise now -> "not comparable: ..."
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def concurrencies(self) -> list[int]:
        return sorted({c for s in self.series for c in s.points})

    @property
    def rehearsal(self) -> bool:
        return any(s.rehearsal for s in self.series)

    @property
    def mixed(self) -> bool:
        """Rehearsal and GPU figures side by side: they do not compare."""
        return self.rehearsal and not all(s.rehearsal for s in self.series)

    def workloads(self) -> list[str]:
        """Each workload measured (`workload_of`), in the order first seen."""
        return list(dict.fromkeys(workload_of(p) for s in self.series for p in s.points.values()))

    def title(self) -> str:
        """What was measured: the model, the request lengths and the prompts a level."""
        models = ", ".join(dict.fromkeys(s.models for s in self.series))
        workloads = self.workloads()
        lengths = workloads[0] if len(workloads) == 1 else "request lengths differ (below)"
        prompts = prompts_of([p for s in self.series for p in s.points.values()])
        return f"{models}: SGLang serving benchmark, {lengths}, {prompts}"

    def warnings(self) -> list[str]:
        out = []
        if self.mixed:
            reh = ", ".join(s.strategy for s in self.series if s.rehearsal)
            gpu = ", ".join(s.strategy for s in self.series if not s.rehearsal)
            out.append(f"{reh} measured on the rehearsal engine, {gpu} on GPUs: these figures do not compare")
        if len({s.models for s in self.series}) > 1:
            out.append("the stacks served different models: the comparison is of models as much as of strategies")
        if len(self.workloads()) > 1:
            out.append(f"the levels were measured at different request lengths ({'; '.join(self.workloads())}): "
                       "their figures do not compare")
        if len({s.hosts for s in self.series}) > 1:
            out.append("the stacks ran on different hosts: the comparison is of hosts as much as of strategies")
        out += [f"{run}: {why}" for run, why in self.marks.items()]
        return out

    def banner(self) -> str | None:
        """The line a rehearsal figure always carries."""
        if not self.rehearsal:
            return None
        names = ", ".join(s.strategy for s in self.series if s.rehearsal)
        return f"REHEARSAL: {names} ran on the rehearsal engine (a performance model, no GPU): not a GPU measurement"


def workload_of(p: Point) -> str:
    """The request lengths one level measured: SGLang's own record, else the run's meta.json."""
    raw, settings = p.level.raw, p.run.settings
    inp, out, ratio = raw.get("random_input_len"), raw.get("random_output_len"), raw.get("random_range_ratio", 1.0)
    if not isinstance(inp, int) or not isinstance(out, int):
        inp, out, ratio = settings.get("inputLen"), settings.get("outputLen"), settings.get("rangeRatio", 1.0)
    if not isinstance(inp, int) or not isinstance(out, int):
        return "request lengths not recorded"
    drawn = f" (drawn from {ratio:g}x..1x)" if isinstance(ratio, (int, float)) and ratio != 1.0 else ""
    return f"{inp} in + {out} out tokens a request{drawn}"


def prompts_of(points: list[Point]) -> str:
    """Prompts a level: bench's promptsPerConcurrency x concurrency, else what the levels completed."""
    per = {p.run.settings.get("promptsPerConcurrency") for p in points}
    if len(per) == 1 and isinstance(next(iter(per)), int):
        return f"{next(iter(per))} prompts per concurrent request"
    ratios = {p.level.completed / p.level.concurrency for p in points}
    if len(ratios) == 1 and float(next(iter(ratios))).is_integer():
        return f"{int(next(iter(ratios)))} prompts per concurrent request (as completed)"
    levels = sorted({(p.level.concurrency, p.level.completed) for p in points})
    return "prompts completed: " + ", ".join(f"{n} at C={c}" for c, n in levels)


def hosts_with_fitness(comparison: Comparison) -> set[str]:
    """The hosts of the compared runs that recorded the machine's fitness: the ones worth reading now."""
    return {r.host for s in comparison.series for r in s.runs if r.fitness}


def with_fitness_now(comparison: Comparison, now: dict[str, Optional[HostFitness]], problems: list[str]) -> Comparison:
    """The comparison with each run marked whose host (`now`: its fitness read now, None: not read)
    differs from what the run recorded; `problems`: what kept a host from being read (notes)."""
    marks = {}
    for s in comparison.series:
        for r in s.runs:
            why = mark(r.fitness, now.get(r.host))
            if why:
                marks[run_name(r)] = why
    return replace(comparison, marks=marks, notes=comparison.notes + problems)


def run_name(r: Run) -> str:
    return f"{r.stack}/{r.folder}"


def build(runs_by_stack: dict[str, list[Run]], results_hint: str = "results/bench") -> Comparison:
    """The comparison of the stacks in `runs_by_stack` (order kept). A stack with no usable
    level is reported in `missing` with the command that fills it."""
    series: list[Series] = []
    missing: list[str] = []
    notes: list[str] = []
    for stack, runs in runs_by_stack.items():
        points: dict[int, Point] = {}
        for run in runs:  # oldest first: a newer run's level replaces an older one's
            notes.extend(run.notes)
            for c, level in run.levels.items():
                points[c] = Point(level, run)
        if not points:
            why = "no benchmark results" if not runs else f"no completed level in {len(runs)} run(s)"
            missing.append(f"{stack}: {why} under {results_hint}/{stack} "
                           f"(run `python -m components bench --stack {stack}` while it serves)")
            continue
        series.append(Series(stack, dict(sorted(points.items()))))
    return Comparison(series, missing, notes)


def load(results_dir: Path, stacks: list[str] | None) -> Comparison:
    """The comparison from results/bench: `stacks` in that order, or every stack with results."""
    names = stacks if stacks else stacks_with_results(results_dir)
    return build({s: load_runs(results_dir, s) for s in names}, str(results_dir))


@dataclass(frozen=True)
class Verdict:
    concurrency: int
    ranked: list[tuple[Series, Level]]  # best output throughput first

    def text(self) -> str:
        c = f"C={self.concurrency}"
        (best, top), rest = self.ranked[0], self.ranked[1:]
        if not rest:
            return f"{c}: only {best.strategy} has results ({_tps(top.output_throughput)} tok/s), nothing to compare"
        second = rest[0][1]
        lead = _lead(top.output_throughput, second.output_throughput)
        if lead < TIE_PERCENT:
            return (f"{c}: {best.strategy} and {rest[0][0].strategy} tie ({_tps(top.output_throughput)} vs "
                    f"{_tps(second.output_throughput)} tok/s, within {TIE_PERCENT:g} %)")
        others = ", ".join(f"+{_lead(top.output_throughput, lv.output_throughput):.0f} % "
                           f"({top.output_throughput / lv.output_throughput:.2f}x) over {s.strategy} "
                           f"({_tps(lv.output_throughput)})" for s, lv in rest)
        text = f"{c}: {best.strategy} wins with {_tps(top.output_throughput)} tok/s, {others}"
        quickest = min(self.ranked, key=lambda p: p[1].median_ttft_ms)
        if quickest[0] is not best:
            text += (f"; lowest TTFT p50: {quickest[0].strategy} ({_ms(quickest[1].median_ttft_ms)} ms vs "
                     f"{_ms(top.median_ttft_ms)} ms)")
        return text


def verdicts(comparison: Comparison) -> list[Verdict]:
    out = []
    for c in comparison.concurrencies:
        have = [(s, s.points[c].level) for s in comparison.series if c in s.points]
        out.append(Verdict(c, sorted(have, key=lambda p: -p[1].output_throughput)))
    return out


def _lead(a: float, b: float) -> float:
    return (a / b - 1) * 100 if b > 0 else float("inf")


def _tps(v: float) -> str:
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def _ms(v: float) -> str:
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


COLUMNS = ("concurrency", "strategy", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "run")


def table_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    """Strategy x concurrency, grouped by concurrency so the strategies at one load stand together."""
    rows: list[tuple[str, ...]] = []
    for c in comparison.concurrencies:
        for s in comparison.series:
            if c not in s.points:
                continue
            p = s.points[c]
            lv = p.level
            run = run_name(p.run) + (" rehearsal" if p.run.rehearsal else "") \
                + (" (not comparable)" if run_name(p.run) in comparison.marks else "")
            rows.append((str(c), s.strategy, _tps(lv.output_throughput), _ms(lv.median_ttft_ms), _ms(lv.p99_ttft_ms),
                         _ms(lv.median_itl_ms), run))
    return rows


def render(comparison: Comparison) -> str:
    lines = []
    banner = comparison.banner()
    if banner:
        lines.append(banner)
    lines.append(comparison.title())
    for s in comparison.series:
        layout = f" [{s.newest.layout}]" if s.newest.layout else ""
        lines.append(f"  {s.label()}{layout}")
    for m in comparison.missing:
        lines.append(f"  missing: {m}")
    for w in comparison.warnings():
        lines.append(f"warning: {w}")
    for n in comparison.notes:
        lines.append(f"note: {n}")
    rows = [COLUMNS] + table_rows(comparison)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines.append("")
    for r in rows:
        # Numbers right-aligned, names left-aligned, as a reader scans them.
        cells = [r[i].rjust(widths[i]) if i not in (1, 6) else r[i].ljust(widths[i]) for i in range(len(r))]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    lines.append("winner by output throughput (higher is better; TTFT and ITL: lower is better):")
    lines += [f"  {v.text()}" for v in verdicts(comparison)]
    return "\n".join(lines) + "\n"


def as_dict(comparison: Comparison) -> dict[str, Any]:
    return {
        "rehearsal": comparison.rehearsal,
        "workloads": comparison.workloads(),
        "banner": comparison.banner(),
        "warnings": comparison.warnings(),
        "missing": comparison.missing,
        "notes": comparison.notes,
        "not_comparable": comparison.marks,
        "strategies": [{
            "stack": s.stack, "strategy": s.strategy, "layout": s.newest.layout, "host": s.hosts, "model": s.models,
            "server_version": s.versions, "client_version": s.client_versions, "dates": s.dates, "rehearsal": s.rehearsal,
            "levels": {str(c): {"output_throughput": p.level.output_throughput, "median_ttft_ms": p.level.median_ttft_ms,
                                "p99_ttft_ms": p.level.p99_ttft_ms, "median_itl_ms": p.level.median_itl_ms,
                                "run": f"{p.run.stack}/{p.run.folder}"} for c, p in s.points.items()},
        } for s in comparison.series],
        "winners": [{"concurrency": v.concurrency, "ranking": [s.strategy for s, _ in v.ranked], "verdict": v.text()}
                    for v in verdicts(comparison)],
    }
