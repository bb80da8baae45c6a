"""Issue 6 against a real host: each rehearsal-engine fault ends in its own named outcome, the
error carries the journal, and the strategy that served before is serving again."""
from __future__ import annotations

import pytest
from pulumi import automation as auto


pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]


@pytest.fixture(scope="module")
def serving(deployment):
    """tp8 deployed and ready: the strategy every failed switch must fall back to."""
    result = deployment.stack("tp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    return deployment


def failed_up(d, name, fault, readiness=None) -> str:
    with pytest.raises(auto.CommandError) as info:
        d.write_fault_stack(name, fault, readiness)
        d.stack(name).up()
    return str(info.value)


def tp8_serving(d) -> bool:
    return d.sh("systemctl is-active sglang-kimi-k2.6-tp8.service").strip() == "active"


def test_crash_during_load(serving):
    text = failed_up(serving, "crash", "crash_during_load")
    assert "readiness: crashed_during_load" in text, text[-4000:]
    assert "Last lines of journalctl -u sglang-kimi-k2.6-crash.service" in text
    assert "Rolled back: restarted sglang-kimi-k2.6-tp8.service" in text
    assert tp8_serving(serving)


def test_hang_times_out_at_the_deadline(serving):
    text = failed_up(serving, "hang", "hang_during_load", {"timeoutSeconds": 6})
    assert "readiness: timed_out" in text and "still loading" in text, text[-4000:]
    assert tp8_serving(serving)


def test_health_failing_after_ready_is_unhealthy(serving):
    text = failed_up(serving, "sick", "health_fail_after_ready")
    assert "readiness: unhealthy" in text, text[-4000:]
    assert tp8_serving(serving)


def test_rewritten_layout_is_a_mismatch(serving):
    text = failed_up(serving, "rewrite", "rewrite_layout")
    assert "readiness: layout_mismatch" in text and "ep_size declared 8" in text, text[-4000:]
    assert tp8_serving(serving)


def test_server_that_died_since_up_is_drift(serving):
    d = serving
    d.sh("systemctl kill --signal=KILL sglang-kimi-k2.6-tp8.service; systemctl stop sglang-kimi-k2.6-tp8.service")
    with pytest.raises(auto.CommandError) as info:
        d.stack("tp8").preview(refresh=True, expect_no_changes=True, diff=True)
    assert "readiness" in str(info.value) or "service" in str(info.value)
    result = d.stack("tp8").up(refresh=True)
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
