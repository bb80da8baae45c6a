"""Pure parts of the benchmark runner: summaries of repeated runs, ratio tables, the text table.

No I/O here, so tests/test_bench_stats.py checks it with data.

Samples are dicts ``{"seconds": float, "connections": int, "sessions": int}``; a scenario's
results are ``{tool: [sample, ...]}`` (for fleet scaling, ``{hosts: {tool: [...]}}``).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Optional

from . import acct, cpusplit

TOOLS = ("gpu-serving", "empty-pulumi", "ansible", "pyinfra", "raw-ssh")
# Measured only when named (`--tools ...,gpu-serving-cold`): gpu-serving with warm start off;
# gpu-serving with the state written once at the end (what the state's writes cost: a measurement).
OPTIONAL_TOOLS = ("gpu-serving-cold", "gpu-serving-no-checkpoints")
BASELINE = "raw-ssh"
OURS = "gpu-serving"
SCENARIOS = ("noop", "drift", "switch", "router")
FLEET_SCENARIOS = ("noop", "switch")
# gpu-serving only, on a fleet (bench/router.py): not in the per-tool tables.
ROUTER = "router"
TITLES = {
    "noop": "no-op converge (everything deployed)",
    "drift": "drift check (nothing drifted)",
    "switch": "strategy switch tp8 -> ep8 until /health_generate answers",
}


# bench/downtime.py's figures of a gpu-serving switch, in the order of the table's columns.
DOWNTIME_KEYS = ("stop_to_start", "ready_to_return", "idle_sessions", "idle_seconds")


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
    for key in ("connections", "sessions", "cpu"):
        values = [s[key] for s in samples if s.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    downtimes = [s["downtime"] for s in samples if s.get("downtime")]
    if downtimes:
        # Medians over the runs of each figure (bench/downtime.py); runs missing one are left out of it.
        out["downtime"] = {key: (statistics.median(v) if v else None) for key in DOWNTIME_KEYS
                           for v in [[d[key] for d in downtimes if d.get(key) is not None]]}
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
    known = (TOOLS[0], *OPTIONAL_TOOLS, *TOOLS[1:])
    return [t for t in known if t in tools] + sorted(t for t in tools if t not in known)


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
                     _num(s.get("connections")), _num(s.get("sessions")), _f(s.get("cpu")),
                     _f(r["over_raw"].get(tool), "{:.2f}x"),
                     "-" if tool == OURS else _f(r["ours_over"].get(tool), "{:.2f}x")])
    return table(["tool", "min s", "median s", "max s", "runs", "ssh conns", "ssh sessions", "CPU s",
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
        for n in ns:
            s = by_hosts[n].get(tool)
            cells.append(_f(s.get("cpu")) if s else "-")
        rows.append(cells)
    # CPU s: what the machine worked during the run (the tool and its rehearsal hosts share its
    # cores): over the core count, the least T(N) can be here whatever the tool's latency.
    headers = (["tool"] + [f"T({n}) s" for n in ns] + [f"T({n})/T(1)" for n in ns if n != 1]
               + [f"conns N={n}" for n in ns] + [f"CPU s N={n}" for n in ns])
    return table(headers, rows)


ROUTER_KINDS = {"rolling": "with router: rolling, 1 host at a time",
                "all_at_once": "no router: every host at once"}


def router_summary(samples: Optional[dict]) -> Optional[dict]:
    """The "fleet switch with router" figures (bench/router.py's samples {hosts, clients, rolling:
    [run], all_at_once: [run]}, a run {seconds, served, failed, fewest_serving}): per kind, the
    wall time's summary, the median of requests served and failed, every run's failures and the
    fewest hosts the router routed to in any run. None without samples."""
    if not samples:
        return None
    out: dict = {"hosts": samples.get("hosts"), "clients": samples.get("clients")}
    for kind in ROUTER_KINDS:
        runs = samples.get(kind) or []
        if not runs:
            continue
        fewest = [r["fewest_serving"] for r in runs if r.get("fewest_serving") is not None]
        out[kind] = {"seconds": summarize(r["seconds"] for r in runs),
                     "served": statistics.median(r["served"] for r in runs),
                     "failed": statistics.median(r["failed"] for r in runs),
                     "failed_each": [r["failed"] for r in runs],
                     "fewest_serving": min(fewest) if fewest else None}
    return out


def router_table(summary: dict) -> str:
    rows = []
    for kind, title in ROUTER_KINDS.items():
        s = summary.get(kind)
        if not s:
            continue
        sec = s["seconds"]
        rows.append([title, _f(sec["median"], "{:.1f}"), f"{_f(sec['min'], '{:.1f}')}-{_f(sec['max'], '{:.1f}')}", str(sec["n"]),
                     _num(s["served"]), _num(s["failed"]), ", ".join(str(f) for f in s["failed_each"]),
                     f"{_num(s['fewest_serving'])} of {summary.get('hosts')}"])
    return table(["switch tp8 -> ep8", "median s", "min-max s", "runs", "served (median)", "failed (median)",
                  "failed each run", "fewest hosts routed"], rows)


def report(results: dict) -> str:
    """The whole text report from a results document (see bench/runner.py)."""
    out: list[str] = []

    def section(title: str, body: str) -> None:
        # a heading and its table, or nothing when the run has no such table
        if body:
            out.extend([title + "\n", body, ""])

    summaries = results.get("summary", {})
    samples = results.get("samples") or {}
    for scenario in SCENARIOS:
        if scenario in summaries.get("single", {}):
            section(f"### {TITLES[scenario]} (1 host)", scenario_table(summaries["single"][scenario]))
    if results.get("split"):
        section("### where the time goes: medians of traced runs (`-v=9` engine log, bench/trace.py), seconds",
                split_table(results["split"]))
    if results.get("split_switch"):
        section("### where a switch's time goes: medians of gpu-serving's traced switches (`-v=9`, bench/trace.py), "
                "seconds", split_switch_table(results["split_switch"]))
    for scenario in FLEET_SCENARIOS:
        fleet = summaries.get("fleet", {}).get(scenario)
        if fleet:
            section(f"### fleet scaling: {TITLES[scenario]}, N hosts at once",
                    fleet_table(scenario, {int(n): v for n, v in fleet.items()}))
    router = summaries.get(ROUTER)
    if router:
        section(f"### fleet switch with router: tp8 -> ep8 on {router['hosts']} hosts, {router['clients']} clients "
                "sending requests through the router during the `pulumi up`", router_table(router))
    section("### where the CPU goes: process accounting during the timed runs (`--account`, bench/acct.py), medians",
            accounted_table(samples))
    section("### whose CPU: the rehearsal hosts' or this machine's (the tool's), sampled by perf during the timed "
            "runs (`--cpu-split`, bench/cpusplit.py), medians", cpu_split_table(samples))
    section("What each host past the first adds (CPU s; on a real fleet the hosts' part runs on each host's own CPUs):",
            cpu_split_per_host(samples))
    switch = summaries.get("fleet", {}).get("switch") or (
        {"1": summaries["single"]["switch"]} if "switch" in summaries.get("single", {}) else {})
    load = (results.get("config") or {}).get("load_seconds") or 0
    section(f"### gpu-serving switch downtime, from the host side (engine loads {load:g} s)",
            downtime_table({int(n): v for n, v in switch.items()}))
    return "\n".join(out)


def accounted_table(samples: dict, top: int = 6) -> str:
    """With `bench/run --account`: one row per scenario, fleet size and tool, the medians over its
    runs of the machine's CPU, of what ended processes were accounted, and of the `top` commands'
    CPU seconds (bench/acct.py)."""
    rows = []
    for label, _sc, _n, by_tool in _groups(samples):
        for tool in _order(by_tool):
            runs = [s for s in by_tool[tool] if "accounted" in s]
            if not runs:
                continue
            commands = {c for s in runs for c in s["accounted"]}
            medians = {c: {k: statistics.median(s["accounted"].get(c, {}).get(k, 0) for s in runs)
                           for k in ("count", "cpu")} for c in commands}
            rows.append([f"{label} {tool}", str(len(runs)), _f(statistics.median(s["cpu"] for s in runs)),
                         _f(statistics.median(sum(v["cpu"] for v in s["accounted"].values()) for s in runs)),
                         ", ".join(f"{c} {cpu:.2f}" for c, _count, cpu in acct.top(medians, top))])
    return table(["run", "runs", "machine CPU s", "accounted CPU s", f"top {top} commands, CPU s"], rows) if rows else ""


def _groups(samples: dict) -> list[tuple[str, str, int, dict]]:
    """(label, scenario, hosts, {tool: [samples]}) for the single-host and fleet samples."""
    out = [(f"{sc} N=1", sc, 1, by_tool) for sc, by_tool in (samples.get("single") or {}).items()]
    out += [(f"{sc} N={n}", sc, int(n), by_tool) for sc, by_n in (samples.get("fleet") or {}).items()
            for n, by_tool in sorted(by_n.items(), key=lambda kv: int(kv[0])) if int(n) > 1]
    return out


def _split_medians(runs: list[dict]) -> dict[str, float]:
    return {side: statistics.median(s["cpu_split"][side] for s in runs) for side in cpusplit.SIDES}


def cpu_split_table(samples: dict, top: int = 4) -> str:
    """With `bench/run --cpu-split`: one row per scenario, fleet size and tool, the medians over its
    runs of the wall time, of the CPU seconds sampled on the rehearsal hosts and on this machine
    (the tool), of the cores' idle seconds, and each side's `top` commands (bench/cpusplit.py)."""
    rows = []
    for label, _sc, _n, by_tool in _groups(samples):
        for tool in _order(by_tool):
            runs = [s for s in by_tool[tool] if "cpu_split" in s]
            if not runs:
                continue
            m = _split_medians(runs)
            tops = {}
            for side in ("machine", "hosts"):
                names = {c for s in runs for c, _ in s["cpu_split"]["top"][side]}
                per = {c: statistics.median(dict(s["cpu_split"]["top"][side]).get(c, 0) for s in runs) for c in names}
                tops[side] = ", ".join(f"{c} {v:.2f}" for c, v in sorted(per.items(), key=lambda kv: -kv[1])[:top])
            rows.append([f"{label} {tool}", str(len(runs)), _f(statistics.median(s["seconds"] for s in runs)),
                         _f(m["machine"]), _f(m["hosts"]), _f(m["idle"]), tops["machine"], tops["hosts"]])
    return table(["run", "runs", "wall s", "this machine (the tool) CPU s", "rehearsal hosts CPU s", "idle core s",
                  f"the tool's top {top}", f"the hosts' top {top}"], rows) if rows else ""


def cpu_split_per_host(samples: dict) -> str:
    """Per scenario and tool measured on one host and on a fleet: what each host past the first
    adds to the tool's CPU seconds and to the hosts' (cpusplit.per_host of the medians)."""
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for _label, sc, n, by_tool in _groups(samples):
        for tool, runs in by_tool.items():
            runs = [s for s in runs if "cpu_split" in s]
            if runs:
                by.setdefault((sc, tool), {})[n] = _split_medians(runs)
    rows = []
    for (sc, tool), by_hosts in by.items():
        tool_part, host_part = cpusplit.per_host(by_hosts, "machine"), cpusplit.per_host(by_hosts, "hosts")
        if tool_part is None:
            continue
        both = tool_part + host_part
        rows.append([sc, tool, f"1 -> {max(by_hosts)}", _f(tool_part), _f(host_part), _f(both),
                     _f(100 * host_part / both if both else None, "{:.0f}%")])
    return table(["scenario", "tool", "hosts", "the tool CPU s", "the hosts CPU s", "both", "the hosts' share"],
                 rows) if rows else ""


def downtime_table(by_hosts: dict[int, dict[str, Optional[dict]]]) -> str:
    """gpu-serving's switch, from the host side, one row per fleet size (medians of the runs)."""
    rows = []
    for n in sorted(by_hosts):
        s = by_hosts[n].get(OURS) or {}
        d = s.get("downtime")
        if not d:
            continue
        rows.append([str(n), str(s["seconds"]["n"]), _f(s["seconds"]["median"]), _f(d.get("stop_to_start")),
                     _f(d.get("ready_to_return")), _num(d.get("idle_sessions")), _f(d.get("idle_seconds"))])
    return table(["hosts", "runs", "switch s", "(a) old last generation -> new start s",
                  "(b) new first generation -> up returned s", "(c) ssh sessions while idle", "GPUs idle s"], rows) if rows else ""


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


def split_switch_table(by_hosts: dict) -> str:
    """{hosts: [trace.switch_phases() dicts]} -> one row per fleet size, the parts' medians."""
    from .trace import SWITCH_PHASE_TITLES, SWITCH_PHASES
    parts = [*SWITCH_PHASES, "cli"]
    rows = []
    for n in sorted(by_hosts, key=int):
        m = summarize_split(by_hosts[n])
        if m:
            rows.append([str(n), str(m["n"]), _f(m["total"]), *(_f(m[p]) for p in parts)])
    return table(["hosts", "traced runs", "total s", *(SWITCH_PHASE_TITLES[p] for p in parts)], rows)


def summarize_results(samples: dict) -> dict:
    """{single: {scenario: {tool: summary}}, fleet: {scenario: {N: {tool: summary}}}} from the
    raw samples {single: {scenario: {tool: [..]}}, fleet: {scenario: {N: {tool: [..]}}}}."""
    out: dict = {"single": {}, "fleet": {}}
    if samples.get(ROUTER):
        out[ROUTER] = router_summary(samples[ROUTER])
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
