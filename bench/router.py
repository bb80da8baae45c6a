"""The benchmark "fleet switch with router" (`bench/run --scenarios router`, docs/benchmarks.md):
the same strategy switch (tp8 -> ep8) on the same N rehearsal hosts, made twice under the same
load, and what each costs the clients:

- rolling: a fleet stack with gpu-serving:router (SGLang's smg, on the first host) and
  rollout.maxUnavailable 1: each host leaves the router, drains, switches and comes back;
- all at once: a fleet stack without gpu-serving:router (today's behaviour for a fleet without a
  router): every host stops at once. The router the first stack installed keeps running and
  routing to every host, so the load reaches the fleet the same way in both.

Load: CLIENTS clients, each sending one completion after the other to the router's address on the
first rehearsal host (never elsewhere), from just before the `pulumi up` until it returns, at most
MAX_REQUESTS in all; a sampler reads the router's worker list (how many hosts it routes to). The
rehearsal engine takes LOAD_SECONDS to load in both stacks. Figures per run: the up's wall time,
requests served during it, requests failed, fewest hosts the router routed to. The summaries and
the table are bench/stats.py's (pure, tested with data)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import yaml

from . import hosts as H
from .workspace import REPO, Project, make_project

CLIENTS = 4
MAX_REQUESTS = 20000   # the bound: the clients stop there even if the switch still runs
ROUTER_PORT = 30080
# A fixed key for hosts that live only for the run (never a real fleet's).
KEY = "bench-router-admin-key-0123456789abcdef"
FROM, TO = "tp8", "ep8"
MODEL = "kimi-k2.6"
# The rehearsal engine's model load, in seconds (the other scenarios use 0, to time the tools):
# a server that takes a while to come back, as a real one does (minutes for a 590 GB model), so
# the time without a server shows in what the clients get.
LOAD_SECONDS = 5


def link(hosts: list[H.Host]) -> None:
    """Route between the rehearsal hosts (each reaches only this machine otherwise), so the router
    on the first reaches the servers on the others: the hosts' namespaces get a route to the
    rehearsal range and their own veths forward (nothing else on this machine does). Undone when
    the hosts go down."""
    for h in hosts:
        root_side = h.info.address.rsplit(".", 1)[0] + ".1"
        subprocess.run(["ip", "-n", f"gsr-{h.name}", "route", "replace", "10.213.0.0/16", "via", root_side], check=True)
        subprocess.run(["sysctl", "-q", "-w", f"net.ipv4.conf.gsr-{h.name}.forwarding=1"], check=True)


def _open(req, timeout: float):
    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=timeout)  # never a proxy


def router_workers(url: str) -> list[dict]:
    req = urllib.request.Request(url + "/workers", headers={"Authorization": f"Bearer {KEY}"})
    with _open(req, 5) as r:
        return json.load(r)["workers"]


def routed(workers: list[dict]) -> int:
    return sum(1 for w in workers if w.get("is_healthy") and w.get("status") == "ready")


class Load:
    """CLIENTS clients through the router until stopped (or MAX_REQUESTS), and a sampler of how
    many hosts the router routes to."""

    def __init__(self, url: str):
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.served = 0
        self.failed: list[str] = []
        self.samples: list[int] = []
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self.sample, daemon=True))

    def client(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": "hello router", "max_tokens": 16}).encode()
        while not self.stop.is_set():
            with self.lock:
                if self.served + len(self.failed) >= MAX_REQUESTS:
                    return
            req = urllib.request.Request(self.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            try:
                with _open(req, 60) as r:
                    good = r.status == 200 and bool(json.load(r)["choices"][0]["text"])
                why = "" if good else f"HTTP {r.status} without a completion"
            except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
                good, why = False, f"{type(exc).__name__}: {exc}"
            with self.lock:
                if good:
                    self.served += 1
                else:
                    self.failed.append(why)
            if not good:
                time.sleep(0.05)  # a refused connection returns at once: no busy loop

    def sample(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(routed(router_workers(self.url)))
            except (urllib.error.URLError, OSError, ValueError, KeyError):
                self.samples.append(0)  # the router itself did not answer
            time.sleep(0.2)

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


class RouterScenario:
    """Both switches on `hosts` (at least 2), `repeat` times each; `run()` gives the samples
    {"hosts", "clients", "rolling": [...], "all_at_once": [...]} (stats.router_summary)."""

    def __init__(self, work: Path, hosts: list[H.Host], repeat: int, log: Callable[[str], None]):
        if len(hosts) < 2:
            raise ValueError("the router scenario needs at least 2 hosts (--fleet 1,2 or more)")
        self.work, self.hosts, self.repeat, self.log = work, hosts, repeat, log
        self.url = f"http://{hosts[0].info.address}:{ROUTER_PORT}"

    def setup(self) -> None:
        done = subprocess.run([str(REPO / "scripts" / "router-wheels")], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"scripts/router-wheels failed:\n{done.stderr[-2000:]}")
        link(self.hosts)
        names = [h.name for h in self.hosts]
        self.rolling = make_project(self.work, "", fleet=names, label="router-rolling")
        self.all_at_once = make_project(self.work, "", fleet=names, label="router-all-at-once")

        def slow_load(config: dict) -> None:
            config["gpu-serving:serving"]["value"]["environment"]["REHEARSAL_LOAD_SECONDS"] = str(LOAD_SECONDS)
        edit_project(self.all_at_once, slow_load)

        def behind_router(config: dict) -> None:
            slow_load(config)
            # round_robin: the 4 clients send the same prompt, which cache_aware would send to one host.
            config["gpu-serving:router"] = {"value": {"runsOn": names[0], "port": ROUTER_PORT, "policy": "round_robin"}}
            config["gpu-serving:rollout"] = {"value": {"maxUnavailable": 1, "drainTimeoutSeconds": 60}}
        edit_project(self.rolling, behind_router)
        for stack in (FROM, TO):
            self.rolling.pulumi("config", "set", "--secret", "--stack", stack, "gpu-serving:routerAdminKey", KEY)

    @property
    def env(self) -> dict:
        return self.rolling.env

    def up(self, project: Project, stack: str) -> None:
        r = project.pulumi("up", "--stack", stack, "--yes", check=False)
        if r.returncode != 0:
            raise SystemExit(f"router scenario: pulumi up --stack {stack} in {project.host} exited {r.returncode}:\n"
                             f"{r.stdout[-4000:]}")

    def wait_routed(self, timeout: float = 180) -> None:
        """Until the router routes to every host (after an untimed switch back)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if routed(router_workers(self.url)) == len(self.hosts):
                    return
            except (urllib.error.URLError, OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the router at {self.url} does not route to all {len(self.hosts)} hosts")
            time.sleep(0.5)

    def measure(self, project: Project, kind: str) -> dict:
        self.wait_routed()
        t0 = time.monotonic()
        with Load(self.url) as load:
            self.up(project, TO)
            seconds = time.monotonic() - t0
        unit = f"sglang-{MODEL}-{TO}.service"
        off = [h.name for h in self.hosts if h.sh(f"systemctl is-active {unit}", check=False).strip() != "active"]
        if off:
            raise SystemExit(f"after the {kind} switch {unit} does not serve on {', '.join(off)}")
        sample = {"seconds": round(seconds, 2), "served": load.served, "failed": len(load.failed),
                  "fewest_serving": min(load.samples) if load.samples else None, "samples": len(load.samples),
                  "first_failures": load.failed[:3]}
        self.log(f"router  N={len(self.hosts)} {kind:11}: {sample['seconds']:.1f} s, {sample['served']} served, "
                 f"{sample['failed']} failed, fewest hosts in the router {sample['fewest_serving']}")
        return sample

    def run(self) -> dict:
        out: dict = {"hosts": len(self.hosts), "clients": CLIENTS, "rolling": [], "all_at_once": []}
        for rep in range(self.repeat):
            # Untimed: tp8 everywhere behind the router (the first time, the router is installed).
            self.up(self.rolling, FROM)
            out["rolling"].append(self.measure(self.rolling, "rolling"))
            self.up(self.all_at_once, FROM)
            out["all_at_once"].append(self.measure(self.all_at_once, "all at once"))
            self.log(f"router scenario run {rep + 1}/{self.repeat} done")
        return out


def edit_project(project: Project, mutate: Callable[[dict], None]) -> None:
    path = project.dir / "Pulumi.yaml"
    doc = yaml.safe_load(path.read_text())
    mutate(doc["config"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
