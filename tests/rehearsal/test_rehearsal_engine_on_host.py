"""The rehearsal engine wheel installed into a venv on a rehearsal host and run by systemd, the
way the Pulumi program deploys SGLang: a valid EP8 layout becomes ready and reports its layout;
an impossible TP8 x PP8 layout fails at start with the reason in `journalctl -u`."""
from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from rehearsal import engine_wheel

pytestmark = pytest.mark.rehearsal

VENV = "/opt/pt-sglang"
PORT = 30001
UNIT = "pt-sglang.service"
COMMON = ("--model-path /models/kimi-k2.6 --mem-fraction-static 0.88 --context-length 32768 "
          "--max-running-requests 64 --attention-backend triton --trust-remote-code "
          f"--grammar-backend none --host 0.0.0.0 --port {PORT}")


def unit_file(layout: str) -> str:
    return ("[Unit]\nDescription=pytest rehearsal SGLang\n"
            "[Service]\nType=simple\nEnvironment=REHEARSAL_LOAD_SECONDS=1\n"
            f"ExecStart={VENV}/bin/python -m sglang.launch_server {layout} {COMMON}\n")


@pytest.fixture(scope="module")
def engine_host(rehearsal_host, tmp_path_factory):
    wheel = engine_wheel.build(tmp_path_factory.mktemp("wheel"))
    remote = f"/tmp/{wheel.name}"  # pip wants a valid wheel file name
    rehearsal_host.put(wheel, remote)
    proc = rehearsal_host.run(f"rm -rf {VENV} && python3 -m venv {VENV} && "
                              f"{VENV}/bin/pip install -q --no-index {remote} && "
                              f"{VENV}/bin/python -c 'import sglang.launch_server'", timeout=300)
    assert proc.returncode == 0, proc.stderr
    yield rehearsal_host
    rehearsal_host.run(f"systemctl stop {UNIT}; rm -f /etc/systemd/system/{UNIT}; "
                       f"systemctl daemon-reload; systemctl reset-failed; rm -rf {VENV} {remote}")


def start_unit(host, layout: str) -> None:
    host.run(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}")
    host.run(f"cat > /etc/systemd/system/{UNIT}", input=unit_file(layout), check=True)
    host.run(f"systemctl daemon-reload && systemctl start {UNIT}", check=True)


def test_ep8_becomes_ready_and_reports_its_layout(engine_host):
    start_unit(engine_host, "--tp-size 8 --ep-size 8")
    deadline = time.monotonic() + 60
    while engine_host.run(f"curl -sf -o /dev/null http://127.0.0.1:{PORT}/health_generate"
                          ).returncode != 0:
        state = engine_host.run(f"systemctl is-active {UNIT}").stdout.strip()
        assert state in ("active", "activating"), engine_host.run(
            f"journalctl -u {UNIT} --no-pager -n 30").stdout
        assert time.monotonic() < deadline, "engine not ready within 60 s"
        time.sleep(0.5)
    info = json.loads(engine_host.run(f"curl -sf http://127.0.0.1:{PORT}/server_info",
                                      check=True).stdout)
    assert info["tp_size"] == 8 and info["ep_size"] == 8
    assert info["model_path"] == "/models/kimi-k2.6"
    # Reachable from the root namespace too, at the host's own address.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    with direct.open(f"http://{engine_host.address}:{PORT}/health", timeout=10) as r:
        assert r.status == 200


def test_tp8_pp8_fails_at_start_with_the_reason_in_the_journal(engine_host):
    start_unit(engine_host, "--tp-size 8 --pp-size 8")
    deadline = time.monotonic() + 60
    while (state := engine_host.run(f"systemctl is-active {UNIT}").stdout.strip()) != "failed":
        assert state in ("active", "activating"), state
        assert time.monotonic() < deadline, "TP8 x PP8 did not fail within 60 s"
        time.sleep(0.3)
    log = engine_host.run(f"journalctl -u {UNIT} --no-pager -o cat", check=True).stdout
    assert re.search(r"64 GPUs|invalid device ordinal", log), log[-3000:]
    assert "Failed with result 'exit-code'" in log
