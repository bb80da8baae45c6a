"""A fleet behind SGLang's real router (smg 1.13.0, installed offline from the pinned wheels):
three rehearsal hosts, the real Pulumi engine, a bounded load generator sending requests only to
the router's address on a rehearsal host. Measured, not assumed: zero failed requests through a
rolling switch, at least N-1 hosts in the router at every sample, every host in the new layout at
the end; then a strategy whose engine crashes while loading: the first host of the roll is rolled
back and put back in the router, the roll stops there, the other hosts are untouched, and still
no request fails.

The rehearsal hosts live in network namespaces that reach only this machine; here each test
host's namespace gets a route to the rehearsal range and its own veth forwards (per interface,
nothing else on this machine forwards), so the router on gpu1 reaches the servers on gpu2 and
gpu3. Traffic stays inside 10.213.0.0/16 (the range ends on this machine).

The watch follows the traffic here too (issue 42): with the load rising from 1 to 32 clients,
`watch --apply` recommends tp8 and only logs it while outside its window, then, inside it,
switches pp8 -> tp8 itself (the same roll, through the Automation API), and measures the gain."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from pulumi import automation as auto

from components.core import autoswitch_apply as AP
from tests.pulumi_env import REPO

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

KEY = "e2e-router-admin-key-0123456789abcdef"
ROUTER_PORT = 30080
CLIENTS = 4
MAX_REQUESTS = 4000   # the bound: the generator stops there even if the switch is still running


def link(hosts) -> None:
    """Route between the test hosts (see the module's docstring); undone when they go down."""
    for h in hosts:
        root_side = h.address.rsplit(".", 1)[0] + ".1"
        subprocess.run(["ip", "-n", f"gsr-{h.name}", "route", "replace", "10.213.0.0/16", "via", root_side], check=True)
        subprocess.run(["sysctl", "-q", "-w", f"net.ipv4.conf.gsr-{h.name}.forwarding=1"], check=True)


def opener():
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, rehearsal_host_factory):
    done = subprocess.run([str(REPO / "scripts" / "router-wheels")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    hosts = [rehearsal_host_factory() for _ in range(3)]
    link(hosts)
    d = make_deployment(tmp_path_factory.mktemp("router-roll"), hosts[0])

    def behind_router(config):
        config["gpu-serving:hosts"] = {"value": [{"name": f"gpu{i + 1}", "rehearsal": h.name} for i, h in enumerate(hosts)]}
        config["gpu-serving:router"] = {"value": {"runsOn": "gpu1", "port": ROUTER_PORT, "policy": "round_robin",
                                                  "readyTimeoutSeconds": 90}}
        config["gpu-serving:rollout"] = {"value": {"maxUnavailable": 1, "drainTimeoutSeconds": 60}}
        # Each request's lengths on /metrics: the watch's length distribution (issue 42).
        config["gpu-serving:serving"]["value"]["collectTokensHistogram"] = True
    d.edit_project(behind_router)
    d.hosts = {f"gpu{i + 1}": h for i, h in enumerate(hosts)}
    d.router_url = f"http://{hosts[0].address}:{ROUTER_PORT}"
    return d


def stack(fleet, name):
    s = fleet.stack(name)
    s.set_config("gpu-serving:routerAdminKey", auto.ConfigValue(KEY, secret=True))
    return s


def router_workers(fleet) -> list[dict]:
    req = urllib.request.Request(fleet.router_url + "/workers", headers={"Authorization": f"Bearer {KEY}"})
    with opener().open(req, timeout=5) as r:
        return json.load(r)["workers"]


class Load:
    """`clients` clients (CLIENTS) sending requests to the router, one after the other each, until
    stopped or `max_requests` in all; `grow` adds clients; and a sampler of the router's worker list."""

    def __init__(self, fleet, clients: int = CLIENTS, max_requests: int = MAX_REQUESTS, prompt: str = "hello router",
                 max_tokens: int = 16):
        self.fleet = fleet
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failed: list[str] = []
        self.samples: list[int] = []
        self.max_requests = max_requests
        self.body = json.dumps({"model": "kimi-k2.6", "prompt": prompt, "max_tokens": max_tokens}).encode()
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]
        self.threads.append(threading.Thread(target=self.sample, daemon=True))

    def grow(self, clients: int) -> None:
        """Up to `clients` clients in all, the new ones starting now."""
        more = [threading.Thread(target=self.client, daemon=True) for _ in range(clients - (len(self.threads) - 1))]
        self.threads += more
        for t in more:
            t.start()

    def client(self):
        body = self.body
        while not self.stop.is_set():
            with self.lock:
                if self.ok + len(self.failed) >= self.max_requests:
                    return
            req = urllib.request.Request(self.fleet.router_url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with opener().open(req, timeout=60) as r:
                    answer = json.load(r)
                    good = r.status == 200 and answer["choices"][0]["text"]
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed.append(f"HTTP {r.status}: {answer}")
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                with self.lock:
                    self.failed.append(f"{type(exc).__name__}: {exc}")

    def sample(self):
        while not self.stop.is_set():
            try:
                ws = router_workers(self.fleet)
                self.samples.append(sum(1 for w in ws if w["is_healthy"] and w["status"] == "ready"))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.failed.append(f"sampling the router: {exc}")
            time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        time.sleep(2)  # requests keep flowing after the switch, too
        self.stop.set()
        for t in self.threads:
            t.join(90)


OWN_UNIT = "gpu-serving-router-own"


@pytest.fixture(scope="module")
def own_router(fleet, tmp_path_factory):
    """A second project: gpu2 and gpu3 behind a router on gpu1's machine, declared as a machine
    of its own (gpu-serving:router.host); its
    router listens on other ports under another unit name than the fleet's. Its tests run first,
    while gpu1 serves nothing; they leave no router of this project running."""
    own, gpu2, gpu3 = fleet.hosts["gpu1"], fleet.hosts["gpu2"], fleet.hosts["gpu3"]
    d = make_deployment(tmp_path_factory.mktemp("router-host"), gpu2)
    d.router = {"port": 30090, "metricsPort": 29090, "unitName": "gpu-serving-router-own", "policy": "round_robin",
                "readyTimeoutSeconds": 90}

    def own_machine(config):
        config["gpu-serving:hosts"] = {"value": [{"name": "gpu2", "rehearsal": gpu2.name}, {"name": "gpu3", "rehearsal": gpu3.name}]}
        config["gpu-serving:router"] = {"value": {"host": {"rehearsal": own.name}, **d.router}}
    d.edit_project(own_machine)
    d.hosts = {"own": own, "gpu2": gpu2, "gpu3": gpu3}
    yield d
    # Only if a test failed half-way (each test puts back what it changed).
    subprocess.run(["ip", "link", "set", f"gsr-{own.name}", "up"], check=False)
    own.run("test -e /usr/bin/nvidia-smi.away && mv /usr/bin/nvidia-smi.away /usr/bin/nvidia-smi")
    for h in d.hosts.values():
        h.run(f"systemctl disable --now {OWN_UNIT}")


def test_router_on_a_machine_of_its_own_without_gpus(own_router):
    """The router's own machine, made a host without GPUs (no nvidia-smi): nothing about GPUs,
    CUDA or a model is checked there, and no strategy runs there."""
    d = own_router
    own, gpu2, gpu3 = d.hosts["own"], d.hosts["gpu2"], d.hosts["gpu3"]
    own.run("mv /usr/bin/nvidia-smi /usr/bin/nvidia-smi.away", check=True)
    try:
        assert own.run("nvidia-smi").returncode != 0  # a machine without GPUs
        s = d.stack("tp8")
        s.set_config("gpu-serving:routerAdminKey", auto.ConfigValue(KEY, secret=True))
        lines: list[str] = []
        result = s.up(on_output=lines.append)
    finally:
        own.run("mv /usr/bin/nvidia-smi.away /usr/bin/nvidia-smi")
    router = result.outputs["router"].value
    assert router["status"] == "ready", (router, "\n".join(lines)[-3000:])
    assert router["url"] == f"http://{own.address}:30090"
    assert sorted((w["host"], w["url"], w["strategy"]) for w in router["workers"]) == [
        ("gpu2", f"http://{gpu2.address}:30001", "tp8 pp1 dp1"), ("gpu3", f"http://{gpu3.address}:30001", "tp8 pp1 dp1")]
    assert own.run(f"systemctl is-active {OWN_UNIT}").stdout.strip() == "active"
    # The router's machine serves no strategy: no serving unit, no serving venv.
    assert own.run("ls /etc/systemd/system | grep -c '^sglang-' || true").stdout.strip() == "0"
    assert own.run("test -e /root/venv_sglang211").returncode != 0
    assert set(result.outputs["readiness"].value) == {"gpu2", "gpu3"}


def _router_on(d, where: dict) -> list[str]:
    """Point the project's router somewhere else and `pulumi up`; the output's lines."""
    def edit(config):
        config["gpu-serving:router"] = {"value": {**where, **d.router}}
    d.edit_project(edit)
    lines: list[str] = []
    result = d.stack("tp8").up(on_output=lines.append)
    router = result.outputs["router"].value
    assert router["status"] == "ready", (router, "\n".join(lines)[-3000:])
    assert len(router["workers"]) == 2
    return lines


def _router_state(h) -> tuple[str, str, str]:
    """(is-active, is-enabled, files): the project's router unit on host `h`."""
    files = h.run(f"ls /etc/systemd/system/{OWN_UNIT}.service /etc/gpu-serving/{OWN_UNIT}.env 2>/dev/null | wc -l")
    return (h.run(f"systemctl is-active {OWN_UNIT}").stdout.strip(), h.run(f"systemctl is-enabled {OWN_UNIT}").stdout.strip(),
            files.stdout.strip())


def test_a_router_moved_off_a_dead_machine_then_to_another_host_leaves_none_behind(own_router):
    """The router's own machine stops answering (its link down: connections fail at once, as to a
    dead box); the operator points the router at gpu3 of the fleet (runsOn). The run reads nothing
    there, says what it leaves, and the router comes up on gpu3. Then the router moves again, live,
    to gpu2: it starts there and is checked, and only then is it stopped, disabled and its files
    removed on gpu3. A drift check after each finds nothing to do."""
    d = own_router
    own, gpu2, gpu3 = d.hosts["own"], d.hosts["gpu2"], d.hosts["gpu3"]
    subprocess.run(["ip", "link", "set", f"gsr-{own.name}", "down"], check=True)
    try:
        text = "\n".join(_router_on(d, {"runsOn": "gpu3"}))
    finally:
        subprocess.run(["ip", "link", "set", f"gsr-{own.name}", "up"], check=True)
    assert f"router: warning: {OWN_UNIT}.service is left on {own.address}, which does not answer" in text, text[-4000:]
    assert _router_state(gpu3) == ("active", "enabled", "2")
    # What the warning says: the dead machine's router is still there (nothing could reach it).
    assert _router_state(own)[0] == "active"
    own.run(f"systemctl disable --now {OWN_UNIT}")
    d.stack("tp8").preview(refresh=True, expect_no_changes=True, diff=True)

    preview: list[str] = []
    def edit(config):
        config["gpu-serving:router"] = {"value": {"runsOn": "gpu2", **d.router}}
    d.edit_project(edit)
    d.stack("tp8").preview(on_output=preview.append)
    assert (f"router: {OWN_UNIT}.service moves from {gpu3.address} to {gpu2.address}: it starts there and is checked, "
            "then it is stopped") in "\n".join(preview), "\n".join(preview)[-3000:]
    text = "\n".join(_router_on(d, {"runsOn": "gpu2"}))
    started, retired = f"router: start {OWN_UNIT}.service", f"router: {OWN_UNIT}.service stopped and disabled on {gpu3.address}"
    assert text.index(started) < text.index(retired), text[-4000:]
    assert _router_state(gpu2) == ("active", "enabled", "2")
    active, enabled, files = _router_state(gpu3)
    assert (active, files) == ("inactive", "0") and enabled != "enabled", (active, enabled, files)
    # The router's venv stays (shared, like the serving venvs); the serving units are untouched.
    assert gpu3.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() == "active"
    d.stack("tp8").preview(refresh=True, expect_no_changes=True, diff=True)
    gpu2.run(f"systemctl disable --now {OWN_UNIT}")  # the fleet's own router takes gpu1 next


def test_up_deploys_the_router_in_front_of_every_host(fleet):
    lines: list[str] = []
    result = stack(fleet, "tp8").up(on_output=lines.append)
    router = result.outputs["router"].value
    assert router["status"] == "ready", router
    assert router["url"] == fleet.router_url
    assert sorted((w["host"], w["strategy"]) for w in router["workers"]) == [
        ("gpu1", "tp8 pp1 dp1"), ("gpu2", "tp8 pp1 dp1"), ("gpu3", "tp8 pp1 dp1")]
    assert fleet.hosts["gpu1"].run("systemctl is-active gpu-serving-router").stdout.strip() == "active"
    # The key is in the 0600 environment file only, never in the unit or the outputs.
    assert KEY not in fleet.hosts["gpu1"].run("cat /etc/systemd/system/gpu-serving-router.service").stdout
    assert fleet.hosts["gpu1"].run("stat -c %a /etc/gpu-serving/gpu-serving-router.env").stdout.strip() == "600"
    assert KEY not in json.dumps({k: v.value for k, v in result.outputs.items() if not v.secret})


def router_call(fleet, method: str, path: str, body: dict | None = None) -> int:
    req = urllib.request.Request(fleet.router_url + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with opener().open(req, timeout=10) as r:
        return r.status


def routed(fleet, url: str) -> bool:
    return any(w["url"] == url and w["is_healthy"] and w["status"] == "ready" for w in router_workers(fleet))


def test_status_and_the_watch_say_a_host_the_router_left_out(fleet, tmp_path):
    """Issue 36.9: an interrupted roll left gpu2 out of the router while it served, ready, and
    status said all ready. Each host's membership is read from the router (on its own host, with
    the key it keeps there): status names the host and exits 4 (not serving users), the watch
    has it in status.json and its Prometheus file."""
    d = fleet
    done = d.components("status", "--stack", "tp8", "--json", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    hosts = {h["entry"]: h for h in json.loads(done.stdout)["hosts"]}
    assert {n: h["router"]["in_router"] for n, h in hosts.items()} == {"gpu1": True, "gpu2": True, "gpu3": True}, hosts
    worker = next(w["url"] for w in router_workers(d) if f"//{d.hosts['gpu2'].address}:" in w["url"])
    wid = next(w["id"] for w in router_workers(d) if w["url"] == worker)
    assert router_call(d, "DELETE", f"/workers/{wid}") in (200, 202, 204)  # what the interrupted roll did
    try:
        for _ in range(120):
            if not routed(d, worker):
                break
            time.sleep(0.5)
        done = d.components("status", "--stack", "tp8", timeout=300)
        assert done.returncode == 4, done.stdout + done.stderr
        assert f"router    not in the router at {d.router_url}: it routes nothing to {worker}" in done.stdout \
            or f"router    the router at {d.router_url} lists {worker} as draining" in done.stdout, done.stdout
        assert "serving but not ready: " in done.stdout and "readiness ready" in done.stdout, done.stdout
        state = tmp_path / "watch"
        argv = [sys.executable, "-m", "components", "watch", "--stacks", "tp8", "--once", "--state-dir", str(state)]
        ticked = subprocess.run(argv, cwd=d.project, env=d.env, capture_output=True, text=True, timeout=600)
        assert ticked.returncode == 0, ticked.stdout + ticked.stderr
        doc = json.loads((state / "status.json").read_text())
        entries = {h["entry"]: h for s in doc["stacks"] for h in s["hosts"]}
        assert entries["gpu2"]["router"]["in_router"] is False and entries["gpu1"]["router"]["in_router"] is True, entries
        prom = (state / "gpu-serving.prom").read_text()
        assert f'gpu_serving_in_router{{stack="tp8",host="{entries["gpu2"]["host"]}"}} 0' in prom, prom
    finally:
        for _ in range(240):
            if routed(d, worker):
                break
            if all(w["url"] != worker for w in router_workers(d)):
                router_call(d, "POST", "/workers", {"url": worker})
            time.sleep(0.5)
    assert routed(d, worker)


def serving_urls(fleet) -> list[str]:
    return sorted(w["url"] for w in router_workers(fleet) if w["is_healthy"] and w["status"] == "ready")


def wait_all_routed(fleet, timeout: float = 120) -> None:
    """Until the router sends requests to every host again (smg's health check finds a server back)."""
    want = sorted(f"http://{h.address}:30001" for h in fleet.hosts.values())
    deadline = time.monotonic() + timeout
    while serving_urls(fleet) != want:
        assert time.monotonic() < deadline, router_workers(fleet)
        time.sleep(1)


def wait_health(host, timeout: float = 120) -> None:
    """Until the host's server answers /health (on the host itself)."""
    deadline = time.monotonic() + timeout
    while host.run("curl -sf -o /dev/null --max-time 5 http://127.0.0.1:30001/health").returncode != 0:
        assert time.monotonic() < deadline, f"{host.name}: no /health in {timeout} s"
        time.sleep(1)


STDERR = "\n stderr: "  # where a CommandError's text has the command's stderr


def refused(run) -> str:
    """The output of a preview or up that must fail (the engine's CommandError)."""
    lines: list[str] = []
    with pytest.raises(auto.CommandError) as info:
        run(lines.append)
    # What the engine printed (stdout, line by line as it came), then its stderr.
    text = "\n".join(lines) + STDERR + str(info.value).rpartition(STDERR)[2]
    assert "Traceback" not in text and "Resource monitor" not in text, text[-4000:]
    return text


def said(text: str, words: str) -> tuple[int, int, int]:
    """How many times a refused run (`refused`'s text) said `words`: among its live lines (what the
    engine prints as the run goes), in the "Diagnostics:" summary it prints at the end (which
    repeats every error and warning of the run, by design), and on its stderr. Said once is
    (1, 1, 0)."""
    live, _, rest = text.partition("\nDiagnostics:\n")
    summary, _, stderr = rest.partition(STDERR)
    return live.count(words), summary.count(words), stderr.count(words)


def fleet_of(fleet, entries: dict) -> None:
    """gpu-serving:hosts as {name: rehearsal host name}."""
    def edit(config):
        config["gpu-serving:hosts"] = {"value": [{"name": n, "rehearsal": r} for n, r in entries.items()]}
    fleet.edit_project(edit)


def all_hosts(fleet) -> dict:
    return {n: h.name for n, h in fleet.hosts.items()}


def test_a_host_whose_address_is_not_known_stops_the_run_before_anything_changes(fleet):
    """Issue 36.6: with gpu3's rehearsal host stopped, `up` took its stand-in name for a fleet change:
    the router's unit rewritten with http://rehearsal-<name>:30001, gpu3 ejected, a batch rolled.
    Now the preview and the up stop, naming the entry, said once as `said` counts it, and nothing
    changes."""
    gpu1 = fleet.hosts["gpu1"]
    unit = gpu1.run("cat /etc/systemd/system/gpu-serving-router.service").stdout
    fleet_of(fleet, {**all_hosts(fleet), "gpu3": "pt-not-booted"})
    try:
        for run in (lambda out: stack(fleet, "pp8").preview(on_output=out), lambda out: stack(fleet, "pp8").up(on_output=out)):
            text = refused(run)
            assert "nothing was changed: hosts[gpu3]: the rehearsal host 'pt-not-booted' is not running" in text, text[-3000:]
            assert said(text, "the rehearsal host 'pt-not-booted' is not running") == (1, 1, 0), text
            assert "rehearsal-pt-not-booted" not in text and "roll: taking" not in text, text[-3000:]
    finally:
        fleet_of(fleet, all_hosts(fleet))
    assert gpu1.run("cat /etc/systemd/system/gpu-serving-router.service").stdout == unit
    assert len(serving_urls(fleet)) == 3


def test_a_host_that_does_not_answer_stops_the_roll_before_any_host_leaves_the_router(fleet):
    """Issue 36.5 and 36.12: gpu3 unreachable (its link down: no route, as to a dead box; the router
    may go on calling it healthy). The roll to pp8 used to take gpu1 out first and fail with full
    Python tracebacks, the OSError said twice. Now the preview and the up refuse in one line naming
    hosts[gpu3], before any host leaves the router: gpu1 and gpu2 keep serving tp8 through it.
    Said once, in each run: exactly one of the engine's live lines says that gpu3 cannot be
    reached, its "Diagnostics:" summary (which repeats each error of the run) says it exactly once
    too, and its stderr not at all; no other line says it (a second resource failing on the same
    host, or a warning naming the same failure, would)."""
    gpu3 = fleet.hosts["gpu3"]
    subprocess.run(["ip", "link", "set", f"gsr-{gpu3.name}", "down"], check=True)
    try:
        for run in (lambda out: stack(fleet, "pp8").preview(on_output=out), lambda out: stack(fleet, "pp8").up(on_output=out)):
            text = refused(run)
            assert (f"nothing was changed: hosts[gpu3] (http://{gpu3.address}:30001): cannot reach root@{gpu3.address}:22 over "
                    "SSH") in text, text[-3000:]
            assert said(text, f"cannot reach root@{gpu3.address}:22") == (1, 1, 0), text
            assert "roll: taking" not in text, text[-3000:]
        for name in ("gpu1", "gpu2"):
            h = fleet.hosts[name]
            assert f"http://{h.address}:30001" in serving_urls(fleet)
            assert h.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() == "active", name
            assert h.run("systemctl is-active sglang-kimi-k2.6-pp8.service").stdout.strip() != "active", name
    finally:
        subprocess.run(["ip", "link", "set", f"gsr-{gpu3.name}", "up"], check=True)
    wait_all_routed(fleet)


ROLL_ORDER = "switch in this order: rolling switch to"


def test_rolling_switch_drops_no_request_and_keeps_n_minus_one_serving(fleet):
    # tp8 serves behind the router: its preview plans no switch and shows no roll order.
    noop: list[str] = []
    stack(fleet, "tp8").preview(on_output=noop.append)
    assert ROLL_ORDER not in "\n".join(noop), "\n".join(noop)[-3000:]
    preview: list[str] = []
    stack(fleet, "pp8").preview(on_output=preview.append)
    # (Said once by the program: tests/test_router.py; the engine's output shows an info line as it
    # comes and again among the diagnostics.)
    assert (f"{ROLL_ORDER} pp8 behind the router {fleet.router_url}, 1 at a time: [gpu1] -> [gpu2] -> [gpu3]"
            in "\n".join(preview)), "\n".join(preview)[-3000:]
    started = time.monotonic()
    lines: list[str] = []
    with Load(fleet) as load:
        result = stack(fleet, "pp8").up(on_output=lines.append)
    seconds = time.monotonic() - started
    text = "\n".join(lines)
    print(f"fleet switch with router: {seconds:.1f} s, {load.ok} requests served, {len(load.failed)} failed, "
          f"{len(load.samples)} samples, fewest serving {min(load.samples)}")
    assert load.failed == [], load.failed[:10]
    assert load.ok > 50
    assert len(load.samples) > 20 and min(load.samples) >= 2, load.samples
    for name in ("gpu1", "gpu2", "gpu3"):
        assert f"hosts[{name}]: roll: taking" in text and f"hosts[{name}]: roll: http" in text, text[-3000:]
        assert result.outputs["readiness"].value[name]["layout"]["pp_size"] == 8
    router = result.outputs["router"].value
    assert router["status"] == "ready"
    assert sorted(w["strategy"] for w in router["workers"]) == ["tp1 pp8 dp1"] * 3
    # One at a time: each host left the router only after the one before was back.
    order = [text.index(f"hosts[{n}]: roll: taking") for n in ("gpu1", "gpu2", "gpu3")]
    backs = [text.index(f"hosts[{n}]: roll: http") for n in ("gpu1", "gpu2")]
    assert order[0] < backs[0] < order[1] < backs[1] < order[2]


def test_a_crash_rolls_that_host_back_puts_it_back_and_stops_the_roll(fleet):
    fleet.write_fault_stack("crash", "crash_during_load")
    lines: list[str] = []
    with Load(fleet) as load:
        with pytest.raises(auto.CommandError):
            stack(fleet, "crash").up(on_output=lines.append)
    text = "\n".join(lines)
    assert "the roll stopped at hosts[gpu1]" in text, text[-4000:]
    assert "Rolled back: restarted sglang-kimi-k2.6-pp8.service" in text, text[-4000:]
    assert load.failed == [], load.failed[:10]
    assert min(load.samples) >= 2, load.samples
    # gpu1 serves its previous strategy again, back in the router; gpu2 and gpu3 were never touched.
    workers = router_workers(fleet)
    assert len(workers) == 3 and all(w["is_healthy"] and w["status"] == "ready" for w in workers), workers
    for name, h in fleet.hosts.items():
        assert h.run("systemctl is-active sglang-kimi-k2.6-pp8.service").stdout.strip() == "active", name
        if name != "gpu1":
            assert "hosts[%s]: roll: taking" % name not in text


# Long prompts and short answers: the workload where TP8's prefill (8 GPUs on every prompt) pays
# over PP8's stage-by-stage one, so the measured gain of the switch has the sign the curves say.
PROMPT = " ".join(["traffic"] * 2048)
AUTOSWITCH = {"candidates": ["pp8", "tp8"], "minDwellMinutes": 5, "maxSwitchesPerDay": 4, "switchMinutes": 1,
              "horizonMinutes": 60, "observeMinutes": 1}


def autoswitch_windows(fleet, windows: list[str]) -> None:
    def edit(config):
        config["gpu-serving:autoswitch"] = {"value": {**AUTOSWITCH, "windows": windows}}
    fleet.edit_project(edit)


def a_window_not_now() -> str:
    """A one-minute window six hours from now (UTC): the tick is outside it."""
    start = datetime.now(timezone.utc) + timedelta(hours=6)
    return f"{start:%H:%M}-{start + timedelta(minutes=1):%H:%M}"


def watch_tick(fleet, state) -> tuple[dict, str]:
    """One `watch --once --apply` tick as an operator's timer runs it: status.json and its output."""
    started = time.monotonic()
    done = fleet.components("watch", "--once", "--apply", "--stacks", "pp8,tp8", "--state-dir", str(state), timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    print(f"watch tick: {time.monotonic() - started:.1f} s")
    return json.loads((state / "status.json").read_text()), done.stdout


def group_of(doc: dict, stack: str) -> dict:
    return next(g for g in doc["traffic"]["groups"] if g["stack"] == stack)


def decisions(state) -> list[dict]:
    path = state / AP.LOG_FILE
    return AP.parse_log(path.read_text()) if path.exists() else []


def test_watch_apply_follows_the_load_from_pp8_to_tp8_inside_its_window_with_no_failed_request(fleet, tmp_path):
    """Issue 42's end to end: pp8 serves the fleet behind the router, the rehearsal-measured curves
    of pp8 and tp8 are in results/bench. At one client the watch stays on pp8. At 32 clients it
    recommends tp8, and outside its window only logs the decision (applied: false, the window
    check failed): every host still serves pp8. Inside the window the next tick switches itself:
    a `pulumi up` of tp8 through the Automation API, the same roll (the preview announces it;
    tp8 deployed before in module order, so this is the switch back of an existing stack), with
    no failed request and at least 2 of 3 hosts in the router at every sample. The decision log
    shows what was expected and, a tick later, what was measured."""
    stack(fleet, "pp8").up()        # its own start (a no-op after the test before)
    stack(fleet, "tp8")             # the stack the watch may switch to, with its admin key
    shutil.copytree(REPO / "tests" / "data" / "compare" / "rehearsal" / "results", fleet.project / "results",
                    dirs_exist_ok=True)
    autoswitch_windows(fleet, [a_window_not_now()])
    state = tmp_path / "watch"
    outputs: list[str] = []
    with Load(fleet, clients=1, max_requests=20000, prompt=PROMPT, max_tokens=32) as load:
        while load.ok < 2:
            assert not load.failed, load.failed[:5]
            time.sleep(0.5)
        doc, out = watch_tick(fleet, state)
        outputs.append(out)
        assert group_of(doc, "pp8")["recommendation"]["action"] == "stay", group_of(doc, "pp8")["recommendation"]
        assert decisions(state) == []

        load.grow(32)
        for _ in range(2):
            doc, out = watch_tick(fleet, state)
            outputs.append(out)
        pp8 = group_of(doc, "pp8")
        assert pp8["recommendation"]["action"] == "switch" and pp8["recommendation"]["recommended"] == "tp8", pp8["workload"]
        # The load as the watch saw it: requests in flight, and each request's lengths (the histograms).
        summary = pp8["summary"]
        assert summary["concurrency"] > 8 and summary["lengths_basis"] == "each request", summary
        assert 2000 <= summary["input_len_p50"] <= 3000 and summary["output_len_p90"] <= 100, summary
        [record] = decisions(state)
        assert record["applied"] is False and (record["from"], record["to"]) == ("pp8", "tp8"), record
        assert [c["name"] for c in record["checks"] if not c["ok"]] == ["window"], record["checks"]
        assert "autoswitch: pp8 -> tp8 recommended, not applied: " in "".join(outputs), outputs[-1][-3000:]
        # Outside the window it only recommends: pp8 serves on every host.
        for name, h in fleet.hosts.items():
            assert h.run("systemctl is-active sglang-kimi-k2.6-pp8.service").stdout.strip() == "active", name

        autoswitch_windows(fleet, ["00:00-24:00"])
        preview: list[str] = []
        stack(fleet, "tp8").preview(on_output=preview.append)
        assert f"{ROLL_ORDER} tp8 behind the router" in "\n".join(preview), "\n".join(preview)[-3000:]
        doc, out = watch_tick(fleet, state)
        outputs.append(out)
        applied = decisions(state)[-1]
        assert applied["applied"] is True and applied["switch"]["ok"] is True, (applied, out[-4000:])
        assert applied["expected"]["tok_s_after"] > applied["expected"]["tok_s_before"] > 0, applied["expected"]
        assert applied["expected"]["basis"] in ("interpolated", "measured"), applied["expected"]
        for name in ("gpu1", "gpu2", "gpu3"):
            assert f"hosts[{name}]: roll: taking" in out, out[-4000:]
        workers = router_workers(fleet)
        assert len(workers) == 3 and all(w["is_healthy"] for w in workers), workers
        for name, h in fleet.hosts.items():
            assert h.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() == "active", name

        doc, out = watch_tick(fleet, state)
        outputs.append(out)
    assert load.failed == [], load.failed[:10]
    assert min(load.samples) >= 2, load.samples
    measured = decisions(state)[-1]
    outcome = measured["outcome"]
    assert outcome is not None, (measured, out[-3000:])
    # Expected against measured, both in the record and said once (no band on the value: a
    # rehearsal on shared cores measures what it measures).
    assert outcome["tok_s_before"] > 0 and outcome["tok_s_after"] > 0, outcome
    assert outcome["gain_percent"] is not None and outcome["of_expected_percent"] is not None, outcome
    assert "autoswitch: pp8 -> tp8 measured " in out, out[-3000:]
    print(f"autoswitch: expected {measured['expected']['tok_s_before']:.0f} -> {measured['expected']['tok_s_after']:.0f} tok/s, "
          f"measured {outcome['tok_s_before']:.0f} -> {outcome['tok_s_after']:.0f} ({outcome['gain_percent']:+.0f} %), "
          f"{load.ok} requests served, 0 failed")


def test_a_host_leaves_and_rejoins_the_fleet_without_a_router_restart_or_a_failed_request(fleet):
    """gpu3 removed from gpu-serving:hosts, then listed again, each `up` under load: the router is
    told through its admin API (not restarted: same process), gpu3 leaves it and drains before its
    unit stops, and rejoins once it serves; no request through the router fails."""
    gpu1, gpu3 = fleet.hosts["gpu1"], fleet.hosts["gpu3"]
    url3 = f"http://{gpu3.address}:30001"

    def router_pid() -> str:
        return gpu1.run("systemctl show -p MainPID --value gpu-serving-router").stdout.strip()

    def fleet_of(names):
        def edit(config):
            config["gpu-serving:hosts"] = {"value": [{"name": n, "rehearsal": fleet.hosts[n].name} for n in names]}
        fleet.edit_project(edit)

    def up() -> tuple[str, dict]:
        lines: list[str] = []
        with Load(fleet) as load:
            result = stack(fleet, "tp8").up(on_output=lines.append)
        text = "\n".join(lines)
        assert load.failed == [], (load.failed[:10], text[-4000:])
        assert load.ok > 10
        return text, result.outputs["router"].value

    pid = router_pid()
    fleet_of(["gpu1", "gpu2"])
    try:
        preview: list[str] = []
        stack(fleet, "tp8").preview(on_output=preview.append)
        assert f"router: the fleet behind it changes (leaves: {url3}): the router is told through its admin API, not restarted" \
            in "\n".join(preview), "\n".join(preview)[-3000:]
        text, router = up()
        assert f"hosts[gpu3]: taking {url3} out of the router before it stops" in text, text[-4000:]
        assert router["status"] == "ready", router
        assert sorted(w["host"] for w in router["workers"] if w["host"]) == ["gpu1", "gpu2"]
        assert url3 not in [w["url"] for w in router_workers(fleet) if w["is_healthy"] and w["status"] == "ready"]
        assert gpu3.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() != "active"
        assert router_pid() == pid
    finally:
        fleet_of(["gpu1", "gpu2", "gpu3"])
    text, router = up()
    assert router["status"] == "ready", router
    assert sorted((w["host"], w["strategy"]) for w in router["workers"] if w["host"]) == [
        ("gpu1", "tp8 pp1 dp1"), ("gpu2", "tp8 pp1 dp1"), ("gpu3", "tp8 pp1 dp1")]
    assert gpu3.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() == "active"
    assert router_pid() == pid


def test_a_host_that_rejoins_during_a_switch_switches_first_and_two_keep_serving(fleet):
    """Issue 36.5: gpu3 listed again in the same `up` as a switch, serving nothing: the roll took gpu1
    out while gpu3 was not yet in the router (1 of 3 served). Now gpu3, out of service, switches
    first, then gpu1 and gpu2 one at a time: two hosts serve at every sample, no request fails."""
    fleet_of(fleet, {"gpu1": fleet.hosts["gpu1"].name, "gpu2": fleet.hosts["gpu2"].name})
    try:
        stack(fleet, "tp8").up()
    finally:
        fleet_of(fleet, all_hosts(fleet))
    assert fleet.hosts["gpu3"].run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() != "active"
    preview: list[str] = []
    stack(fleet, "pp8").preview(on_output=preview.append)
    assert (f"{ROLL_ORDER} pp8 behind the router {fleet.router_url}, 1 at a time: [gpu3] -> [gpu1] -> [gpu2]; first, "
            "together, the hosts out of service now (gpu3: serves nothing)") in "\n".join(preview), "\n".join(preview)[-3000:]
    lines: list[str] = []
    with Load(fleet) as load:
        result = stack(fleet, "pp8").up(on_output=lines.append)
    text = "\n".join(lines)
    assert load.failed == [], load.failed[:10]
    assert min(load.samples) >= 2, load.samples
    order = [text.index(f"hosts[{n}]: roll: taking") for n in ("gpu3", "gpu1", "gpu2")]
    assert order == sorted(order), text[-4000:]
    assert sorted(w["strategy"] for w in result.outputs["router"].value["workers"]) == ["tp1 pp8 dp1"] * 3


def test_a_host_leaving_in_the_same_run_as_a_switch_counts_against_max_unavailable(fleet):
    """Issue 36.5: gpu3 taken out of the fleet in the same run as a switch: the router drops it before
    the first batch, so the roll would leave 1 of 3 serving. Refused, naming it, before anything changes."""
    fleet_of(fleet, {"gpu1": fleet.hosts["gpu1"].name, "gpu2": fleet.hosts["gpu2"].name})
    try:
        text = refused(lambda out: stack(fleet, "tp8").preview(on_output=out))
    finally:
        fleet_of(fleet, all_hosts(fleet))
    assert (f"http://{fleet.hosts['gpu3'].address}:30001 (leaves the fleet in this run while the router routes to it) counts "
            "against gpu-serving:rollout.maxUnavailable (1): with hosts[gpu1] taken out as well, 2 would be out") in text, text[-3000:]


def test_after_a_partial_roll_the_order_names_only_the_hosts_that_switch(fleet):
    """Issue 36.10: gpu1 and gpu2 already serve tp8 (here by hand, as after a roll that stopped at
    gpu3): the preview names [gpu3] alone, and the up rolls gpu3 alone."""
    for name in ("gpu1", "gpu2"):
        fleet.hosts[name].run("systemctl stop sglang-kimi-k2.6-pp8.service && systemctl start sglang-kimi-k2.6-tp8.service",
                              check=True, timeout=120)
    # Each hand-started server answers before the router is asked: the router may still list the
    # stopped pp8 server as healthy (its health check has not run since), which is no sign the new
    # one is up.
    for name in ("gpu1", "gpu2"):
        wait_health(fleet.hosts[name])
    wait_all_routed(fleet)
    preview: list[str] = []
    stack(fleet, "tp8").preview(on_output=preview.append)
    text = "\n".join(preview)
    assert f"{ROLL_ORDER} tp8 behind the router {fleet.router_url}, 1 at a time: [gpu3]; unchanged: gpu1, gpu2" in text, text[-3000:]
    assert "[gpu1]" not in text and "[gpu2]" not in text
    lines: list[str] = []
    with Load(fleet) as load:
        result = stack(fleet, "tp8").up(on_output=lines.append)
    text = "\n".join(lines)
    assert load.failed == [], load.failed[:10]
    assert "hosts[gpu3]: roll: taking" in text and "hosts[gpu1]: roll:" not in text and "hosts[gpu2]: roll:" not in text
    # (The router's labels of gpu1 and gpu2 are still pp8's: smg reads them when a worker is added,
    # and the hand switch did not re-add them.)
    assert {n: r["layout"]["tp_size"] for n, r in result.outputs["readiness"].value.items()} == {"gpu1": 8, "gpu2": 8, "gpu3": 8}
    assert result.outputs["router"].value["status"] == "ready"


def test_a_one_host_stack_may_not_switch_a_fleet_member(fleet, tmp_path_factory):
    """Issue 36.7: the one-host `ep8` stack (scripts/deploy's default) switched a host that serves as a
    routed member of this fleet, with no drain and no warning. Its preview and its up are refused,
    naming the unit, the fleet's stack and the router, before anything stops: gpu2 still serves tp8
    through the router."""
    gpu2 = fleet.hosts["gpu2"]
    one = make_deployment(tmp_path_factory.mktemp("one-host"), gpu2)
    for run in (lambda out: one.stack("ep8").preview(on_output=out), lambda out: one.stack("ep8").up(on_output=out)):
        text = refused(run)
        assert ("the switch to sglang-kimi-k2.6-ep8.service is refused before anything stops: sglang-kimi-k2.6-tp8.service "
                f"(stack tp8) serves on {gpu2.address} as a member of a fleet behind SGLang's router gpu-serving-router:30080"
                in text), text[-3000:]
    assert gpu2.run("systemctl is-active sglang-kimi-k2.6-tp8.service").stdout.strip() == "active"
    assert gpu2.run("systemctl is-active sglang-kimi-k2.6-ep8.service").stdout.strip() != "active"
    assert f"http://{gpu2.address}:30001" in serving_urls(fleet)
