"""The watch's traffic step (one call from components/watch.py per tick): for each watched stack
that serves, its hosts' SGLang /metrics and its router's metrics, read over SSH from the host's
side (the same fixed HTTP script as the roll's drain), kept as a window in status.json
("traffic"); each host's recorded starts (the store issue 40's switch records, when there is
one), for the switch's forecast; the recommendation (components/core/recommend_stacks.py `build`,
the one `recommend` prints); the Prometheus target files rewritten (components/scrape_targets.py).
The words and figures are components/core/traffic_status.py's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .core import autoswitch, recommend_stacks
from .core import start_phases
from .core import router as R
from .core import scrape
from .core import server_metrics as M
from .core import traffic_status as T
from .core.config import AUTOSWITCH_KEY
from .core.errors import ConfigError
from .core.plan import check_stack
from .core.rules import NAMESPACE
from .core.stack_config import from_files
from .scrape_targets import rewrite_targets

TIMEOUT = 20
# Where a host keeps the phases of its recent starts (JSON lines, core/start_phases.py), written by
# the switch that made them; read here for the switch's forecast. Absent: the configured figure.
STARTS_FILE = "/var/lib/gpu-serving/starts.jsonl"
STARTS_LINES = 400  # the newest lines are enough: a forecast reads the last 3 starts of a layout


@dataclass
class TrafficTick:
    doc: dict = field(default_factory=dict)          # status.json's "traffic"
    changes: list = field(default_factory=list)      # the watch's change entries
    prometheus: str = ""
    recommendations: dict = field(default_factory=dict)   # stack -> recommend.Recommendation


def _get(t, url: str) -> tuple[int, str]:
    from .remote import ssh
    res = ssh.run(t, ["python3", "-c", R.HTTP_SCRIPT, "GET", url], input=b"\n", purpose=f"reading {url}",
                  timeout=TIMEOUT, check=False, read=True)
    return R.parse_http(res.stdout) if res.rc == 0 else (0, res.stderr[-200:] if res.stderr else "no answer")


def _attn_tp(settings) -> int:
    s = settings.strategy
    return max(1, s.tp_size // s.dp_size) if s.enable_dp_attention and s.dp_size > 1 else s.tp_size


def _starts(t) -> list:
    """The host's recorded starts; none when it keeps none (or they cannot be read: a forecast is
    an improvement on the configured figure, never a reason to fail a tick)."""
    from .remote import ssh
    res = ssh.run(t, ["tail", "-n", str(STARTS_LINES), STARTS_FILE], purpose="reading the recorded starts",
                  timeout=TIMEOUT, check=False, read=True)
    return start_phases.parse_records(res.stdout) if res.rc == 0 else []


def read_group(project_dir: Path, stack: str, hosts: list[str]) -> tuple[dict, dict, Optional[dict], dict]:
    """The serving hosts' samples (host -> ServerSample), the errors (host -> why), the
    router's sample as a dict (None without a router), and each host's recorded starts."""
    from .remote import ssh
    from .remote.status import StatusError, connection
    checked = check_stack(stack, from_files(project_dir, stack), project_dir)
    samples, errors, router, starts = {}, {}, None, {}
    per_host = {s.host.target: s for _, s in checked.settings.per_host()}
    for host in hosts:
        s = per_host.get(host)
        if s is None:
            continue
        try:
            t = ssh.Target.from_props({"connection": connection(s, stack, project_dir, checked)})
            status, body = _get(t, R.local_url(s.serving.host, s.serving.port) + "/metrics")
            if status != 200:
                raise ValueError(f"/metrics answered {status or 'nothing'}"
                                 + (" (serving.enableMetrics false?)" if status == 404 else ""))
            samples[host] = M.server_sample(body, time.time(), _attn_tp(s))
            starts[host] = _starts(t)
        except (StatusError, OSError, ValueError, ssh.RemoteError) as exc:
            errors[host] = str(exc)[:300]
    r = checked.settings.router
    if r is not None:
        # The router on a fleet entry's machine; one on a machine of its own is not read here (yet).
        machine = next((s for entry, s in checked.settings.per_host() if r.runs_on and entry == r.runs_on), None)
        if machine is not None:
            try:
                t = ssh.Target.from_props({"connection": connection(machine, stack, project_dir, checked)})
                status, body = _get(t, R.local_url(r.bind, r.metrics_port) + "/metrics")
                if status == 200:
                    router = M.router_sample(body, time.time()).as_dict()
                else:
                    router = {"error": f"the router's metrics answered {status or 'nothing'}"}
            except (StatusError, OSError, ValueError, ssh.RemoteError) as exc:
                router = {"error": str(exc)[:300]}
    return samples, errors, router, starts


def tick(project_dir: Path, stacks: list[str], doc: dict, before: Optional[dict], state_dir: Path,
         log: Callable[[str], None] = print) -> TrafficTick:
    """The traffic step of one watch tick; `doc`: the tick's document (which stack serves where)."""
    out = TrafficTick()
    rewrite_targets(project_dir, stacks, state_dir / "prometheus" / scrape.TARGETS_DIR, log)
    previous = {g["stack"]: g for g in ((before or {}).get("traffic") or {}).get("groups", [])}
    groups = []
    for s in doc.get("stacks", []):
        hosts = [h["host"] for h in s["hosts"] if h.get("serving_here") and not h.get("error")]
        if not hosts:
            continue
        stack = s["stack"]
        try:
            auto = autoswitch.parse(from_files(project_dir, stack).values.get(f"{NAMESPACE}:{AUTOSWITCH_KEY}"))
            samples, errors, router, starts = read_group(project_dir, stack, hosts)
        except (ConfigError, ValueError) as exc:
            log(f"watch: traffic of stack {stack} not read: {exc}")
            continue
        prev = previous.get(stack)
        group = T.group_doc(prev, stack, hosts, samples, auto.observe_minutes * 60, errors, router)
        if prev is None and any(set(g["hosts"]) & set(hosts) for g in previous.values()):
            # Another stack served these hosts at the last tick: the switch is the dwell's start.
            group["serving_since"] = doc.get("checked_at_seconds")
        try:
            rec = recommend_stacks.build(project_dir, stack, group["summary"]["concurrency"], results=Path("results/bench"),
                                         now=doc.get("checked_at_seconds") or time.time(),
                                         last_switch_at=group["serving_since"], starts=starts)
            group["recommendation"] = rec.as_dict() | {"line": rec.line()}
            out.recommendations[stack] = rec
        except ConfigError as exc:
            group["recommendation"] = None
            log(f"watch: no recommendation for stack {stack}: {exc}")
        for host, why in errors.items():
            log(f"watch: traffic: {host} /metrics not read: {why}")
        groups.append(group)
    out.doc = {"groups": groups}
    out.changes = T.changes((before or {}).get("traffic"), out.doc)
    out.prometheus = T.render_prometheus(out.doc)
    return out


def after_switch(project_dir: Path, stack: str, hosts: list[str], traffic: dict, at: float,
                 log: Callable[[str], None] = print) -> None:
    """The first samples of the stack a switch just started, kept in `traffic` (status.json's)
    as its group, so the next tick already observes it (and measures the switch) rather than
    only sampling it: its servers' counters began with their start."""
    try:
        auto = autoswitch.parse(from_files(project_dir, stack).values.get(f"{NAMESPACE}:{AUTOSWITCH_KEY}"))
        samples, errors, router, _ = read_group(project_dir, stack, hosts)
    except (ConfigError, ValueError) as exc:
        log(f"watch: traffic of stack {stack} not read after the switch: {exc}")
        return
    group = T.group_doc(None, stack, hosts, samples, auto.observe_minutes * 60, errors, router)
    group["serving_since"] = at
    traffic["groups"] = [g for g in traffic.get("groups", []) if g["stack"] != stack] + [group]
