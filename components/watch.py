"""The drift watch's tick (`python -m components watch`, components/cli/watch.py, runs it once or
every --every). Each tick, per stack, `pulumi preview --refresh` through the Automation API (reads
only: a preview never runs a provider's create, update or delete, and takes no stack lock), and the
`status` read of what serves on each host; the traffic and its recommendation
(components/traffic_watch.py); the autoswitch's decision, and with --apply the recommended switch
itself, a `pulumi up` through the Automation API (components/autoswitch_apply.py); then writes
status.json and gpu-serving.prom (atomically) in the state directory, logs one line per change
since the previous tick (kept in status.json, so `--once` under a systemd timer diffs across runs)
and POSTs the changes to --webhook. The words and files come from components/core/watch.py.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .autoswitch_apply import step as autoswitch_step
from .core import watch as W
from .files import atomic_write
from .core.errors import ConfigError
from .core.plan import check_stack
from .core.stack_config import from_files

STATUS_FILE = "status.json"
METRICS_FILE = "gpu-serving.prom"
ERROR_CHARS = 600


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
    # Here, not at the top: every command of `python -m components` loads this module
    # (components/cli/watch.py), and only a tick needs the engine.
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
            # The host facts' fitness drift is an output of the refresh, not an input.
            fitness = (dict(m.old.outputs or {}) if m.old is not None else {}).get("fitnessDrift")
            out["steps"].append({"name": m.urn.rpartition("::")[2], "type": m.type, "op": op,
                                 "old": _inputs(m.old), "new": _inputs(m.new), **({"fitness": fitness} if fitness else {})})
    # Only creates: the stack's state holds nothing (never deployed, or destroyed).
    out["deployed"] = bool(out["error"]) or any(op != "create" for op in ops)
    return out


def up_stack(project_dir: Path, stack: str, log=print) -> Optional[str]:
    """`pulumi up` of one stack through the Automation API, its output in the watch's log (the
    autoswitch's switch: behind the router it rolls, the program's own checks and readiness
    deciding as in any `up`). None when it succeeded, else the engine's failure in a few lines."""
    from pulumi import automation as auto

    def line(text: str) -> None:
        if text.strip():
            log(f"watch: autoswitch: up {stack}: {text.rstrip()}")
    try:
        opts = auto.LocalWorkspaceOptions(work_dir=str(project_dir), env_vars=dict(os.environ),
                                          pulumi_command=_pulumi_command())
        auto.select_stack(stack_name=stack, work_dir=str(project_dir), opts=opts).up(on_output=line, color="never")
    except auto.CommandError as exc:
        return _short_error(getattr(exc, "stderr", "") or str(exc)) or "pulumi up failed"
    except Exception as exc:  # noqa: BLE001 - the watch records the failure and goes on ticking
        return f"{type(exc).__name__}: {_short_error(str(exc))}"
    return None


def post_webhook(url: str, payload: dict) -> Optional[str]:
    """None when delivered; else why not (logged: the next change posts again)."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpu-serving-watch"})
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def tick(project_dir: Path, stacks: list[str], state_dir: Path, webhook: Optional[str], log=print, *,
         apply: bool = False) -> dict:
    """One tick: read, write the files, log and post the changes. Returns the tick's document.
    `apply`: perform a recommended switch the autoswitch's checks allow (`watch --apply`)."""
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
    from . import traffic_watch
    traffic = traffic_watch.tick(project_dir, stacks, doc, before, state_dir, log)
    doc["traffic"] = traffic.doc
    switching = autoswitch_step(project_dir, doc, traffic, before, state_dir, apply=apply, up=up_stack, log=log)
    doc["autoswitch"] = switching.section
    if switching.switched:
        target, hosts, at = switching.switched
        traffic_watch.after_switch(project_dir, target, hosts, traffic.doc, at, log)
    found = W.changes(before, doc) + traffic.changes
    atomic_write(status_path, json.dumps(doc, indent=2) + "\n")
    atomic_write(state_dir / METRICS_FILE, W.render_prometheus(doc) + traffic.prometheus + switching.prometheus)
    for c in found:
        log(f"watch: {c['line']}")
    found += [{k: v for k, v in c.items() if k != "logged"} for c in switching.changes]  # said as they happened
    if found and webhook:
        problem = post_webhook(webhook, W.webhook_payload(doc, found))
        if problem:
            log(f"watch: webhook not delivered: {problem}")
    return doc
