"""The recommendation for a stack of the project (core/recommend.py judges; this gathers what it
judges): the candidates are the project's stacks that deploy to the same machines (only those
gpu-serving:autoswitch.candidates lists, when it lists some); their figures are the measured
`compare` curves (results/bench), and the advisor's estimates (core/advise.py) where a load lies
outside them; the policy is the stack's gpu-serving:autoswitch; a switch's cost is the forecast
from the hosts' recorded starts (core/switch_cost.py) where the caller has them, else the
configured autoswitch.switchMinutes. Read from the stack files and the results folder on this
machine, never a host: `python -m components recommend` prints it (components/cli/recommend.py),
each watch tick keeps it (components/traffic_watch.py, which reads the starts).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

from . import advise as A
from . import autoswitch
from . import compare
from . import recommend as RC
from . import switch_cost
from .advise_results import read_results
from .config import AUTOSWITCH_KEY, StackSettings
from .errors import ConfigError
from .plan import CheckedStack, check_stack
from .rules import NAMESPACE
from .start_phases import StartRecord
from .stack_config import from_files, stack_names
from .strategy import layout_of

# Where the advisor is asked for an estimate: doubling levels cover any observed load.
ESTIMATE_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _machines(checked: CheckedStack) -> tuple[str, ...]:
    return tuple(sorted(s.host.machine for _, s in checked.settings.per_host()))


def candidates(project_dir: Path, stack: str) -> tuple[CheckedStack, list[str]]:
    """The stack's checked settings and the stacks that deploy to the same machines (itself first),
    of autoswitch.candidates when it names some (the operator's list: the traffic moves between
    those only)."""
    mine = check_stack(stack, from_files(project_dir, stack), project_dir)
    allowed = autoswitch.parse(from_files(project_dir, stack).values.get(f"{NAMESPACE}:{AUTOSWITCH_KEY}")).candidates
    out = [stack]
    for other in stack_names(project_dir):
        if other == stack or (allowed and other not in allowed):
            continue
        try:
            if _machines(check_stack(other, from_files(project_dir, other), project_dir)) == _machines(mine):
                out.append(other)
        except ConfigError:
            continue  # a stack that cannot deploy is no candidate
    return mine, out


def _estimates(settings: StackSettings, stacks: Mapping[str, StackSettings], results: Path, input_len: int,
               output_len: int) -> dict[str, dict[int, float]]:
    """The advisor's tok/s per stack and level (calibrated on the results of this workload)."""
    layouts = {name: layout_of(s) for name, s in stacks.items()}
    measured, _ = read_results(results, layouts)
    advice = A.advise(settings, A.Workload(ESTIMATE_LEVELS, input_len, output_len), stacks=layouts, measured=measured)
    out: dict[str, dict[int, float]] = {}
    for name, layout in layouts.items():
        label = A.layout_name(layout)
        for c, ranked in advice.ranking.items():
            for e in ranked:
                if e.name == label:
                    out.setdefault(name, {})[c] = e.tok_s
    return out


def forecast_costs(starts: Mapping[str, Sequence[StartRecord]], source: str, targets: Mapping[str, str]
                   ) -> dict[str, RC.Cost]:
    """One host's switch to each target stack (stack -> its strategy, the layout starts are
    recorded under), from each host's recorded starts (host -> its records: core/switch_cost.py's
    forecast): the slowest host's, since a batch of the roll lasts as long as its slowest host.
    A target some host has no figure for is left out: the recommendation then takes the
    configured autoswitch.switchMinutes."""
    out: dict[str, RC.Cost] = {}
    if not starts:
        return out
    for stack, layout in targets.items():
        # Every record read from a host's own file is that host's, whatever name it was written under.
        per_host = [switch_cost.forecast(host=host, source=source, target=layout,
                                         history=[replace(r, host=host) for r in records if r.layout == layout])
                    for host, records in starts.items()]
        if any(f.seconds is None for f in per_host):
            continue
        slowest = max(per_host, key=lambda f: f.seconds or 0.0)
        basis = "history" if all(f.basis == "history" for f in per_host) else "estimate"
        out[stack] = RC.Cost(slowest.seconds or 0.0, basis, slowest.text)
    return out


def build(project_dir: Path, stack: str, concurrency: Optional[float], *, results: Path, now: float,
          last_switch_at: Optional[float] = None, starts: Optional[Mapping[str, Sequence[StartRecord]]] = None
          ) -> RC.Recommendation:
    """The recommendation for `stack` at `concurrency` (raises ConfigError on bad settings).
    `starts`: each host's recorded starts (host -> records), for the switch's forecast."""
    checked, names = candidates(project_dir, stack)
    settings = checked.settings
    config = from_files(project_dir, stack)
    auto = autoswitch.parse(config.values.get(f"{NAMESPACE}:{AUTOSWITCH_KEY}"))
    results = results if results.is_absolute() else project_dir / results
    comparison = compare.load(results, names)
    per_stack = {n: check_stack(n, from_files(project_dir, n), project_dir).settings for n in names}
    b = settings.benchmark
    estimates = _estimates(settings, per_stack, results, b.input_len, b.output_len)
    strategies = {n: s.strategy_name.upper() for n, s in per_stack.items()}
    curves = [c for c in RC.curves_from(comparison, estimates, strategies) if c.stack in names]
    hosts = 1 if settings.node_names else len(settings.per_host())
    costs = forecast_costs(starts or {}, settings.strategy_name, {n: per_stack[n].strategy_name for n in names if n != stack})
    return RC.recommend(stack, curves, concurrency, hosts=hosts, policy=auto.policy(), now=now,
                        last_switch_at=last_switch_at, costs=costs,
                        batch_size=settings.rollout.max_unavailable if settings.router else hosts)
