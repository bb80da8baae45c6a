"""The watch's traffic section, pure: per serving group (a stack and the hosts it serves on) the
latest samples, the window of observations, its summary and the recommendation; what changed
since the previous tick; the Prometheus lines. status.json keeps it under "traffic", so `--once`
under a systemd timer carries the window from run to run.
"""
from __future__ import annotations

from typing import Any, Optional

from .server_metrics import ServerSample
from .workload import Observation, keep, observe, summarize


def group_doc(previous: Optional[dict[str, Any]], stack: str, hosts: list[str], samples: dict[str, ServerSample],
              window_seconds: float, errors: Optional[dict[str, str]] = None, router: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """This tick's section for the group serving `stack` on `hosts`, from its `samples` (host ->
    sample) and the previous tick's section (None: the first). A host that could not be read keeps
    no sample (its error is shown); the window goes on with the others."""
    previous = previous or {}
    before = {h: ServerSample.from_dict(d) for h, d in (previous.get("samples") or {}).items()}
    window = [Observation.from_dict(o) for o in previous.get("window") or []]
    if samples:
        window = keep(window, observe(before, samples), window_seconds)
    summary = summarize(window)
    return {"stack": stack, "hosts": hosts, "samples": {h: s.as_dict() for h, s in samples.items()},
            "errors": dict(errors or {}), "router": router, "window": [o.as_dict() for o in window],
            "summary": summary.as_dict(), "workload": summary.describe(),
            "serving_since": previous.get("serving_since") if previous.get("stack") == stack else None}


def changes(before: Optional[dict[str, Any]], now: dict[str, Any]) -> list[dict[str, Any]]:
    """A change entry (the watch's shape) when a group's recommendation changed."""
    out = []
    old = {g["stack"]: g for g in (before or {}).get("groups", [])}
    for g in now.get("groups", []):
        rec = g.get("recommendation") or {}
        was = (old.get(g["stack"]) or {}).get("recommendation") or {}
        if rec and (rec.get("action"), rec.get("recommended")) != (was.get("action"), was.get("recommended")):
            line = (f"recommended: {rec['recommended']} instead of {g['stack']}: {rec['reason']}" if rec["action"] == "switch"
                    else f"recommended: stay on {g['stack']}: {rec['reason']}")
            out.append({"kind": "recommended", "stack": g["stack"], "host": ",".join(g["hosts"]), "line": line})
    return out


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(traffic: dict[str, Any]) -> str:
    """The recommendation and the observed load, beside the watch's own metrics."""
    lines = ["# HELP gpu_serving_recommended_strategy 1 for the stack recommended on the host "
             "(serving: the stack serving there now)",
             "# TYPE gpu_serving_recommended_strategy gauge"]
    load = ["# HELP gpu_serving_observed_concurrency Requests in flight on the stack's hosts (median over the window)",
            "# TYPE gpu_serving_observed_concurrency gauge"]
    for g in traffic.get("groups", []):
        rec = g.get("recommendation")
        if rec:
            for host in g["hosts"]:
                lines.append(f'gpu_serving_recommended_strategy{{stack="{_label(rec["recommended"])}",host="{_label(host)}",'
                             f'serving="{_label(g["stack"])}"}} 1')
        c = (g.get("summary") or {}).get("concurrency")
        if c is not None:
            load.append(f'gpu_serving_observed_concurrency{{stack="{_label(g["stack"])}"}} {c:.3f}')
    return "\n".join(lines + load) + "\n"
