"""What a Prometheus scrapes, the ecosystem's way: one scrape configuration with file-based service
discovery, and one target file per stack (Prometheus re-reads them when they change: `watch`
rewrites them each tick). Pure: settings and addresses in, file texts out.

A stack's file lists its serving hosts (SGLang's /metrics on the serving port; a multi-node
layout's rank 0 only, the node with the HTTP server) and its router (smg's metrics port). Target
labels are the host's (`host`, as `status` and the watch's own metrics name it; `entry`, the
fleet entry), never the stack's: the same server listed by several stacks is one target with one
label set, which Prometheus scrapes once (its scrape pool keys targets by their labels). Which
stack serves a host is the watch's `gpu_serving_serving{stack,host}`, read from its textfile
through node_exporter's textfile collector (a job of its own).

Who writes the target files: `metrics --scrape-config`, each watch tick (into its state
directory), and `pulumi up` of a stack (its own file, in `gpu-serving:metrics.targetsDir`, when
that directory exists: core/metrics_settings.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional

import yaml

from .router import url_host

if TYPE_CHECKING:
    from .config import RouterSettings, StackSettings

CONFIG_FILE = "prometheus.yml"
TARGETS_DIR = "targets"
JOB = "gpu-serving"
WATCH_JOB = "gpu-serving-watch"
# node_exporter's default port; its --collector.textfile.directory is the watch's state directory.
WATCH_EXPORTER = "localhost:9100"
# SGLang's gauges move with every request; 15 s is Prometheus' usual interval and what the
# dashboard's rate() windows (1m) assume.
SCRAPE_INTERVAL = "15s"
# How often Prometheus looks at the target files besides inotify (a file system without it).
REFRESH_INTERVAL = "30s"
SERVER, ROUTER, WATCH = "server", "router", "watch"
@dataclass(frozen=True)
class Target:
    address: str      # where Prometheus connects (IP or name)
    port: int
    role: str         # server | router
    host: str         # the host as `status` and the watch name it (settings.host.target)
    entry: str = ""   # the fleet entry, "" for the one-host form

    @property
    def endpoint(self) -> str:
        return f"{url_host(self.address)}:{self.port}"


def stack_targets(per_host: Iterable[tuple[str, StackSettings]], addresses: dict[str, str], router: Optional[RouterSettings] = None,
                  router_address: Optional[str] = None) -> tuple[list[Target], list[str]]:
    """The targets of one stack. `per_host`: StackSettings.per_host(); `addresses`: running
    rehearsal hosts' addresses by name; `router`: RouterSettings or None, reached at
    `router_address`. Returns the targets and a note per host left out (and why)."""
    targets: list[Target] = []
    notes: list[str] = []
    for entry, s in per_host:
        node = getattr(s, "node", None)
        if node is not None and node.rank != 0:
            continue  # only rank 0 serves HTTP
        h = s.host
        address = h.address or addresses.get(h.rehearsal or "")
        if not address:
            notes.append(f"{h.target}: the rehearsal host {h.rehearsal!r} is not running (no address yet); "
                         "the next write lists it once it is booted")
            continue
        targets.append(Target(address, s.serving.port, SERVER, h.target, entry))
    if router is not None:
        if router_address:
            targets.append(Target(router_address, router.metrics_port, ROUTER, "router", router.runs_on or ""))
        else:
            notes.append("the router's machine has no address yet (a rehearsal host not running): not listed")
    return targets, notes


def router_address(settings: StackSettings, addresses: dict[str, str]) -> Optional[str]:
    """Where the stack's router runs: its fleet entry's machine, or a machine of its own."""
    r = settings.router
    if r is None:
        return None
    h = next((h for h in settings.hosts if h.name == r.runs_on), None) if r.runs_on is not None else r.host
    return None if h is None else (h.address or addresses.get(h.rehearsal or ""))


def targets_of(settings: StackSettings, addresses: dict[str, str]) -> tuple[list[Target], list[str]]:
    """`stack_targets` for a stack's settings (StackSettings)."""
    return stack_targets(settings.per_host(addresses), addresses, settings.router, router_address(settings, addresses))


def render_targets(targets: list[Target]) -> str:
    """A file_sd target file: one group per target (its labels are the target's own)."""
    groups = []
    for t in targets:
        labels = {"role": t.role, "host": t.host}
        if t.entry:
            labels["entry"] = t.entry
        groups.append({"targets": [t.endpoint], "labels": labels})
    return json.dumps(groups, indent=2, sort_keys=True) + "\n"


def render_config(targets_dir: str, *, watch_exporter: Optional[str] = WATCH_EXPORTER,
                  scrape_interval: str = SCRAPE_INTERVAL) -> str:
    """prometheus.yml: the servers and routers from every target file in `targets_dir`
    (absolute), and the watch's textfile through node_exporter at `watch_exporter` (None: left out)."""
    jobs: list[dict[str, Any]] = [{
        "job_name": JOB,
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [f"{targets_dir.rstrip('/')}/*.json"], "refresh_interval": REFRESH_INTERVAL}],
    }]
    if watch_exporter:
        jobs.append({"job_name": WATCH_JOB, "static_configs": [{"targets": [watch_exporter], "labels": {"role": WATCH}}]})
    doc = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval}, "scrape_configs": jobs}
    head = ("# Written by `python -m components metrics --scrape-config` (gpu-serving). The target files are\n"
            "# rewritten by `python -m components watch` each tick; this file only when the command runs again.\n")
    return head + yaml.safe_dump(doc, sort_keys=False)
