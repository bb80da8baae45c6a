"""Issue 19 part 2, end to end: the drift watch (`python -m components watch --once`, the real CLI
with the real engine through the Automation API) against one rehearsal host whose sshd records
every command it runs. The steps run in order and share the host, as an operator's week would:
clean, a hand edit (reported naming stack, host, file and line; the watch writes nothing on the
host), repaired, a switch (reported as a switch, not an edit), the host powered off (reported,
the tick completes) and back (clean again)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from rehearsal import host as rehearsal_host
from tests import hardening_support as H
from tests.e2e.conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT
# What changes a host; a read never runs one of these (sftp sessions are checked by the files).
WRITE_COMMAND = re.compile(r"\bsystemctl\s+(start|stop|restart|enable|disable|daemon-reload|reload|kill|mask|set-)"
                           r"|\b(flock|mv|cp|install|rm|tee|mkdir|chmod|chown|touch|ln|truncate)\s"
                           r"|\b(pip3?|apt-get|apt|dpkg)\s+(install|uninstall|remove|-i)\b"
                           r"|\bsed\s+-i|>>?\s*(?!/dev/null|&)[/\w]")
# Where a deploy writes (units, environment files, CUDA, the venv, the model cache): unchanged by a tick.
WATCHED_DIRS = ("etc", "opt", "usr/local", "srv", "var/lib/gpu-serving", "root")


class Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def webhook():
    server = HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/gpu-serving"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def d(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    H.install_command_log(host)
    return make_deployment(tmp_path_factory.mktemp("watch"), host)


@pytest.fixture(scope="module")
def state_dir(d):
    return d.project.parent / "watch-state"


def watch_once(d, state_dir, webhook=None) -> tuple[dict, list[str], str]:
    """One tick by the CLI: (status.json, the lines it logged, gpu-serving.prom)."""
    argv = [sys.executable, "-m", "components", "watch", "--stacks", "tp8,ep8", "--once", "--state-dir", str(state_dir)]
    if webhook:
        argv += ["--webhook", webhook]
    done = subprocess.run(argv, cwd=d.project, env=d.env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((state_dir / "status.json").read_text())
    return doc, [ln for ln in done.stdout.splitlines() if ln.startswith("watch: ")], (state_dir / "gpu-serving.prom").read_text()


def entry(doc: dict, stack: str) -> dict:
    s = next(s for s in doc["stacks"] if s["stack"] == stack)
    assert len(s["hosts"]) == 1, s
    return s["hosts"][0]


def metric(prom: str, name: str, stack: str) -> float:
    m = re.search(rf'^{name}{{stack="{stack}",host="[^"]+"}} (\S+)$', prom, re.M)
    assert m, (name, stack, prom)
    return float(m.group(1))


def changed_files(root: Path, since: float) -> list[str]:
    out = []
    for top in WATCHED_DIRS:
        base = root / top
        if not base.exists():
            continue
        for p in base.rglob("*"):
            try:
                if not p.is_symlink() and p.is_file() and p.stat().st_mtime > since:
                    out.append(str(p.relative_to(root)))
            except OSError:
                continue
    return out


def test_a_deployed_stack_is_clean(d, state_dir):
    d.stack("tp8").up(on_output=print)
    d.stack("ep8")  # the stack exists, never deployed
    doc, lines, prom = watch_once(d, state_dir)
    tp8, ep8 = entry(doc, "tp8"), entry(doc, "ep8")
    assert tp8["state"] == "clean" and tp8["drifted"] == [] and tp8["serving_here"], tp8
    assert tp8["ready"] is True and tp8["host_serving"]["stack"] == "tp8"
    assert ep8["state"] == "not deployed" and not ep8["superseded"], ep8
    # Nothing changed but the first recommendation (issue 42: logged when it changes).
    assert [ln for ln in lines if not ln.startswith("watch: recommended: ")] == [], lines
    assert metric(prom, "gpu_serving_drifted_resources", "tp8") == 0
    assert metric(prom, "gpu_serving_ready", "tp8") == 1
    assert abs(float(re.search(r"^gpu_serving_last_check_timestamp_seconds (\S+)$", prom, re.M).group(1)) - time.time()) < 600


def test_the_tick_reads_the_servers_load_recommends_and_rewrites_the_prometheus_targets(d, state_dir):
    """Issue 42: the serving host's /metrics read over SSH each tick, kept as a window in status.json,
    the recommendation with its numbers (logged when it changes, in gpu-serving.prom), and the
    stack's Prometheus target file rewritten in the state directory."""
    before = json.loads((state_dir / "status.json").read_text())["traffic"]
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 200}}).encode()
    url = f"http://{d.host.address}:30001/generate"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    threads = [threading.Thread(target=lambda: opener.open(urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}), timeout=120).read()) for _ in range(3)]
    for th in threads:
        th.start()
    try:
        doc, lines, prom = watch_once(d, state_dir)
    finally:
        for th in threads:
            th.join(120)
    group = next(g for g in doc["traffic"]["groups"] if g["stack"] == "tp8")
    host = entry(doc, "tp8")["host"]
    assert group["hosts"] == [host] and not group["errors"], group
    sample = group["samples"][host]
    assert sample["requests"] is not None and sample["generation_tokens"] is not None, sample
    # Two ticks of samples: the window has both, the second with the tick's length.
    assert len(group["window"]) == len(next(g for g in before["groups"] if g["stack"] == "tp8")["window"]) + 1
    assert group["window"][-1]["seconds"] and group["window"][-1]["hosts"] == 1
    rec = group["recommendation"]
    assert rec["current"] == "tp8" and rec["action"] in ("stay", "switch") and rec["figures"], rec
    assert {f["stack"] for f in rec["figures"]} >= {"tp8", "ep8"}
    assert re.search(rf'^gpu_serving_recommended_strategy{{stack="{rec["recommended"]}",host="{re.escape(host)}",'
                     rf'serving="tp8"}} 1$', prom, re.M), prom
    targets = json.loads((state_dir / "prometheus" / "targets" / "tp8.json").read_text())
    assert targets == [{"targets": [f"{d.host.address}:30001"], "labels": {"role": "server", "host": host}}]


def test_a_hand_edit_is_reported_naming_stack_host_file_and_line_and_the_watch_writes_nothing(d, state_dir, webhook):
    path = UNIT_PATH.format("tp8")
    d.sh(f"sed -i 's/--max-running-requests 64/--max-running-requests 128/' {path}")
    line_no = int(d.sh(f"grep -n -- '--max-running-requests 128' {path} | cut -d: -f1").strip())
    record = H.HostRecord(d.host)
    mark = record.mark()
    since = time.time()
    doc, lines, prom = watch_once(d, state_dir, webhook)
    commands, logins = record.since(mark)
    print("\n".join(lines))
    tp8 = entry(doc, "tp8")
    assert tp8["state"] == "drifted", tp8
    unit_file = [i for i in tp8["drifted"] if i.get("file") == path]
    assert unit_file and any(f"line {line_no}:" in ln and "max-running-requests 128" in ln for ln in unit_file[0]["lines"]), tp8
    edited = [ln for ln in lines if ln.startswith("watch: edited:")]
    # Stack, host, file and line, in one line.
    assert any(f"stack tp8 on {tp8['host']}:" in ln and path in ln and f"line {line_no}:" in ln for ln in edited), lines
    assert metric(prom, "gpu_serving_drifted_resources", "tp8") >= 1
    # The webhook got the same change, as JSON.
    assert Hook.received and any(c["kind"] == "edited" and c["stack"] == "tp8" for c in Hook.received[-1]["changes"])
    # Reads only: the tick connected and ran commands, none of them a write, and no file changed.
    assert logins >= 1 and commands, (logins, commands)
    print(f"the tick ran {len(commands)} commands over {logins} logins")
    writes = [c for c in commands if WRITE_COMMAND.search(c)]
    assert writes == [], writes
    assert changed_files(record.root, since) == []


def test_up_refresh_repairs_and_the_next_tick_is_clean(d, state_dir):
    d.stack("tp8").up(refresh=True, on_output=print)
    doc, lines, prom = watch_once(d, state_dir)
    tp8 = entry(doc, "tp8")
    assert tp8["state"] == "clean" and tp8["drifted"] == [], tp8
    assert any(ln.startswith("watch: clean: stack tp8") for ln in lines), lines
    assert metric(prom, "gpu_serving_drifted_resources", "tp8") == 0


def test_a_switch_by_another_stack_is_reported_as_a_switch_not_an_edit(d, state_dir):
    d.stack("ep8").up(on_output=print)
    doc, lines, prom = watch_once(d, state_dir)
    tp8, ep8 = entry(doc, "tp8"), entry(doc, "ep8")
    assert tp8["state"] == "superseded" and tp8["superseded"] and tp8["drifted"] == [], tp8
    assert tp8["host_serving"]["stack"] == "ep8" and not tp8["serving_here"]
    assert ep8["state"] == "clean" and ep8["serving_here"] and ep8["ready"], ep8
    assert any(ln.startswith("watch: switched: stack tp8") and "superseded" in ln for ln in lines), lines
    assert not [ln for ln in lines if ln.startswith("watch: edited:")], lines
    assert metric(prom, "gpu_serving_superseded", "tp8") == 1
    assert metric(prom, "gpu_serving_drifted_resources", "tp8") == 0


def test_a_stopped_host_is_reported_the_tick_completes_and_after_start_it_is_clean(d, state_dir):
    errors_before = json.loads((state_dir / "status.json").read_text())["check_errors_total"]
    rehearsal_host.stop(d.host.name)
    try:
        started = time.monotonic()
        doc, lines, prom = watch_once(d, state_dir)
        tick_seconds = time.monotonic() - started
        for stack in ("tp8", "ep8"):
            e = entry(doc, stack)
            assert e["state"] == "unreachable" and e["error"], e
            print(f"{stack}: {e['error']}")
            assert metric(prom, "gpu_serving_host_up", stack) == 0
        assert any(ln.startswith("watch: unreachable: stack ep8") for ln in lines), lines
        assert doc["check_errors_total"] == errors_before + 2
        assert f"gpu_serving_check_errors_total {errors_before + 2}" in prom
        print(f"tick with the host off: {tick_seconds:.1f} s")
    finally:
        rehearsal_host.up(d.host.name)
    H.wait_for(lambda: d.sh("systemctl is-active " + UNIT.format("ep8")).strip() == "active", 120, what="ep8 up again")
    doc, lines, prom = watch_once(d, state_dir)
    ep8 = entry(doc, "ep8")
    assert ep8["state"] == "clean" and ep8["error"] is None, ep8
    assert any(ln.startswith("watch: reachable: stack ep8") for ln in lines), lines
    assert metric(prom, "gpu_serving_host_up", "ep8") == 1
