"""``python -m components status [--stack NAME] [--json]``: what serves on the hosts now, read over
SSH by components/remote/status.py (`project_status`) and said in components/core/status.py's words.
The exit status is core/status_verdict.py's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..core.errors import ConfigError
from ..core.status import render_status


def add_parser(sub) -> None:
    st = sub.add_parser("status", help="what serves on the hosts now, read over SSH: unit, stack, layout, uptime, "
                                       "readiness, and whether each stack's files drifted (exit 0 serving, ready, as declared; 1 drift; "
                                       "2 not read; 3 nothing serves; 4 not ready)")
    st.add_argument("--stack", help="only this stack's hosts and files (default: every stack of the project)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--project-dir", default=".", type=Path)


def run(args) -> int:
    """The exit status says what a probe asks (core/status_verdict.py): 0 every host read serves,
    ready and as declared; 1 the serving stack drifted; 2 bad settings, or a host not read; 3
    nothing serves on a host; 4 a host serves but is not ready (or not in its router)."""
    # Here, not at the top: `plan` and `switch` never connect, and need not load the SSH side.
    from ..remote.status import project_status
    try:
        doc = project_status(args.project_dir, args.stack)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(render_status(doc))
    return doc["exit"]
