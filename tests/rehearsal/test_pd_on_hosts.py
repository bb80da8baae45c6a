"""Prefill/decode disaggregation across two rehearsal hosts with SGLang's real router (smg 1.13.0,
PD mode), driven by hand from this test (the Pulumi side is not built yet, issue 41): the units
gpu-serving renders for each role and for the router (pd_plan), written with their files and
started by systemd. A generation through the router crosses the KV path (the decode side's
counter moves); a wrong bootstrap port in the router, a cut link and a dead prefill server fail
the way SGLang's do, and the pair serves again once the fault is gone."""
from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from components.core import pd_plan
from components.core import router as R
from components.core.config import parse_settings
from components.core.plan import build_plans
from rehearsal import engine_wheel

from ..casedata import case_config

pytestmark = pytest.mark.rehearsal

PORT, ROUTER_PORT, BOOTSTRAP = 30001, 30080, 8998
KEY = "pt-pd-admin-key-0123456789abcdef"
KV_BYTES = (512 + 64) * 61 * 2
PROMPT = " ".join(f"w{i}" for i in range(40))
ENV = {"REHEARSAL_LOAD_SECONDS": "1", "REHEARSAL_WARMUP_SECONDS": "0.5", "REHEARSAL_PERFORMANCE": "off",
       "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "5", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "8",
       "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2"}
WHEELHOUSE = Path("/var/cache/gpu-serving/router/wheelhouse")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


def render(prefill, decode, bootstrap_port: int = BOOTSTRAP):
    config = case_config({"config": {
        "hosts": [{"name": "gpu1", "rehearsal": prefill.name}, {"name": "gpu2", "rehearsal": decode.name}],
        "router": {"runsOn": "gpu1", "port": ROUTER_PORT},
        "strategy": {"tpSize": 8, "epSize": 8},
        "serving": {"environment": ENV},  # --enable-metrics: serving.enableMetrics, on by default
        "disaggregation": {"bootstrapPort": bootstrap_port, "prefill": {"hosts": ["gpu1"]}, "decode": {"hosts": ["gpu2"]}},
    }})
    settings = parse_settings("pd1p1d", config)
    plans = build_plans(settings)
    return settings, plans, pd_plan.build(settings, plans, {prefill.name: prefill.address, decode.name: decode.address})


@pytest.fixture(scope="module")
def pd(rehearsal_host_factory, tmp_path_factory):
    prefill, decode = rehearsal_host_factory(), rehearsal_host_factory()
    wheel = engine_wheel.build(tmp_path_factory.mktemp("wheel"))
    settings, plans, pair = render(prefill, decode)

    def install(host, plan):
        host.put(wheel, f"/tmp/{wheel.name}")
        host.run(f"python3 -m venv {settings.venv.path} && {settings.venv.path}/bin/pip install -q --no-index "
                 f"/tmp/{wheel.name}", check=True, timeout=300)
        host.run(f"mkdir -p {Path(plan.unit.environment_path).parent}", check=True)
        host.run(f"cat > {plan.unit.environment_path}", input=plan.environment_text, check=True)
        host.run(f"cat > /etc/systemd/system/{plan.unit.name}", input=plan.unit.text, check=True)
        host.run(f"systemctl daemon-reload && systemctl start {plan.unit.name}", check=True)
    with ThreadPoolExecutor(2) as pool:  # the two hosts at once
        for done in [pool.submit(install, host, plan) for host, (_, plan) in zip((prefill, decode), plans)]:
            done.result()
    # The router: the pinned wheels, offline, in its venv; its key file and its PD-mode unit.
    prefill.run("mkdir -p /tmp/router-wheels", check=True)
    for w in R.pins(settings.router.version):
        name, version = w.split("==")
        for f in WHEELHOUSE.glob("*.whl"):
            if f.name.lower().replace("_", "-").startswith(f"{name.lower().replace('_', '-')}-{version}-"):
                prefill.put(f, f"/tmp/router-wheels/{f.name}")
    venv = settings.router.venv_path
    prefill.run(f"python3 -m venv {venv} && {venv}/bin/pip install -q --no-index --find-links /tmp/router-wheels "
                f"smg=={settings.router.version}", check=True, timeout=300)
    install_router(prefill, settings, pair.router_unit)
    servers = {"prefill": (prefill, plans[0][1]), "decode": (decode, plans[1][1])}
    for host, plan in servers.values():
        wait_ready(host, plan.unit.name)
    wait_router(prefill)
    return {"settings": settings, "pair": pair, "prefill": prefill, "decode": decode, "servers": servers}


def install_router(host, settings, unit_text: str):
    unit = R.unit_name(settings)
    host.run(f"mkdir -p {R.ENVIRONMENT_DIR} && umask 077 && cat > {R.environment_path(settings)}",
             input=R.render_environment(KEY), check=True)
    host.run(f"cat > /etc/systemd/system/{unit}", input=unit_text, check=True)
    host.run(f"systemctl daemon-reload && systemctl restart {unit}", check=True)


def wait_ready(host, unit: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while host.run(f"curl -sf -o /dev/null http://127.0.0.1:{PORT}/health_generate").returncode != 0:
        assert time.monotonic() < deadline, host.run(f"journalctl -u {unit} --no-pager -n 40").stdout
        time.sleep(0.5)


def wait_router(host, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while host.run(f"curl -sf -o /dev/null http://127.0.0.1:{ROUTER_PORT}/readiness").returncode != 0:
        assert time.monotonic() < deadline, host.run("journalctl -u gpu-serving-router --no-pager -n 40").stdout
        time.sleep(0.5)


def http(method: str, url: str, body=None, timeout: float = 60, key: str | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers=headers)
    try:
        with OPENER.open(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def generate(pd, prompt: str = PROMPT):
    return http("POST", f"http://{pd['prefill'].address}:{ROUTER_PORT}/generate",
                {"text": prompt, "sampling_params": {"max_new_tokens": 8}})


def metric(host, name: str, **labels) -> float:
    text = host.run(f"curl -sf http://127.0.0.1:{PORT}/metrics", check=True).stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()))


def kv_received(pd) -> int:
    info = json.loads(pd["decode"].run(f"curl -sf http://127.0.0.1:{PORT}/server_info", check=True).stdout)
    return info["rehearsal"]["disaggregation"]["kv_bytes"]


def test_a_generation_through_the_router_crosses_the_kv_path(pd):
    before = metric(pd["decode"], "sglang:per_stage_req_latency_seconds_count", stage="decode_transferred")
    assert before == 0 and kv_received(pd) == 0  # ready and healthy, and nothing moved yet (fake warm-up)
    status, body = generate(pd)
    assert status == 200, body
    assert json.loads(body)["meta_info"]["completion_tokens"] == 8
    assert metric(pd["decode"], "sglang:per_stage_req_latency_seconds_count", stage="decode_transferred") == before + 1
    assert metric(pd["prefill"], "sglang:kv_transfer_total_mb_count") == 1
    assert kv_received(pd) == 40 * KV_BYTES
    # The router runs in PD mode with both servers: its workers carry their role.
    status, text = http("GET", f"http://{pd['prefill'].address}:{ROUTER_PORT}/workers", key=KEY)
    assert status == 200, text
    workers = {w["url"].rstrip("/"): w for w in json.loads(text)["workers"]}
    assert set(workers) == {s.url for s in pd["pair"].servers}
    for server in pd["pair"].servers:
        w = workers[server.url]
        assert (w["worker_type"], w["labels"]["disaggregation_mode"], w["is_healthy"]) == (server.role, server.role, True)


def test_a_wrong_bootstrap_port_in_the_router_fails_the_request_and_moves_nothing(pd):
    settings, prefill = pd["settings"], pd["prefill"]
    _, _, wrong = render(prefill, pd["decode"], bootstrap_port=BOOTSTRAP + 1)
    install_router(prefill, settings, wrong.router_unit)
    try:
        wait_router(prefill)
        moved = kv_received(pd)
        status, body = generate(pd)
        assert status >= 500, body
        assert "Decode handshake failed" in body and f":{BOOTSTRAP + 1} after 15 attempts" in body, body
        assert kv_received(pd) == moved
    finally:
        install_router(prefill, settings, pd["pair"].router_unit)
        wait_router(prefill)
    assert generate(pd)[0] == 200


def test_a_cut_link_between_the_hosts_fails_the_decode_side(pd):
    prefill, decode = pd["prefill"], pd["decode"]
    route = ["ip", "-n", decode.netns, "route", "{}", "unreachable", f"{prefill.address}/32"]
    subprocess.run([a.format("add") for a in route], check=True)
    try:
        unit = pd["servers"]["decode"][1].unit.name
        deadline = time.monotonic() + 30
        lost = f"Lost connection with prefill instance (bootstrap_addr: {prefill.address}:{BOOTSTRAP})"
        while lost not in decode.run(f"journalctl -u {unit} --no-pager -o cat").stdout:
            assert time.monotonic() < deadline, decode.run(f"journalctl -u {unit} --no-pager -n 30").stdout
            time.sleep(1)
        moved = kv_received(pd)
        status, body = generate(pd)
        # The router runs on the prefill host: it cannot reach the decode server either, and the
        # prefill server waits for a decode side that never comes (its bootstrap timeout).
        assert status >= 500 and "in KVPoll.Bootstrapping" in body, body
        assert kv_received(pd) == moved
    finally:
        subprocess.run([a.format("del") for a in route], check=True)
    assert generate(pd)[0] == 200


def test_a_dead_prefill_server_fails_requests_until_it_is_back(pd):
    prefill = pd["prefill"]
    unit = pd["servers"]["prefill"][1].unit.name
    prefill.run(f"kill -9 $(systemctl show -p MainPID --value {unit}); systemctl stop {unit}", check=True)
    try:
        status, body = generate(pd)
        assert status >= 500, body
    finally:
        prefill.run(f"systemctl reset-failed {unit}; systemctl start {unit}", check=True)
        wait_ready(prefill, unit)
    deadline = time.monotonic() + 60
    while (status := generate(pd)[0]) != 200:  # the router finds it healthy again, the decode side looks it up
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert metric(prefill, "sglang:kv_transfer_total_mb_count") >= 1
