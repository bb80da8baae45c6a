"""The stack outputs as they are stored, and so printed after every update (issue 36.18). Pulumi
prints every stack output in full after each `up`, whatever changed: the host facts' per-GPU list
was 8 blocks of 6 lines an up on an 8-GPU box, the memory plan another 25 (80 for PP8). Each
output keeps what a reader of it needs, on as few lines as the engine prints it:

- `host`: the facts as HostFacts.as_dict gives them (what `advise --facts` reads: gpu_count,
  gpu_memory_mib, gpu_models, interconnect), with the per-GPU details as one line of text (index,
  bus id, UUID, and a name, memory or driver that differs from the first GPU's) and any other
  nested object as one line of `key=value` text: the engine's display cuts a long line at 150
  characters, `pulumi stack output host` prints all of it. Not the fitness facts (core/fitness.py):
  30 fields a GPU, some of them readings that move from one second to the next (the clocks now,
  the performance state), so every `up` would print the output as changed; they stay in the
  host-facts resource's state and in each benchmark run's meta.json (docs/fitness.md);
- `memory`: the figures the plan computes (not the settings it echoes), a line for each run of
  pipeline stages with the same figures when there are several, the nodes of a multi-node layout; its warnings are said as warnings,
  once a command (run_kind.py), and `python -m components plan --stack <s>` has the whole plan;
- `strategy`: the name, the world size and the layout in one line.
Pure; cases in tests/data/outputs/.
"""
from __future__ import annotations

from typing import Any, Optional

from .layout_words import layout_text

# Host facts left out of the stack output `host` (see the module's docstring).
NOT_IN_HOST_OUTPUT = ("fitness",)
# The memory plan's own figures, in the order shown (the rest are the settings it was given).
MEMORY_FIGURES = ("weights_gb", "kv_pool_gb", "kv_bytes_per_token", "max_total_tokens", "static_budget_gb", "token_demand")


def _number(value: Any) -> str:
    """A whole number as one (the engine hands numbers back as floats: 0.0)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def gpus_line(gpus: list[dict[str, Any]]) -> str:
    """`0 00000000:16:00.0 GPU-c2a7...; 1 ...`: each GPU's index, bus id and UUID, and its name,
    memory or driver where they differ from the first GPU's (the summary fields hold those)."""
    if not gpus:
        return ""
    first = gpus[0]
    parts = []
    for g in gpus:
        words = [_number(g.get("index", "?")), str(g.get("bus_id") or "?"), str(g.get("uuid") or "?")]
        if g.get("name") != first.get("name"):
            words.append(str(g.get("name")))
        if g.get("memory_mib") != first.get("memory_mib"):
            words.append(f"{_number(g.get('memory_mib'))} MiB")
        if g.get("driver_version") != first.get("driver_version"):
            words.append(f"driver {g.get('driver_version')}")
        parts.append(" ".join(words))
    return "; ".join(parts)


def one_line(value: Any) -> str:
    """A nested value as one line of text: `key=value` pairs (empty ones left out) for an object,
    `; ` between the objects of a list."""
    if isinstance(value, dict):
        # Sorted: the engine hands an object's keys back in no fixed order.
        return " ".join(f"{k}={one_line(v)}" for k, v in sorted(value.items()) if v not in (None, "", [], (), {}))
    if isinstance(value, (list, tuple)):
        return ("; " if any(isinstance(v, dict) for v in value) else ",").join(one_line(v) for v in value)
    return _number(value)


def host_output(facts: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The stack output `host` from the host facts (HostFacts.as_dict): the summary fields as they
    are, the per-GPU details (`gpus`) and any other nested object as one line of text each, the
    fitness facts left out (see the module's docstring)."""
    if not isinstance(facts, dict):
        return facts
    out: dict[str, Any] = {}
    for key, value in sorted(facts.items()):
        if key in NOT_IN_HOST_OUTPUT:
            continue
        if key == "gpus":
            out[key] = gpus_line([g for g in value or [] if isinstance(g, dict)])
        elif isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
            out[key] = one_line(value)
        else:
            out[key] = value
    return out


def stage_lines(stages: list[dict[str, Any]]) -> list[str]:
    """One line for each run of pipeline stages with the same figures (61 layers over PP8: stages
    0-2 hold 7 layers, 3-7 hold 8): `stages 0-2: 7 layers a GPU, weights 67.7 GB, KV pool 16.78 GB
    (2,233,644 tokens)`."""
    def figures(st: dict[str, Any]) -> str:
        return (f"{_number(st.get('layers'))} layers, weights {st.get('weights_gb')} GB, KV pool {st.get('kv_pool_gb')} GB "
                f"({int(st.get('max_total_tokens') or 0):,} tokens)")
    runs: list[tuple[str, str, str]] = []  # first stage, last stage, figures
    for st in stages:
        text, index = figures(st), _number(st.get("stage"))
        if runs and runs[-1][2] == text:
            runs[-1] = (runs[-1][0], index, text)
        else:
            runs.append((index, index, text))
    return [f"stage {a}: {t}" if a == b else f"stages {a}-{b}: {t}" for a, b, t in runs]


def memory_output(memory: dict[str, Any]) -> dict[str, Any]:
    """The stack output `memory` from the plan's (MemoryPlan.as_dict)."""
    out: dict[str, Any] = {k: memory[k] for k in MEMORY_FIGURES if k in memory}
    stages = memory.get("stages") or []
    if len(stages) > 1:
        out["stages"] = stage_lines(stages)
    if memory.get("nodes"):
        out["nodes"] = memory["nodes"]
    return out


def layout_line(layout: dict[str, Any]) -> str:
    """`tp 8 x pp 1 (ep 8, dp 1; attention tp 8, MoE tp 1, all-to-all none)` (strategy.layout_text)."""
    return layout_text(layout, detail=True)


def strategy_output(name: str, world_size: int, layout: dict[str, Any], nodes: Optional[list[Any]] = None) -> dict[str, Any]:
    """The stack output `strategy`."""
    out: dict[str, Any] = {"name": name, "world_size": world_size, "layout": layout_line(layout)}
    if nodes:
        out["nodes"] = list(nodes)
    return out
