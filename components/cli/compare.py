"""``python -m components compare [--stacks tp8,pp8,ep8]``: the stored benchmark runs side by
side, as a table, the winner at each concurrency, and a PNG: output throughput and TTFT
against concurrency (log axes for concurrency and throughput), one line per strategy, each
labelled with host, the server's version and date, the workload (request lengths, prompts a
level) in the title; a rehearsal figure says so in its legend entry and in a banner across the top.

The table and the verdicts are built in components/core/compare.py (pure). matplotlib is used
here only, through its object API on the Agg canvas (no pyplot, no display, no global state),
and imported only when a picture is drawn, so the other commands never load it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import compare as core
from ..core.bench_results import BenchResultError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(comparison: core.Comparison) -> Figure:
    """The figure, not yet written: tests read its lines and labels before it is saved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    fig = Figure(figsize=(12, 6), layout="constrained")
    FigureCanvasAgg(fig)
    throughput, ttft = fig.subplots(1, 2)
    for s in comparison.series:
        levels = sorted(s.points)
        label = s.label()
        throughput.plot(levels, [s.points[c].level.output_throughput for c in levels], marker="o", label=label)
        ttft.plot(levels, [s.points[c].level.median_ttft_ms for c in levels], marker="o", label=label)
    concurrencies = comparison.concurrencies
    for ax, ylabel, title in ((throughput, "output throughput (tok/s, log scale)", "Output throughput vs concurrency"),
                              (ttft, "TTFT p50 (ms)", "Time to first token vs concurrency")):
        # Concurrency levels grow by doubling (1, 32, 64): a log axis keeps C=1 apart from C=32,
        # and half a doubling either side keeps the first and last level off the frame.
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(concurrencies) / 2 ** 0.5, max(concurrencies) * 2 ** 0.5)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (max concurrent requests)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    # Throughput spans 25 to 800 tok/s from C=1 to C=32: on a linear axis from 0 the C=1 figure
    # lies on the axis line. A log axis shows each level's figure and every ratio between them.
    rates = [s.points[c].level.output_throughput for s in comparison.series for c in s.points]
    throughput.set_yscale("log")
    throughput.set_ylim(min(rates) / 2, max(rates) * 2)
    throughput.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    throughput.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    throughput.yaxis.set_minor_locator(NullLocator())
    ttft.set_ylim(bottom=0, top=max(s.points[c].level.median_ttft_ms for s in comparison.series for c in s.points) * 1.15)
    # One legend for both plots (the same lines), under them: inside, it hid the highest figures.
    fig.legend(*throughput.get_legend_handles_labels(), loc="outside lower center", fontsize="small")
    heading = comparison.title()
    banner = comparison.banner()
    if banner:
        heading = f"{banner}\n{heading}"
    warnings = comparison.warnings()
    if warnings:
        heading += "\n" + "; ".join(warnings)
    fig.suptitle(heading, color="firebrick" if banner or warnings else "black")
    return fig


def write_png(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="benchmark results of several stacks side by side: a table, the winner at "
                                       "each concurrency, and a PNG of throughput and TTFT vs concurrency")
    c.add_argument("--stacks", help="comma-separated stacks, in the order to show (default: every stack with results)")
    c.add_argument("--project-dir", default=".", type=Path)
    c.add_argument("--results", type=Path, help="results folder (default: <project-dir>/results/bench)")
    c.add_argument("--output", type=Path, help="the PNG to write (default: <results>/compare.png)")
    c.add_argument("--json", action="store_true", help="machine-readable output instead of the table")
    c.add_argument("--no-host-read", action="store_true",
                   help="do not read the hosts' fitness now (runs are then not checked against the machine)")


def _fitness_now(comparison: core.Comparison, args) -> core.Comparison:
    """Each run checked against its host's fitness now (one small read a host, only for hosts whose
    runs recorded fitness): a machine that changed since marks its figures not comparable."""
    hosts = core.hosts_with_fitness(comparison)
    if not hosts or args.no_host_read:
        return comparison if not hosts else core.with_fitness_now(comparison, {}, [
            "the hosts' fitness was not read (--no-host-read): the figures are not checked against the machine now"])
    from ..remote.fitness_now import read_hosts  # the SSH side, for this command only
    now, problems = read_hosts(args.project_dir, [s.stack for s in comparison.series], hosts)
    return core.with_fitness_now(comparison, now, problems)


def run(args) -> int:
    """Exit 0: compared (stacks without results are named); 2: nothing to compare, or bad
    --stacks, or a results file that cannot be read."""
    results = args.results or args.project_dir / "results" / "bench"
    stacks = None
    if args.stacks is not None:
        stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
        bad = [s for s in stacks if "/" in s or s.startswith(".")]
        if not stacks or bad:
            print(f"error: --stacks {args.stacks!r}: a comma-separated list of stack names is needed "
                  f"(e.g. --stacks tp8,pp8,ep8)", file=sys.stderr)
            return 2
    try:
        comparison = core.load(results, stacks)
    except (BenchResultError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not comparison.series:
        asked = ", ".join(stacks) if stacks else "any stack"
        print(f"error: no benchmark results for {asked} under {results}", file=sys.stderr)
        for m in comparison.missing:
            print(f"  {m}", file=sys.stderr)
        if not comparison.missing:
            print("  run `python -m components bench --stack <stack>` first, for each stack to compare",
                  file=sys.stderr)
        return 2
    comparison = _fitness_now(comparison, args)
    png = write_png(figure(comparison), args.output or results / "compare.png")
    if args.json:
        json.dump({**core.as_dict(comparison), "png": str(png)}, sys.stdout, indent=2)
        print()
    else:
        print(core.render(comparison), end="")
        print(f"\npicture: {png}" + (" (rehearsal: not a GPU measurement)" if comparison.rehearsal else ""))
    return 0
