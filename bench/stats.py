"""Pure parts of the benchmark runner: summaries of repeated runs, ratio tables, the text table.

No I/O here, so tests/test_bench_stats.py checks it with data.

Samples are dicts ``{"seconds": float, "connections": int, "sessions": int}``; a scenario's
results are ``{tool: [sample, ...]}`` (for fleet scaling, ``{hosts: {tool: [...]}}``).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Optional

TOOLS = ("gpu-serving", "empty-pulumi", "ansible", "pyinfra", "raw-ssh")
BASELINE = "raw-ssh"
OURS = "gpu-serving"
SCENARIOS = ("noop", "drift", "switch")
FLEET_SCENARIOS = ("noop", "switch")
TITLES = {
    "noop": "no-op converge (everything deployed)",
    "drift": "drift check (nothing drifted)",
    "switch": "strategy switch tp8 -> ep8 until /health_generate answers",
}


def summarize(values: Iterable[float]) -> Optional[dict]:
    """min / median / max / n of a list of numbers; None for no values."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    return {"min": xs[0], "median": statistics.median(xs), "max": xs[-1], "n": len(xs)}


def summarize_samples(samples: list[dict]) -> Optional[dict]:
    """{seconds: summary, connections: median, sessions: median} of one tool's runs."""
    seconds = summarize(s["seconds"] for s in samples)
    if seconds is None:
        return None
    out = {"seconds": seconds}
    for key in ("connections", "sessions"):
        values = [s[key] for s in samples if s.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def ratios(summaries: dict[str, Optional[dict]]) -> dict:
    """For one scenario: each tool's median over the raw-ssh median, and gpu-serving's median
    over each peer's."""
    med = {t: (s or {}).get("seconds", {}).get("median") for t, s in summaries.items() if s}
    base = med.get(BASELINE)
    ours = med.get(OURS)
    return {
        "over_raw": {t: ratio(m, base) for t, m in med.items()},
        "ours_over": {t: ratio(ours, m) for t, m in med.items() if t != OURS},
    }


def fleet_scaling(by_hosts: dict[int, dict[str, Optional[dict]]]) -> dict[str, dict[int, Optional[float]]]:
    """{tool: {N: T(N)/T(1)}} from {N: {tool: summary}} (medians)."""
    out: dict[str, dict[int, Optional[float]]] = {}
    one = by_hosts.get(1) or {}
    for n in sorted(by_hosts):
        for tool, s in by_hosts[n].items():
            if not s:
                continue
            t1 = (one.get(tool) or {}).get("seconds", {}).get("median")
            out.setdefault(tool, {})[n] = ratio(s["seconds"]["median"], t1)
    return out


def _f(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def _order(tools: Iterable[str]) -> list[str]:
    tools = list(tools)
    return [t for t in TOOLS if t in tools] + sorted(t for t in tools if t not in TOOLS)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (readable as plain text too)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def scenario_table(summaries: dict[str, Optional[dict]]) -> str:
    r = ratios(summaries)
    rows = []
    for tool in _order(summaries):
        s = summaries[tool]
        if not s:
            continue
        sec = s["seconds"]
        rows.append([tool, _f(sec["min"]), _f(sec["median"]), _f(sec["max"]), str(sec["n"]),
                     _num(s.get("connections")), _num(s.get("sessions")),
                     _f(r["over_raw"].get(tool), "{:.2f}x"),
                     "-" if tool == OURS else _f(r["ours_over"].get(tool), "{:.2f}x")])
    return table(["tool", "min s", "median s", "max s", "runs", "ssh conns", "ssh sessions",
                  "median / raw-ssh", "gpu-serving / tool"], rows)


def fleet_table(scenario: str, by_hosts: dict[int, dict[str, Optional[dict]]]) -> str:
    ns = sorted(by_hosts)
    scale = fleet_scaling(by_hosts)
    tools = _order({t for n in ns for t in by_hosts[n]})
    rows = []
    for tool in tools:
        cells = [tool]
        for n in ns:
            s = by_hosts[n].get(tool)
            cells.append(_f(s["seconds"]["median"]) if s else "-")
        for n in ns:
            if n != 1:
                cells.append(_f(scale.get(tool, {}).get(n), "{:.2f}"))
        for n in ns:
            s = by_hosts[n].get(tool)
            cells.append(_num(s.get("connections")) if s else "-")
        rows.append(cells)
    headers = (["tool"] + [f"T({n}) s" for n in ns] + [f"T({n})/T(1)" for n in ns if n != 1]
               + [f"conns N={n}" for n in ns])
    return table(headers, rows)


def report(results: dict) -> str:
    """The whole text report from a results document (see bench/runner.py)."""
    out = []
    summaries = results.get("summary", {})
    for scenario in SCENARIOS:
        if scenario in summaries.get("single", {}):
            out.append(f"### {TITLES[scenario]} (1 host)\n")
            out.append(scenario_table(summaries["single"][scenario]))
            out.append("")
    if results.get("split"):
        out.append("### where the time goes: medians of traced runs (`-v=9` engine log, bench/trace.py), seconds\n")
        out.append(split_table(results["split"]))
        out.append("")
    for scenario in FLEET_SCENARIOS:
        fleet = summaries.get("fleet", {}).get(scenario)
        if fleet:
            by_hosts = {int(n): v for n, v in fleet.items()}
            out.append(f"### fleet scaling: {TITLES[scenario]}, N hosts at once\n")
            out.append(fleet_table(scenario, by_hosts))
            out.append("")
    return "\n".join(out)


SPLIT_COMMANDS = {"noop": "`pulumi up --yes`", "drift": "`pulumi preview --refresh --expect-no-changes`"}


def summarize_split(splits: list[dict]) -> Optional[dict]:
    """The median of each phase (and of the total) over traced runs of one command."""
    if not splits:
        return None
    keys = [k for k in splits[0] if isinstance(splits[0][k], (int, float))]
    return {k: statistics.median(s[k] for s in splits) for k in keys} | {"n": len(splits)}


def split_table(split: dict) -> str:
    """{scenario: {tool: [trace.split() dicts]}} -> one row per command and tool, the phases'
    medians in seconds."""
    from .trace import PHASE_TITLES, PHASES
    phases = [*PHASES, "engine"]
    rows = []
    for scenario, by_tool in split.items():
        for tool in _order(by_tool):
            m = summarize_split(by_tool[tool])
            if not m:
                continue
            rows.append([f"{tool} {SPLIT_COMMANDS.get(scenario, scenario)}", _f(m["total"]), _num(m["program_runs"]), str(m["n"]),
                         *(_f(m[p]) for p in phases)])
    return table(["command", "total s", "program runs", "traced runs", *(PHASE_TITLES[p] for p in phases)], rows)


def summarize_results(samples: dict) -> dict:
    """{single: {scenario: {tool: summary}}, fleet: {scenario: {N: {tool: summary}}}} from the
    raw samples {single: {scenario: {tool: [..]}}, fleet: {scenario: {N: {tool: [..]}}}}."""
    out: dict = {"single": {}, "fleet": {}}
    for scenario, by_tool in (samples.get("single") or {}).items():
        out["single"][scenario] = {t: summarize_samples(v) for t, v in by_tool.items()}
    for scenario, by_n in (samples.get("fleet") or {}).items():
        out["fleet"][scenario] = {str(n): {t: summarize_samples(v) for t, v in by_tool.items()}
                                  for n, by_tool in by_n.items()}
    out["ratios"] = {scenario: ratios(v) for scenario, v in out["single"].items()}
    out["scaling"] = {scenario: {t: {str(n): r for n, r in d.items()} for t, d in
                                 fleet_scaling({int(n): v for n, v in by_n.items()}).items()}
                      for scenario, by_n in out["fleet"].items()}
    return out
