"""``python -m components advise --stack NAME [--concurrency 1,32,64] [--facts]``: rank every layout
for the stack's host before deploying (components/core/advise.py), from the host block or, with
--facts, from the host facts the last `pulumi up` kept in the stack's state. The workload defaults
to the stack's `benchmark` settings, the one `components bench` measures. Exit 0; 1 when the
stack itself is refused by plan, preview and up (the advice is printed all the same); 2 when it
cannot be advised for (its settings cannot be read, a bad flag)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ..core import advise as A
from ..core import advise_report as report
from ..core.advise_results import read_results, run_meta
from ..core.config import parse_settings
from ..core.errors import ConfigError
from ..core.fitness_read import mark
from ..core.plan import check_stack, load_stack_config
from ..core.stack_config import from_files, stack_names
from ..core.strategy import layout_of
from ..remote.ledger_store import warnings_before_stack


def add_parser(sub) -> None:
    p = sub.add_parser("advise", help="rank every layout for the stack's host (estimates, before deploying)")
    p.add_argument("--stack", required=True, help="the stack whose host, model and serving settings to advise for")
    p.add_argument("--concurrency", help="concurrent requests to rank for, comma-separated "
                                          "(default: the stack's benchmark.concurrency)")
    p.add_argument("--input-len", type=int, help="input tokens a request (default: the stack's benchmark.inputLen)")
    p.add_argument("--output-len", type=int, help="output tokens a request (default: the stack's benchmark.outputLen)")
    p.add_argument("--facts", action="store_true", help="use the host facts in the stack's state (stack output `host`)")
    p.add_argument("--results", type=Path, default=Path("results/bench"),
                   help="benchmark results to calibrate on (default results/bench, one folder per stack)")
    p.add_argument("--top", type=int, default=8, help="layouts shown per concurrency (default 8)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--project-dir", default=".", type=Path)
    p.add_argument("--no-host-read", action="store_true",
                   help="do not read the hosts' fitness now (results are then not checked against the machine)")


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


def _machines(settings) -> set:
    """The machines a stack deploys to (a rehearsal host by its name, a real one by its address)."""
    entries = settings.hosts or (settings.host,)
    return {e.address or f"rehearsal:{e.rehearsal}" for e in entries}


def _stack_layouts(project_dir: Path, advised=None) -> dict:
    """Every stack of the project on the advised stack's machines (all of them without one): its
    layout, or why its settings cannot be read or it is not one server's layout."""
    layouts: dict = {}
    for name in stack_names(project_dir):
        try:
            settings = parse_settings(name, load_stack_config(project_dir, name))
        except ConfigError as exc:
            first = exc.errors[0] if exc.errors else exc
            layouts[name] = str(first)[:300]
            continue
        if advised is not None and not (_machines(settings) & _machines(advised)):
            continue  # another machine's stack: its figures say nothing about this host
        if getattr(settings, "disaggregation", None) is not None:
            layouts[name] = "prefill/decode disaggregation: two servers in two roles, not one layout of this host"
            continue
        layouts[name] = layout_of(settings)
    return layouts


def _fitness_now(args, results: Path, stacks: list[str]):
    """How a stored run is judged against its host now (None: nothing to judge: no run recorded
    fitness), and what kept a host from being read: a run on a machine that changed since is
    left out of the calibration (fitness_read.mark)."""
    metas = [run_meta(d) for s in stacks if (results / s).is_dir() for d in (results / s).iterdir() if d.is_dir()]
    hosts = {str(m.get("host")) for m in metas if isinstance(m.get("fitness"), dict)}
    if not hosts:
        return None, []
    if args.no_host_read:
        return None, ["the hosts' fitness was not read (--no-host-read): results are not checked against the machine now"]
    from ..remote.fitness_now import read_hosts  # the SSH side, for this command only
    now, problems = read_hosts(args.project_dir, stacks, hosts)
    return (lambda meta: mark(meta.get("fitness") if isinstance(meta.get("fitness"), dict) else None,
                              now.get(str(meta.get("host"))))), problems


def _ledger(project_dir: Path, stacks: list[str]) -> dict[str, list[str]]:
    """The failure ledger's warnings before each stack's start, as `plan` says them (a stack the
    program refuses starts nothing: its refusal is said instead)."""
    out = {}
    for name in stacks:
        try:
            warnings = warnings_before_stack(check_stack(name, from_files(project_dir, name), project_dir))
        except ConfigError:
            continue
        if warnings:
            out[name] = warnings
    return out


def _workload(args, settings) -> tuple[A.Workload, str]:
    """The flags' workload, the stack's benchmark settings for what they leave out."""
    b = settings.benchmark
    concurrency = _concurrency(args.concurrency) if args.concurrency is not None else tuple(b.concurrency)
    lengths = []
    for flag, given, default in (("--input-len", args.input_len, b.input_len), ("--output-len", args.output_len, b.output_len)):
        if given is not None and not 1 <= given <= 1_048_576:
            raise ConfigError([], f"{flag} {given}: give a number of tokens 1..1048576")
        lengths.append(default if given is None else given)
    given = [f for f, v in (("--concurrency", args.concurrency), ("--input-len", args.input_len),
                            ("--output-len", args.output_len)) if v is not None]
    source = ("the stack's benchmark settings" if not given else
              f"{', '.join(given)}" + (", the rest from the stack's benchmark settings" if len(given) < 3 else ""))
    return A.Workload(concurrency, lengths[0], lengths[1]), source


def run(args) -> int:
    try:
        settings = parse_settings(args.stack, load_stack_config(args.project_dir, args.stack))
        workload, workload_from = _workload(args, settings)
        source = "host block"
        notes: list[str] = []
        if args.facts:
            settings, notes = A.host_from_facts(settings, _facts(args.project_dir, args.stack))
            source = "host facts in the stack's state"
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    layouts = _stack_layouts(args.project_dir, settings)
    results = args.results if args.results.is_absolute() else args.project_dir / args.results
    stack_layouts = {k: v for k, v in layouts.items() if not isinstance(v, str)}
    judge, fitness_notes = _fitness_now(args, results, list(stack_layouts))
    measured, skipped = read_results(results, stack_layouts, judge)
    skipped += fitness_notes
    advice = A.advise(settings, workload, stacks=layouts, measured=measured, source=source)
    advice.notes[:0] = notes + skipped
    advice.workload_from = workload_from
    try:
        check_stack(args.stack, from_files(args.project_dir, args.stack), args.project_dir)
    except ConfigError as exc:
        advice.stack_refused = list(exc.errors)
    advice.ledger = _ledger(args.project_dir, [o.name for o in advice.own])
    if args.json:
        json.dump(report.as_dict(advice), sys.stdout, indent=2)
        print()
    else:
        print(report.render(advice, args.top), end="")
    return 1 if advice.stack_refused else 0
