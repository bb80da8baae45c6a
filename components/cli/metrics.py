"""``python -m components metrics --scrape-config [--stacks tp8,pp8] [--out DIR]``: a Prometheus scrape
configuration (file-based service discovery) and one target file per stack, for every serving
host, the router and the watch's own textfile (components/core/scrape.py renders them; the
target files are written by components/scrape_targets.py, which `watch` calls each tick too).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..core import scrape
from ..core.errors import ConfigError
from ..core.plan import check_stack
from ..core.stack_config import from_files, stack_names
from ..core.watch import parse_stacks
from ..files import atomic_write
from ..scrape_targets import rewrite_targets

DEFAULT_OUT = "~/.local/state/gpu-serving-watch/prometheus"


def add_parser(sub) -> None:
    m = sub.add_parser("metrics", help="Prometheus: write a scrape configuration and a target file per stack",
                       description="Write DIR/prometheus.yml (file-based service discovery over DIR/targets/*.json) and "
                                   "DIR/targets/<stack>.json for each stack: its serving hosts' SGLang /metrics, its "
                                   "router's metrics port, and a job for the watch's textfile through node_exporter. "
                                   "`watch --state-dir S` rewrites S/prometheus/targets/ every tick. Exit 0; 2 on a bad "
                                   "setting or flag.")
    m.add_argument("--scrape-config", action="store_true", required=True,
                   help="write the scrape configuration and the target files")
    m.add_argument("--stacks", help="comma-separated stacks (default: every stack of the project)")
    m.add_argument("--out", default=DEFAULT_OUT, help=f"directory for prometheus.yml and targets/ (default {DEFAULT_OUT}, "
                                                      "where `watch` with its default --state-dir rewrites the targets)")
    m.add_argument("--watch-exporter", default=scrape.WATCH_EXPORTER, metavar="HOST:PORT",
                   help="node_exporter serving the watch's textfile (--collector.textfile.directory=the watch's "
                        f"--state-dir); 'none' leaves that job out (default {scrape.WATCH_EXPORTER})")
    m.add_argument("--project-dir", default=".", type=Path)


def run(args) -> int:
    try:
        known = stack_names(args.project_dir)
        if args.stacks:
            stacks = parse_stacks(args.stacks, known)
        else:
            stacks = known
        for stack in stacks:  # every stack readable before anything is written
            check_stack(stack, from_files(args.project_dir, stack), args.project_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser().resolve()
    targets_dir = out / scrape.TARGETS_DIR
    exporter = None if args.watch_exporter in ("none", "") else args.watch_exporter
    atomic_write(out / scrape.CONFIG_FILE, scrape.render_config(str(targets_dir), watch_exporter=exporter))
    print(f"wrote {out / scrape.CONFIG_FILE}")
    targets_dir.mkdir(parents=True, exist_ok=True)
    for path in rewrite_targets(args.project_dir, stacks, targets_dir):
        print(f"wrote {path}")
    print(f"check it: promtool check config {out / scrape.CONFIG_FILE}; run it: prometheus --config.file="
          f"{out / scrape.CONFIG_FILE}")
    return 0
