"""``python -m components recommend --stack NAME [--concurrency C]``: the strategy the traffic calls
for, with its numbers (components/core/recommend.py). The load is the watch's window for the stack
(status.json in --state-dir) unless --concurrency gives one; the candidates, their figures and the
policy are gathered by components/core/recommend_stacks.py (`build`), the same recommendation
`watch` makes each tick. Exit 0 (stay or switch: both are answers); 2 on a bad setting or flag,
or no load to judge.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from ..core import recommend as RC
from ..core.errors import ConfigError, SettingError
from ..core.recommend_stacks import build

DEFAULT_STATE_DIR = "~/.local/state/gpu-serving-watch"


def add_parser(sub) -> None:
    p = sub.add_parser("recommend", help="the strategy the observed traffic calls for, with its numbers")
    p.add_argument("--stack", required=True, help="the stack serving now")
    p.add_argument("--concurrency", type=float, help="requests in flight to judge at (default: the watch's window)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"the watch's state directory (default {DEFAULT_STATE_DIR})")
    p.add_argument("--results", type=Path, default=Path("results/bench"), help="benchmark results (default results/bench)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--project-dir", default=".", type=Path)


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
