"""SGLang's real router (smg, the pinned wheels) on a rehearsal host: installed offline from the
pushed wheelhouse by the same provider as the serving venv, its binary runs, and the admin API
calls gpu-serving's roll makes (components/remote/router.py) do what they claim against a
rehearsal engine behind it: list with the strategy, take out, count in-flight requests on the
server, put back and see it healthy."""
from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from components.core import router as R
from components.core import scrape
from components.core.config import parse_settings
from components.remote import router as remote_router
from components.remote import ssh
from components.remote.installers import PythonVenvProvider
from components.router import install_props
from rehearsal import engine_wheel
from tests.prometheus_support import Prometheus

pytestmark = pytest.mark.rehearsal

REPO = Path(__file__).resolve().parents[2]
KEY = "pytest-router-admin-key-0123456789"
ENGINE_VENV = "/opt/pt-router-engine"
ENGINE_UNIT = "pt-router-engine.service"
ENGINE_PORT = 30001


def connection(h) -> dict:
    return {"host": h.address, "port": h.port, "user": h.user, "privateKey": Path(h.private_key).read_text(),
            "hostKey": h.host_public_key, "connectTimeout": 10, "commandTimeout": 300}


def fleet_settings(address: str):
    return parse_settings("tp8", {"model": {"profile": "kimi-k2.6"}, "strategy": {"tpSize": 8},
                                  "hosts": [{"name": "gpu1", "rehearsal": "gpu1"}],
                                  "router": {"runsOn": "gpu1", "policy": "round_robin"}})


@pytest.fixture(scope="module")
def router_host(rehearsal_host, tmp_path_factory):
    h = rehearsal_host
    done = subprocess.run([str(REPO / "scripts" / "router-wheels")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    settings = fleet_settings(h.address)
    # The router's venv, offline: the pinned wheels pushed by SFTP, pip --no-index on the host.
    props = {"connection": connection(h), **install_props(settings.router)}
    outs = PythonVenvProvider()._converge(props)
    # The engine behind it, one token every 50 ms so requests stay in flight long enough to see.
    wheel = engine_wheel.build(tmp_path_factory.mktemp("wheel"))
    h.put(wheel, f"/tmp/{wheel.name}")
    proc = h.run(f"rm -rf {ENGINE_VENV} && python3 -m venv {ENGINE_VENV} && {ENGINE_VENV}/bin/pip install -q --no-index "
                 f"/tmp/{wheel.name}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    h.run(f"cat > /etc/systemd/system/{ENGINE_UNIT}", check=True, input=(
        "[Service]\nEnvironment=REHEARSAL_LOAD_SECONDS=0 REHEARSAL_SECONDS_PER_TOKEN=0.05\n"
        f"ExecStart={ENGINE_VENV}/bin/python -m sglang.launch_server --model-path /models/kimi-k2.6 "
        "--served-model-name kimi-k2.6 --tp-size 8 "
        f"--context-length 32768 --mem-fraction-static 0.88 --host 0.0.0.0 --port {ENGINE_PORT} --enable-metrics\n"))
    # The router unit as gpu-serving renders it, with its 0600 key file.
    worker = R.worker_url(h.address, ENGINE_PORT)
    h.run(f"mkdir -p {R.ENVIRONMENT_DIR} && umask 077 && cat > {R.environment_path(settings)}", check=True,
          input=R.render_environment(KEY))
    h.run(f"cat > /etc/systemd/system/{R.unit_name(settings)}", check=True, input=R.render_unit(settings, [worker]))
    h.run(f"systemctl daemon-reload && systemctl start {ENGINE_UNIT} {R.unit_name(settings)}", check=True)
    yield h, settings, outs, worker
    h.run(f"systemctl stop {ENGINE_UNIT} {R.unit_name(settings)}; rm -f /etc/systemd/system/{ENGINE_UNIT} "
          f"/etc/systemd/system/{R.unit_name(settings)} {R.environment_path(settings)}; systemctl daemon-reload; "
          f"systemctl reset-failed; rm -rf {ENGINE_VENV} {settings.router.venv_path}")


def admin_for(h, settings) -> remote_router.RouterAdmin:
    return remote_router.RouterAdmin(admin_props(h, settings))


def admin_props(h, settings, key: str = KEY) -> dict:
    r = settings.router
    return {"connection": connection(h), "bind": r.bind, "port": r.port, "venvPath": r.venv_path, "adminKey": key}


def test_router_installs_offline_and_its_binary_runs(router_host):
    h, settings, outs, _ = router_host
    assert outs["installed"]["smg"] == settings.router.version == "1.13.0"
    assert outs["packages"] == R.pins("1.13.0")
    help_text = h.run(f"{settings.router.venv_path}/bin/smg launch --help", check=True, timeout=60).stdout
    for flag in ("--worker-urls", "--policy", "--control-plane-api-keys", "--prometheus-host"):
        assert flag in help_text
    # The wheels came from the pushed wheelhouse (the host has no route to an index).
    listed = h.run("ls /var/lib/gpu-serving/router-wheelhouse", check=True).stdout.split()
    assert any(n.startswith("smg-1.13.0-") for n in listed)


def test_admin_api_lists_removes_drains_and_adds_back(router_host):
    h, settings, _, worker = router_host
    admin = admin_for(h, settings)
    workers = admin.wait("the router does not route to the engine", lambda ws: bool(R.serving(ws)), 120)
    assert [(w.url, w.strategy) for w in workers] == [(worker, "tp8 pp1 dp1")]  # smg copies no ep_size label
    # Without the key the admin API refuses.
    anonymous = remote_router.RouterAdmin(admin_props(h, settings, "wrong-key-0123456789"))
    assert anonymous.call("GET", "/workers")[0] == 401
    # Requests through the router, long enough to be in flight while it is taken out.
    router_url = R.worker_url(h.address, settings.router.port)
    results: list[int] = []

    def one():
        body = b'{"model": "kimi-k2.6", "prompt": "hi", "max_tokens": 60}'
        req = urllib.request.Request(router_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60) as r:
            results.append(r.status)
    threads = [threading.Thread(target=one) for _ in range(3)]
    for th in threads:
        th.start()
    t = ssh.Target.from_props({"connection": connection(h)})
    deadline = time.monotonic() + 10
    while (n := remote_router.in_flight(t, "0.0.0.0", ENGINE_PORT)) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert n and n >= 1
    admin.remove(worker)
    admin.wait("still routed", lambda ws: not R.serving(ws), 30)
    remote_router.drain(t, "0.0.0.0", ENGINE_PORT, 60, lambda m: None, "")
    assert remote_router.in_flight(t, "0.0.0.0", ENGINE_PORT) == 0
    for th in threads:
        th.join(60)
    assert results == [200, 200, 200]  # removal let the requests in flight finish
    back = admin.add(worker, 180)
    assert R.judge_router([worker], back).ready


def test_a_real_prometheus_scrapes_the_engine_and_the_router(router_host, tmp_path):
    """Debian's Prometheus on loopback, with the configuration and target files gpu-serving writes
    (components/core/scrape.py), scrapes the engine's SGLang /metrics and smg's metrics port."""
    h, settings, _, worker = router_host
    targets, notes = scrape.targets_of(settings, {"gpu1": h.address})
    assert not notes and [(t.role, t.endpoint) for t in targets] == [
        ("server", f"{h.address}:{ENGINE_PORT}"), ("router", f"{h.address}:{settings.router.metrics_port}")]
    folder = tmp_path / "prometheus"
    (folder / "targets").mkdir(parents=True)
    # Two stacks of one fleet list the same server and router: Prometheus scrapes each once.
    for stack in ("tp8", "pp8"):
        (folder / "targets" / f"{stack}.json").write_text(scrape.render_targets(targets))
    (folder / "prometheus.yml").write_text(scrape.render_config(str(folder / "targets"), watch_exporter=None,
                                                                scrape_interval="1s"))
    body = b'{"model": "kimi-k2.6", "prompt": "hi", "max_tokens": 4}'
    req = urllib.request.Request(R.worker_url(h.address, settings.router.port) + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60) as r:
        assert r.status == 200
    prometheus = Prometheus(folder / "prometheus.yml", tmp_path)
    try:
        prometheus.wait_ready()
        served = prometheus.wait_series('sglang:num_running_reqs{role="server"}')
        assert served, prometheus.log()[-2000:]
        assert {s["metric"]["instance"] for s in served} == {f"{h.address}:{ENGINE_PORT}"}
        assert served[0]["metric"]["host"] == "rehearsal:gpu1" and served[0]["metric"]["entry"] == "gpu1"
        routed = prometheus.wait_series('smg_router_requests_total{role="router"}')
        assert routed and sum(float(s["value"][1]) for s in routed) >= 1, prometheus.log()[-2000:]
        assert sorted(t["labels"]["role"] for t in prometheus.targets()) == ["router", "server"]
        assert all(t["health"] == "up" for t in prometheus.targets()), prometheus.targets()
    finally:
        assert prometheus.stop() == 0
