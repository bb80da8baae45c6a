"""``python -m components recommend --stack NAME [--concurrency C]``: the strategy the traffic calls
for, with its numbers (components/core/recommend.py). The load is the watch's window for the stack
(status.json in --state-dir) unless --concurrency gives one; the candidates are the project's
stacks that deploy to the same machines; their figures are the measured `compare` curves
(results/bench), and the advisor's estimates (core/advise.py) where a load lies outside them; the
policy is gpu-serving:autoswitch. `watch` makes the same recommendation each tick (`build`).
Exit 0 (stay or switch: both are answers); 2 on a bad setting or flag, or no load to judge.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from .core import advise as A
from .core import autoswitch
from .core import compare
from .core import recommend as RC
from .core.advise_results import read_results
from .core.config import AUTOSWITCH_KEY
from .core.errors import ConfigError, SettingError
from .core.rules import NAMESPACE
from .core.plan import CheckedStack, check_stack
from .core.stack_config import from_files, stack_names
from .core.strategy import layout_of

DEFAULT_STATE_DIR = "~/.local/state/gpu-serving-watch"
# Where the advisor is asked for an estimate: doubling levels cover any observed load.
ESTIMATE_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def add_parser(sub) -> None:
    p = sub.add_parser("recommend", help="the strategy the observed traffic calls for, with its numbers")
    p.add_argument("--stack", required=True, help="the stack serving now")
    p.add_argument("--concurrency", type=float, help="requests in flight to judge at (default: the watch's window)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"the watch's state directory (default {DEFAULT_STATE_DIR})")
    p.add_argument("--results", type=Path, default=Path("results/bench"), help="benchmark results (default results/bench)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--project-dir", default=".", type=Path)


def _machines(checked) -> tuple[str, ...]:
    return tuple(sorted(s.host.machine for _, s in checked.settings.per_host()))


def candidates(project_dir: Path, stack: str) -> tuple[CheckedStack, list[str]]:
    """The stack's checked settings and the stacks that deploy to the same machines (itself first)."""
    mine = check_stack(stack, from_files(project_dir, stack), project_dir)
    out = [stack]
    for other in stack_names(project_dir):
        if other == stack:
            continue
        try:
            if _machines(check_stack(other, from_files(project_dir, other), project_dir)) == _machines(mine):
                out.append(other)
        except ConfigError:
            continue  # a stack that cannot deploy is no candidate
    return mine, out


def _estimates(settings, stacks: dict, results: Path, input_len: int, output_len: int) -> dict[str, dict[int, float]]:
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


def build(project_dir: Path, stack: str, concurrency: Optional[float], *, results: Path, now: float,
          last_switch_at: Optional[float] = None) -> RC.Recommendation:
    """The recommendation for `stack` at `concurrency` (raises ConfigError on bad settings)."""
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
    return RC.recommend(stack, curves, concurrency, hosts=hosts, policy=auto.policy(), now=now,
                        last_switch_at=last_switch_at,
                        batch_size=settings.rollout.max_unavailable if settings.router else hosts)


def observed(state_dir: Path, stack: str) -> Optional[float]:
    """The watch's median concurrency for `stack` (status.json), or None."""
    try:
        doc = json.loads((state_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    for g in (doc.get("traffic") or {}).get("groups", []):
        if g.get("stack") == stack:
            return (g.get("summary") or {}).get("concurrency")
    return None


def render(rec: RC.Recommendation) -> str:
    lines = [rec.line(), "", f"{'stack':8} {'strategy':10} {'C/host':>7} {'tok/s':>9} {'TTFT ms':>8} {'ITL ms':>7}  basis"]
    for f in sorted(rec.figures, key=lambda f: -(f.tok_s or 0)):
        lines.append(f"{f.stack:8} {f.strategy:10} {f.per_host_concurrency:7.1f} {RC._tps(f.tok_s):>9} "
                     f"{'' if f.ttft_ms is None else f'{f.ttft_ms:,.0f}':>8} {'' if f.itl_ms is None else f'{f.itl_ms:,.1f}':>7}"
                     f"  {f.detail}{'' if f.stack != rec.current else ' (serving)'}")
    if rec.cost is not None:
        lines += ["", f"switch cost: {rec.cost.seconds / 60:.0f} min a host ({rec.cost.basis}: {rec.cost.text})"]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    import time
    state_dir = Path(args.state_dir).expanduser()
    concurrency = args.concurrency
    try:
        if concurrency is not None and not 0 <= concurrency <= 1_000_000:
            raise ConfigError([SettingError("--concurrency", f"{concurrency:g} is not a number of requests in flight",
                                            "--concurrency 32")])
        if concurrency is None:
            concurrency = observed(state_dir, args.stack)
            if concurrency is None:
                raise ConfigError([SettingError("--concurrency", f"no load observed for stack {args.stack} in "
                                                f"{state_dir / 'status.json'}",
                                                "run `python -m components watch` while it serves, or give --concurrency 32")])
        rec = build(args.project_dir, args.stack, concurrency, results=args.results, now=time.time())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(rec.as_dict(), sys.stdout, indent=2)
        print()
    else:
        print(render(rec), end="")
    return 0
