"""One readiness report for the wait and the refresh: `probe.wait_ready` (a start, an up that
waits) and `ReadinessProvider._probe` (a refresh's one look) read the same host answer into the
same report (readiness.build_report), but for `seconds_to_ready` (only a start measures it) and
`checked_at`. The host's answer is SNAPSHOT_SCRIPT's, made from the report cases'
/server_info and /v1/models (tests/data/readiness/report)."""
import json

import pytest

from components.core import readiness as R
from components.core.specs import ReadinessDeadlines
from components.remote import providers, ssh, switch_memory
from components.remote import probe

from .casedata import cases

UNIT = "sglang-kimi-k2.6-tp8.service"


def _answer(health: int, info: dict, models: dict) -> str:
    show = f"Id={UNIT}\nActiveState=active\nSubState=running\nMainPID=100\nNRestarts=0\nResult=success\nExecMainStatus=0\n"
    out = show + f"@@health\n{health} 0\n@@ready\n0\n"
    if health == 200:
        out += f"@@server_info\n{json.dumps(info)}\n200\n@@get_server_info\n\n404\n@@models\n{json.dumps(models)}\n200\n"
    return out


class _Answer:
    def __init__(self, stdout):
        self.stdout, self.stderr, self.rc = stdout, "", 0


def _both(monkeypatch, stdout: str, declared: dict) -> tuple[dict, dict]:
    monkeypatch.setattr(ssh, "fetch", lambda t, request: _Answer(stdout))
    monkeypatch.setattr(providers, "_require_target", lambda props, stored=False: "target")
    waited = probe.wait_ready("target", UNIT, bind="0.0.0.0", port=30001, declared=declared,
                              deadlines=ReadinessDeadlines(settle_seconds=0), since=None,
                              baseline=R.UnitState("active", "running", 100, 0), progress=lambda m: None)
    looked = providers.ReadinessProvider()._probe({"unit": UNIT, "bind": "0.0.0.0", "port": 30001, "declared": declared})
    return waited.as_dict(), looked.as_dict()


def _same(waited: dict, looked: dict) -> None:
    assert looked["seconds_to_ready"] is None
    strip = lambda r: {k: v for k, v in r.items() if k not in ("checked_at", "seconds_to_ready")}  # noqa: E731
    assert strip(waited) == strip(looked)


@pytest.mark.parametrize("name,case", [c for c in cases("readiness/report") if "info" in c[1]],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_a_wait_and_a_refresh_of_a_generating_server_give_the_same_report(monkeypatch, name, case):
    waited, looked = _both(monkeypatch, _answer(200, case["info"], case.get("models") or {}), case["declared"])
    _same(waited, looked)
    assert waited["status"] == case["expect"]["status"] and waited["probe"] == "/health_generate + /server_info"


def test_a_wait_and_a_refresh_of_a_server_whose_generation_fails_give_the_same_report(monkeypatch):
    waited, looked = _both(monkeypatch, _answer(500, {}, {}), {"tp_size": 8})
    _same(waited, looked)
    assert waited["status"] == R.UNHEALTHY and "answers 500: generation fails" in waited["reason"]


def test_a_refresh_right_after_this_process_switched_the_unit_takes_the_switchs_check(monkeypatch):
    """During `up` the readiness resource is refreshed when the program registers it, right after
    the switch: the switch's own check stands in for that look (no command on the host), once,
    and only for a short while; any other refresh looks at the host."""
    fetched = []
    stdout = _answer(500, {}, {})
    monkeypatch.setattr(ssh, "fetch", lambda t, request: fetched.append(request) or _Answer(stdout))
    target = ssh.Target.from_props({"connection": {"host": "10.0.0.9", "port": 22, "user": "root", "privateKey": "k",
                                                   "hostKey": "ssh-ed25519 AAAA"}})
    monkeypatch.setattr(providers, "_require_target", lambda props, stored=False: target)
    props = {"unit": UNIT, "bind": "0.0.0.0", "port": 30001, "declared": {}, "connection": {}}
    checked = {"status": R.READY, "reason": "", "checked_at": "2026-12-01T10:00:00+00:00", "seconds_to_ready": 7.5}
    switch_memory.remember_check(target, UNIT, checked)
    read = providers.ReadinessProvider().read("id", props)
    assert fetched == [] and read.outs["status"] == R.READY and read.outs["seconds_to_ready"] == 7.5
    assert read.outs["checked_by"] == providers.CHECKED_BY_START and "status" not in read.inputs
    # Once: the next refresh looks at the host.
    assert providers.ReadinessProvider().read("id", props).outs["status"] == R.UNHEALTHY and len(fetched) == 1
    # Another unit's check, or one older than JUST_CHECKED_SECONDS, is not this look.
    switch_memory.remember_check(target, "other.service", checked)
    providers.ReadinessProvider().read("id", props)
    assert len(fetched) == 2
    switch_memory.remember_check(target, UNIT, checked)
    monkeypatch.setattr(switch_memory, "JUST_CHECKED_SECONDS", -1.0)
    providers.ReadinessProvider().read("id", props)
    assert len(fetched) == 3
