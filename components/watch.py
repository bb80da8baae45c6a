"""``python -m components watch --stacks tp8,pp8,ep8 --every 10m [--once] [--state-dir DIR] [--webhook URL]``:
the drift watch. Each tick, per stack, `pulumi preview --refresh` through the Automation API (reads
only: a preview never runs a provider's create, update or delete, and takes no stack lock), and the
`status` read of what serves on each host; then writes status.json and
gpu-serving.prom (atomically) in the state directory, logs one line per change since the previous
tick (kept in status.json, so `--once` under a systemd timer diffs across runs) and POSTs the
changes to --webhook. The words and files come from components/core/watch.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .core import watch as W
from .files import atomic_write
from .core.errors import ConfigError, SettingError
from .core.plan import check_stack
from .core.stack_config import from_files, stack_names

STATUS_FILE = "status.json"
METRICS_FILE = "gpu-serving.prom"
DEFAULT_STATE_DIR = "~/.local/state/gpu-serving-watch"
ERROR_CHARS = 600


def add_parser(sub) -> None:
    w = sub.add_parser("watch", help="the drift watch: every --every, `pulumi preview --refresh` of each stack and the status "
                                     "read; status.json and a Prometheus file in --state-dir, a line per change, a webhook")
    w.add_argument("--stacks", required=True, help="comma-separated strategy stacks, e.g. tp8,pp8,ep8")
    w.add_argument("--every", default="10m", help="interval between ticks: 30s, 10m, 1h (default 10m)")
    w.add_argument("--once", action="store_true", help="one tick, then exit (for a systemd timer)")
    w.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"where status.json and gpu-serving.prom go "
                                                                  f"(default {DEFAULT_STATE_DIR})")
    w.add_argument("--webhook", default=os.environ.get("GPU_SERVING_WATCH_WEBHOOK"),
                   help="POST the changes (JSON) to this URL when something changed (default: $GPU_SERVING_WATCH_WEBHOOK)")
    w.add_argument("--project-dir", default=".", type=Path)
    w.add_argument("--systemd-units", metavar="DIR", type=Path,
                   help="write gpu-serving-watch.service and .timer for these options into DIR and exit (no tick)")
    w.add_argument("--env-file", default="~/.config/gpu-serving/watch.env",
                   help="with --systemd-units: the operator's environment file the service reads")


def _pulumi_command():
    from pulumi import automation as auto
    root = os.environ.get("GPU_SERVING_PULUMI_ROOT")
    return auto.PulumiCommand(root=root, skip_version_check=True) if root else None


def _short_error(text: str) -> str:
    """The engine's failure in a few lines: its `error:` lines, else the end of its output."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    picked = [ln for ln in lines if "error:" in ln.lower() and "stderr:" not in ln.lower()]
    out = " | ".join(dict.fromkeys(picked or lines[-3:]))
    return out if len(out) <= ERROR_CHARS else out[: ERROR_CHARS - 3] + "..."


def _inputs(state) -> Optional[dict]:
    return dict(state.inputs or {}) if state is not None else None


def preview_stack(project_dir: Path, stack: str) -> dict:
    """One stack's refresh-in-preview: {stack, hosts, steps, error}."""
    out: dict = {"stack": stack, "hosts": [], "steps": [], "error": None, "deployed": True}
    try:
        checked = check_stack(stack, from_files(project_dir, stack), project_dir)
    except ConfigError as exc:
        out["error"] = str(exc)
        return out
    out["hosts"] = [[entry, settings.host.target] for (entry, _), (_, settings) in zip(checked.plans, checked.settings.per_host())]
    # Here, not at the top: every other command of `python -m components` loads this module.
    from pulumi import automation as auto
    events: list = []
    try:
        opts = auto.LocalWorkspaceOptions(work_dir=str(project_dir), env_vars=dict(os.environ),
                                          pulumi_command=_pulumi_command())
        s = auto.select_stack(stack_name=stack, work_dir=str(project_dir), opts=opts)
        s.preview(refresh=True, diff=True, color="never", on_event=events.append)
    except auto.CommandError as exc:
        out["error"] = _short_error(getattr(exc, "stderr", "") or str(exc)) or "pulumi preview --refresh failed"
    except Exception as exc:  # noqa: BLE001 - a tick never dies of one stack
        out["error"] = f"{type(exc).__name__}: {_short_error(str(exc))}"
    ops = []
    for e in events:
        pre = e.resource_pre_event
        if pre is None or pre.metadata is None:
            continue
        m = pre.metadata
        op = getattr(m.op, "value", str(m.op))
        ops.append(op)
        if op in W.DRIFT_OPS:
            out["steps"].append({"name": m.urn.rpartition("::")[2], "type": m.type, "op": op,
                                 "old": _inputs(m.old), "new": _inputs(m.new)})
    # Only creates: the stack's state holds nothing (never deployed, or destroyed).
    out["deployed"] = bool(out["error"]) or any(op != "create" for op in ops)
    return out


def post_webhook(url: str, payload: dict) -> Optional[str]:
    """None when delivered; else why not (logged: the next change posts again)."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpu-serving-watch"})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def tick(project_dir: Path, stacks: list[str], state_dir: Path, webhook: Optional[str], log=print) -> dict:
    """One tick: read, write the files, log and post the changes. Returns the tick's document."""
    status_path = state_dir / STATUS_FILE
    try:
        before = json.loads(status_path.read_text())
    except (OSError, ValueError):
        before = None
    from .remote.status import project_status
    results = [preview_stack(project_dir, s) for s in stacks]
    try:
        status = project_status(project_dir, stacks=[r["stack"] for r in results if r["hosts"]])
    except Exception as exc:  # noqa: BLE001 - reported per host, retried next tick
        error = f"status read failed: {type(exc).__name__}: {_short_error(str(exc))}"
        status = {"hosts": [{"host": t, "error": error, "stacks": []} for r in results for _, t in r["hosts"]]}
    now = time.time()
    doc = W.tick_document(results, status, checked_at=datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
                          checked_at_seconds=now, errors_before=int((before or {}).get("check_errors_total", 0)))
    # The traffic (issue 42): the servers' load, its window, the recommendation, the target files.
    from .traffic_watch import tick as traffic_tick
    traffic = traffic_tick(project_dir, stacks, doc, before, state_dir, log)
    doc["traffic"] = traffic.doc
    found = W.changes(before, doc) + traffic.changes
    atomic_write(status_path, json.dumps(doc, indent=2) + "\n")
    atomic_write(state_dir / METRICS_FILE, W.render_prometheus(doc) + traffic.prometheus)
    for c in found:
        log(f"watch: {c['line']}")
    if found and webhook:
        problem = post_webhook(webhook, W.webhook_payload(doc, found))
        if problem:
            log(f"watch: webhook not delivered: {problem}")
    return doc


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
                                 webhook=args.webhook)
        args.systemd_units.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (args.systemd_units / name).write_text(text)
            print(f"wrote {args.systemd_units / name}")
        return 0
    while True:
        started = time.monotonic()
        tick(Path(args.project_dir), stacks, state_dir, args.webhook, log=lambda line: print(line, flush=True))
        if args.once:
            return 0
        time.sleep(max(0.0, every - (time.monotonic() - started)))
