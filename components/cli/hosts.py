"""``python -m components rehearsal-hosts --stack NAME`` and ``real-hosts --stack NAME``: the machines
a stack deploys to, one per line (scripts/deploy boots the rehearsal ones and asks before it changes
the real ones). Exit 0; 2 on a bad setting."""
from __future__ import annotations

import sys
from pathlib import Path

from ..core.config import parse_settings
from ..core.errors import ConfigError
from ..core.plan import load_stack_config
from ..core.targets import real_machines


def add_parser(sub) -> None:
    r = sub.add_parser("rehearsal-hosts", help="the rehearsal hosts a stack deploys to, one per line")
    r.add_argument("--stack", required=True)
    r.add_argument("--project-dir", default=".", type=Path)
    rh = sub.add_parser("real-hosts", help="the machines a stack deploys to that are not rehearsal hosts, one per line "
                                           "(scripts/deploy asks before it changes them)")
    rh.add_argument("--stack", required=True)
    rh.add_argument("--project-dir", default=".", type=Path)


def run(args) -> int:
    try:
        settings = parse_settings(args.stack, load_stack_config(args.project_dir, args.stack))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "real-hosts":
        for machine in real_machines(settings):
            print(machine)
        return 0
    for _, s in settings.per_host():
        if s.host.is_rehearsal:
            print(s.host.rehearsal)
    return 0
