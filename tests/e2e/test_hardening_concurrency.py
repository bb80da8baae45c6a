"""Issue 8, points 5 and 6, for real: two switches at once cannot both start (the host lock
serialises them, the loser waits), and nothing is lost: a failed switch leaves the previous
strategy serving with its unit file byte for byte, a reboot after it brings that strategy back,
and `destroy` of one stack never removes the shared CUDA toolkit, venv, environment file or
another stack's unit. The steps run in order on one host."""
from __future__ import annotations

import json

import pytest
from pulumi import automation as auto

from rehearsal import host as rehearsal
from tests import hardening_support as H

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
STRATEGIES = ("tp8", "ep8", "pp8")
ENV_FILE = "/etc/gpu-serving/kimi-k2.6.env"
# Each switch loads for 6 s: long enough for the other one to be seen waiting for the lock.
LOAD_SECONDS = "6"


@pytest.fixture(scope="module")
def d(tmp_path_factory, rehearsal_host_factory):
    host = rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("hardening-concurrency"), host)
    d.edit_project(lambda c: c["gpu-serving:serving"]["value"]["environment"].update(REHEARSAL_LOAD_SECONDS=LOAD_SECONDS))
    result = d.stack("pp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    return d


def states(d) -> dict[str, str]:
    return H.unit_states(d, STRATEGIES, UNIT)


def serving_one(d) -> str:
    return H.serving_one(d, STRATEGIES, UNIT)


def files(d) -> str:
    """Every unit file and the shared environment file, with their bytes' digests and contents."""
    return d.sh(f"cd /etc/systemd/system && sha256sum sglang-*.service {ENV_FILE} && cat sglang-*.service")


def test_two_switches_at_once_are_serialised_by_the_host_lock(d):
    assert serving_one(d) == "pp8"
    since = float(d.sh("date +%s.%N"))
    outputs: dict[str, list[str]] = {"tp8": [], "ep8": []}
    H.fault_injected("two strategy stacks up-ed at the same time")
    results = H.ups_at_once({name: d.stack(name) for name in outputs}, outputs)
    assert len(results) == 2, results
    # The loser waits for the lock (or, past its wait, fails saying so): never both starting.
    for name, (kind, value, _) in results.items():
        if kind == "error":
            assert "gpu-serving lock" in value, value[-3000:]
    finished = [name for name, r in sorted(results.items(), key=lambda kv: kv[1][2]) if r[0] == "ok"]
    assert finished, results
    # Exactly one strategy serves at the end: the one whose switch finished last.
    assert serving_one(d) == finished[-1], (states(d), finished)
    assert results[finished[-1]][1]["status_when_checked"] == "ready"
    waited = [name for name, lines in outputs.items() if any("waiting for the gpu-serving lock" in x for x in lines)]
    assert len(waited) == 1, waited
    # On the host: the second unit started only after the first one served.
    second = waited[0]
    first = "tp8" if second == "ep8" else "ep8"
    log = d.sh(f"journalctl -o json --no-pager --since @{int(since)} -u {UNIT.format(first)} -u {UNIT.format(second)}")
    events = [json.loads(x) for x in log.splitlines() if x.strip()]

    def when(unit: str, phrase: str) -> float:
        stamps = [int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in events
                  if phrase in e.get("MESSAGE", "") and unit in (e.get("_SYSTEMD_UNIT"), e.get("UNIT"))]
        assert stamps, (unit, phrase)
        return stamps[0]
    assert when(UNIT.format(second), "Started ") > when(UNIT.format(first), "fired up and ready to roll")
    H.fault_survived("two strategy stacks up-ed at the same time")


def test_failed_switch_leaves_the_previous_strategy_serving_and_its_unit_intact(d):
    previous = serving_one(d)
    before = files(d)
    d.write_fault_stack("crash", "crash_during_load")
    H.fault_injected("an engine crash during a switch")
    with pytest.raises(auto.CommandError) as info:
        d.stack("crash").up()
    assert "readiness: crashed_during_load" in str(info.value)
    assert f"Rolled back: restarted {UNIT.format(previous)}" in str(info.value)
    assert serving_one(d) == previous
    crash = UNIT.format("crash")
    assert d.sh(f"systemctl is-active {crash}; systemctl is-enabled {crash} {UNIT.format(previous)}; true").split() == \
        ["inactive", "disabled", "enabled"]
    after = d.sh(f"cd /etc/systemd/system && sha256sum $(ls sglang-*.service | grep -v crash) {ENV_FILE} && "
                 f"cat $(ls sglang-*.service | grep -v crash)")
    assert after == before
    # And it is what a reboot brings back: the failed strategy was not left enabled.
    rehearsal.restart(d.host.name)
    H.wait_for(lambda: d.host.run("curl -sf -o /dev/null --max-time 5 http://127.0.0.1:30001/health_generate").returncode == 0,
               90, interval=1, what="the previous strategy to serve after the reboot")
    assert serving_one(d) == previous and d.sh(f"systemctl is-active {crash}; true").strip() == "inactive"
    H.fault_survived("an engine crash during a switch")


def shared(d) -> str:
    """The shared pieces: the CUDA toolkit, the venv with the engine, the environment file."""
    return d.sh(f"/usr/local/cuda-13.0/bin/nvcc --version | tail -1; "
                f"/root/venv_sglang211/bin/python -c 'import sglang; print(sglang.__version__)'; sha256sum {ENV_FILE}")


def test_destroy_of_one_stack_keeps_shared_installs_and_other_units(d):
    serving = serving_one(d)
    others = [s for s in STRATEGIES if s != serving]
    keep = UNIT.format(others[1])
    before_shared = shared(d)
    assert "rehearsal" in before_shared and "13.0" in before_shared
    show = f"systemctl show -p MainPID -p ActiveEnterTimestamp {UNIT.format(serving)}"
    process = d.sh(show)
    unit_bytes = {u: d.sh(f"sha256sum /etc/systemd/system/{u}") for u in (UNIT.format(serving), keep)}

    # A stack that does not serve: only its unit goes; the serving one is not even restarted.
    d.stack(others[0]).destroy()
    assert d.sh(f"test -e /etc/systemd/system/{UNIT.format(others[0])} && echo present || echo gone").strip() == "gone"
    assert d.sh(show) == process
    assert shared(d) == before_shared
    assert all(d.sh(f"sha256sum /etc/systemd/system/{u}") == digest for u, digest in unit_bytes.items())

    # The serving stack: its unit stops and goes; the other stack's unit and the shared pieces stay.
    d.stack(serving).destroy()
    assert d.sh(f"test -e /etc/systemd/system/{UNIT.format(serving)} && echo present || echo gone").strip() == "gone"
    assert d.sh(f"sha256sum /etc/systemd/system/{keep}") == unit_bytes[keep]
    assert shared(d) == before_shared
    assert d.sh("ls /etc/gpu-serving/crash/").split() == ["kimi-k2.6.env"]
