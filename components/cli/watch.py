"""``python -m components watch --stacks tp8,pp8,ep8 --every 10m [--once] [--apply] [--state-dir DIR] [--webhook URL]``:
the drift watch, one tick (components/watch.py `tick`) every --every, or once under a systemd
timer; with --apply, a recommended switch the autoswitch allows is performed (`pulumi up` of the
recommended stack: docs/traffic.md); with --systemd-units, the service and timer that run it
(components/core/watch.py renders them). Exit 0; 2 on a bad flag or stack name.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..core import watch as W
from ..core.errors import ConfigError, SettingError
from ..core.stack_config import stack_names
from ..watch import tick

DEFAULT_STATE_DIR = "~/.local/state/gpu-serving-watch"


def add_parser(sub) -> None:
    w = sub.add_parser("watch", help="the drift watch: every --every, `pulumi preview --refresh` of each stack and the status "
                                     "read; status.json and a Prometheus file in --state-dir, a line per change, a webhook")
    w.add_argument("--stacks", required=True, help="comma-separated strategy stacks, e.g. tp8,pp8,ep8")
    w.add_argument("--every", default="10m", help="interval between ticks: 30s, 10m, 1h (default 10m)")
    w.add_argument("--once", action="store_true", help="one tick, then exit (for a systemd timer)")
    w.add_argument("--apply", action="store_true",
                   help="perform a recommended switch when gpu-serving:autoswitch allows it (inside a window, behind the "
                        "router, nothing open): `pulumi up` of the recommended stack. Off: the watch only recommends")
    w.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"where status.json and gpu-serving.prom go "
                                                                  f"(default {DEFAULT_STATE_DIR})")
    w.add_argument("--webhook", default=os.environ.get("GPU_SERVING_WATCH_WEBHOOK"),
                   help="POST the changes (JSON) to this URL when something changed (default: $GPU_SERVING_WATCH_WEBHOOK)")
    w.add_argument("--project-dir", default=".", type=Path)
    w.add_argument("--systemd-units", metavar="DIR", type=Path,
                   help="write gpu-serving-watch.service and .timer for these options into DIR and exit (no tick)")
    w.add_argument("--env-file", default="~/.config/gpu-serving/watch.env",
                   help="with --systemd-units: the operator's environment file the service reads")


def run(args) -> int:
    try:
        stacks = W.parse_stacks(args.stacks, stack_names(args.project_dir))
        every = W.parse_every(args.every)
        if args.webhook and not args.webhook.startswith(("http://", "https://")):
            raise ConfigError([SettingError("--webhook", f"{args.webhook!r} is not an http(s) URL",
                                              "--webhook https://alerts.example/gpu-serving")])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir).expanduser()
    if args.systemd_units:
        files = W.render_systemd(checkout=str(Path(args.project_dir).resolve()), stacks=stacks, every_seconds=every,
                                 state_dir=str(state_dir), env_file=str(Path(args.env_file).expanduser()),
                                 webhook=args.webhook, apply=args.apply)
        args.systemd_units.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (args.systemd_units / name).write_text(text)
            print(f"wrote {args.systemd_units / name}")
        return 0
    while True:
        started = time.monotonic()
        tick(Path(args.project_dir), stacks, state_dir, args.webhook, log=lambda line: print(line, flush=True),
             apply=args.apply)
        if args.once:
            return 0
        time.sleep(max(0.0, every - (time.monotonic() - started)))
