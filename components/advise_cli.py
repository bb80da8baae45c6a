"""``python -m components advise --stack NAME [--concurrency 1,32,64] [--facts]``: rank every layout
for the stack's host before deploying (components/core/advise.py), from the host block or, with
--facts, from the host facts the last `pulumi up` kept in the stack's state."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from .core import advise as A
from .core.config import parse_settings
from .core.errors import ConfigError
from .core.plan import load_stack_config
from .core.stack_config import stack_names
from .core.strategy import layout_of


def add_parser(sub) -> None:
    p = sub.add_parser("advise", help="rank every layout for the stack's host (estimates, before deploying)")
    p.add_argument("--stack", required=True, help="the stack whose host, model and serving settings to advise for")
    p.add_argument("--concurrency", default="1,32,64", help="concurrent requests to rank for, comma-separated (default 1,32,64)")
    p.add_argument("--input-len", type=int, default=1024, help="input tokens a request (default 1024)")
    p.add_argument("--output-len", type=int, default=1024, help="output tokens a request (default 1024)")
    p.add_argument("--facts", action="store_true", help="use the host facts in the stack's state (stack output `host`)")
    p.add_argument("--results", type=Path, default=Path("results/bench"),
                   help="benchmark results to calibrate on (default results/bench, one folder per stack)")
    p.add_argument("--top", type=int, default=8, help="layouts shown per concurrency (default 8)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--project-dir", default=".", type=Path)


def _concurrency(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or any(c < 1 or c > 100_000 for c in levels):
        raise ConfigError([], f"--concurrency {text!r}: give whole numbers 1..100000 separated by commas, e.g. 1,32,64")
    return levels


def _facts(project_dir: Path, stack: str) -> dict:
    """The stack output `host` (HostFacts.as_dict; a fleet: one entry per host, the first is used)."""
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise ConfigError([], "--facts reads the stack's state with `pulumi`, which is not on PATH: `source scripts/env.sh`")
    done = subprocess.run([pulumi, "stack", "output", "host", "--json", "--stack", stack], cwd=project_dir,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ConfigError([], f"`pulumi stack output host --stack {stack}` failed (exit {done.returncode}): "
                              f"{done.stderr.strip()[:300]}; deploy the stack once (`pulumi up`) or leave out --facts")
    facts = json.loads(done.stdout or "null")
    if isinstance(facts, dict) and "gpus" not in facts and facts and all(isinstance(v, dict) for v in facts.values()):
        facts = facts[sorted(facts)[0]]
    if not isinstance(facts, dict) or not facts.get("gpus"):
        raise ConfigError([], f"stack {stack} holds no host facts with GPUs in its state; deploy it or leave out --facts")
    return facts


def _stack_layouts(project_dir: Path) -> dict:
    layouts = {}
    for name in stack_names(project_dir):
        try:
            layouts[name] = layout_of(parse_settings(name, load_stack_config(project_dir, name)))
        except ConfigError:
            continue
    return layouts


def run(args) -> int:
    try:
        workload = A.Workload(_concurrency(args.concurrency), args.input_len, args.output_len)
        settings = parse_settings(args.stack, load_stack_config(args.project_dir, args.stack))
        source, notes = "host block", []
        if args.facts:
            settings, notes = A.host_from_facts(settings, _facts(args.project_dir, args.stack))
            source = "host facts in the stack's state"
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    layouts = _stack_layouts(args.project_dir)
    results = args.results if args.results.is_absolute() else args.project_dir / args.results
    measured, skipped = A.read_results(results, layouts)
    advice = A.advise(settings, workload, stacks=layouts, measured=measured, source=source)
    advice.notes[:0] = notes + skipped
    if args.json:
        json.dump(A.as_dict(advice), sys.stdout, indent=2)
        print()
    else:
        print(A.render(advice, args.top), end="")
    return 0
