"""The router's pure parts (components/core/router.py) on data files under tests/data/router/:
the pinned wheel set, the unit (golden file), GET /workers as smg 1.13.0 answers it, the readiness
verdict, in-flight requests from SGLang's /metrics, and when a run says it switches (only when a
switch is planned). The roll's order: tests/test_roll_cases.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.core import router as R
from components.core.config import ROUTER_VERSIONS, parse_settings
from components.core.errors import ConfigError
from components.core.switch import switch_planned
from components.serving_unit import SwitchNotice

from .casedata import update_golden

DATA = Path(__file__).parent / "data" / "router"


def test_every_offered_version_has_its_pinned_wheels():
    assert R.pinned_versions() == sorted(ROUTER_VERSIONS)
    for version in ROUTER_VERSIONS:
        specs = R.pins(version)
        assert specs[0] == f"smg=={version}"
        assert all("==" in s for s in specs) and len({s.split("==")[0].lower() for s in specs}) == len(specs)


def test_unknown_version_names_the_setting():
    with pytest.raises(ConfigError) as exc:
        R.pins("0.0.1")
    assert exc.value.errors[0].setting == "gpu-serving:router.version"


@pytest.mark.parametrize("case", sorted(DATA.glob("unit-*.yaml")), ids=lambda p: p.stem)
def test_router_unit_matches_its_golden_file(case):
    doc = yaml.safe_load(case.read_text())
    settings = parse_settings("tp8", {**doc["config"], "strategy": {"tpSize": 8}})
    text = R.render_unit(settings, doc["workers"])
    golden = case.with_suffix(".service")
    if update_golden():
        golden.write_text(text)
    assert text == golden.read_text()
    # The key is never in the unit: only the variable systemd fills from the 0600 file.
    assert "${%s}" % R.KEY_VARIABLE in text and "admin:" not in text
    assert R.MARKER_KEY + "=gpu-serving-router" in text and "X-GpuServing-Stack" not in text
    # Every strategy stack renders the same router unit.
    other = parse_settings("pp8", {**doc["config"], "strategy": {"ppSize": 8}})
    assert R.render_unit(other, doc["workers"]) == text


def test_environment_file_holds_the_key_entry_and_refuses_a_bad_key_without_quoting_it():
    key = "k" * 32
    assert R.render_environment(key).splitlines()[-1] == f"{R.KEY_VARIABLE}=gpu-serving:gpu-serving:admin:{key}"
    for bad in ("short", "a" * 20 + ":b", "a" * 20 + "\nX=1", "a" * 20 + " b"):
        with pytest.raises(ConfigError) as exc:
            R.render_environment(bad)
        assert bad not in str(exc.value) and exc.value.errors[0].setting == "gpu-serving:routerAdminKey"


@pytest.mark.parametrize("case", sorted(DATA.glob("workers-*.json")), ids=lambda p: p.stem)
def test_workers_answer_and_readiness(case):
    doc = json.loads(case.read_text())
    workers = R.parse_workers(json.dumps(doc["answer"]))
    assert [[w.url, w.status, w.healthy, w.load, w.strategy] for w in workers] == doc["workers"]
    verdict = R.judge_router(doc["expected"], workers)
    assert verdict.ready is doc["ready"]
    assert doc["reason"] in verdict.reason


def test_a_router_that_does_not_answer_is_not_ready():
    verdict = R.judge_router(["http://a:1"], None, "connection refused")
    assert not verdict.ready and "connection refused" in verdict.reason
    with pytest.raises(ValueError):
        R.parse_workers('{"error": "Missing or invalid Authorization header"}')


# In flight on a server: tests/test_server_metrics.py (cases tests/data/traffic/in-flight.json).


def test_failure_message_names_the_host_and_what_each_host_runs():
    state = R.RollState(switched=["gpu1"], failed="gpu2", reason="the server crashed while loading",
                        not_started=["gpu3"])
    text = state.message("pp8", {"gpu2": "tp8"})
    assert "stopped at host gpu2" in text and "rolled back to tp8" in text
    assert "already switched: gpu1" in text and "gpu3 not switched" in text


def test_in_flight_from_get_load_sums_every_dp_rank():
    assert R.in_flight_from_load((DATA / "get-load-sglang-dp2.json").read_text()) == 6
    assert R.in_flight_from_load('[{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]') == 0
    assert R.in_flight_from_load('{"detail": "Not Found"}') is None
    assert R.in_flight_from_load("not json") is None


def test_local_url_and_http_answer():
    assert R.local_url("0.0.0.0", 30001) == "http://127.0.0.1:30001"
    assert R.local_url("::", 1) == "http://[::1]:1"
    assert R.local_url("10.0.0.5", 2) == "http://10.0.0.5:2"
    assert R.parse_http('202\n{"status":"accepted"}') == (202, '{"status":"accepted"}')
    assert R.parse_http("0\nConnectionRefusedError: [Errno 111]")[0] == 0


@pytest.mark.parametrize("case", yaml.safe_load((DATA / "switch-planned-cases.yaml").read_text()), ids=lambda c: c["why"])
def test_a_switch_is_planned_only_when_the_unit_would_start_or_restart(case):
    assert switch_planned(case["olds"], case["news"]) is case["planned"]


def test_switch_notice_without_a_router_is_all_at_once_and_nothing_for_one_host():
    # Behind a router the line is the roll's order: tests/test_roll_cases.py.
    assert R.switch_notice(["gpu1", "gpu2"], "ep8") == (
        "no router (gpu-serving:router): the hosts whose strategy changes, of gpu1, gpu2, stop at once and switch to "
        "ep8 together; nothing serves on them until they are ready")
    assert R.switch_notice([""], "ep8") is None


def test_the_notice_is_said_once_per_run_and_never_without_text(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr("pulumi.log.info", lambda text, *a, **k: said.append(text))
    notice = SwitchNotice("every host stops at once")
    assert [notice.say(), notice.say()] == [True, False]
    assert said == ["every host stops at once"]
    assert SwitchNotice(None).say() is False and said == ["every host stops at once"]


def test_the_hook_says_it_for_a_planned_switch_only_with_secret_inputs_unwrapped(monkeypatch):
    import pulumi
    import pulumi.runtime.sync_await
    said: list[str] = []
    monkeypatch.setattr("pulumi.log.info", lambda text, *a, **k: said.append(text))
    notice = SwitchNotice("rolling switch")
    serving = {"active": True, "runningServer": "as declared", "configHash": "h1", "declared": {"tp_size": 8}, "execStart": "x"}

    async def call(old_outputs, new_hash):
        # Secret inputs reach a hook as Outputs (made here, in the loop that awaits them).
        new_inputs = {**serving, "configHash": pulumi.Output.secret(new_hash), "connection": {"host": "b"}}
        await notice.maybe_say(pulumi.ResourceHookArgs(urn="u", id="i", name="n", type="t", old_outputs=old_outputs, new_inputs=new_inputs))
    # On the thread's event loop, as the SDK runs a program (not asyncio.run's loop of its own,
    # which it closes: the Outputs made in it stay in the SDK's bookkeeping, and a program run
    # under mocks later in the same process crashed in the interpreter on them).
    loop = pulumi.runtime.sync_await._ensure_event_loop()
    # The no-op update (a changed connection): silent, the secret configHash compared by value.
    loop.run_until_complete(call(serving, "h1"))
    assert said == []
    loop.run_until_complete(call(serving, "h2"))
    assert said == ["rolling switch"]


@pytest.mark.parametrize("case", sorted(DATA.glob("workers-*.json")), ids=lambda p: p.stem)
def test_whether_the_router_routes_to_each_host(case):
    # Issue 36.9: status and the watch say each host's membership (an interrupted roll can leave
    # a ready host out of the router).
    doc = json.loads(case.read_text())
    workers = R.parse_workers(json.dumps(doc["answer"]))
    for url, routed in doc["membership"].items():
        said = R.membership(url, workers, "http://10.213.5.9:30080")
        assert said["in_router"] is routed, (url, said)
        assert "http://10.213.5.9:30080" in said["text"] and url in said["text"]
    assert R.membership("http://a:1", None, "http://r:2", "timed out") == {
        "in_router": None, "text": "the router at http://r:2 was not read: timed out"}


def test_the_workers_are_read_with_the_key_the_router_keeps_in_its_file(tmp_path):
    """WORKERS_ON_HOST_SCRIPT as it runs on the router's host: the key from the 0600 file the
    provider writes (its secret line quoted), sent as the bearer; the key on no command line."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    key = "status-reads-the-key-0123456789"
    seen: list[str] = []

    class Router(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization", ""))
            ok = self.headers.get("Authorization") == f"Bearer {key}"
            body = json.dumps({"workers": [], "total": 0} if ok else {"error": "unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env_file = tmp_path / "router.env"
        env_file.write_text(R.render_environment("x" * 16).splitlines()[0] + f'\n{R.KEY_VARIABLE}="gpu-serving:gpu-serving:admin:{key}"\n')
        argv = ["sh", "-c", R.WORKERS_ON_HOST_SCRIPT, "sh", str(env_file), f"http://127.0.0.1:{server.server_address[1]}/workers",
                sys.executable, R.HTTP_SCRIPT]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert R.parse_http(done.stdout) == (200, '{"workers": [], "total": 0}'), done.stdout + done.stderr
    assert seen == [f"Bearer {key}"] and key not in " ".join(argv)
