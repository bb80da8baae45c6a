"""A failed start recorded in the failure ledger (components/remote/ledger_record.py, from the
switch executor's fail()): over the fake transport of tests/test_switch_executor.py, with the
ledger in a file beside a file backend of the test's own. The entry's signature, the stack's last
good start from the service's state, a failed rollback recorded as such, and a ledger that cannot
be reached never changing the failure."""
from __future__ import annotations

import shlex

import pytest

from components.core import ledger as L
from components.core import readiness as R
from components.remote import ledger_record, ledger_store, provider_errors

from ..test_switch_executor import PLANS, Host, run_switch  # noqa: F401 - run_switch is the fixture

CASE = dict(PLANS)["switch-stops-the-serving-one-and-disables-the-rest"]
UNIT = CASE["declared"]["unit"]
ARGV = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.6", "--served-model-name",
        "kimi-k2.6", "--tp-size", "8", "--ep-size", "8", "--mem-fraction-static", "0.92", "--host", "0.0.0.0", "--port", "30000"]
# torch's allocator, as SGLang's scheduler prints it while loading (tests/data/ledger/classify-oom-while-loading-weights.json)
JOURNAL = (b"2026-12-04T10:15:01+0000 gpu1 python3[77]: [2026-12-04 10:15:01 TP0] Load weight begin. avail mem=94.12 GB\n"
           b"2026-12-04T10:15:09+0000 gpu1 python3[77]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}")
    return ledger_store.store_for(f"file://{tmp_path}")


def failed(run_switch, **kw):
    more = {"stack": "ep8", "execStart": shlex.join(ARGV), "hostEntry": "gpu1"}
    return run_switch(CASE, more=more, host=Host(CASE, fail=UNIT, journal=JOURNAL, **kw))


def test_a_failed_start_is_recorded_in_the_ledger(run_switch, ledger):
    ledger_record._LAST_GOOD.clear()
    _, _, _, error, _ = failed(run_switch)
    assert isinstance(error, provider_errors.DeployError) and not isinstance(error, provider_errors.RollbackFailed)
    entry, = ledger.list()
    assert (entry.stack, entry.host, entry.outcome, entry.model, entry.model_path) == \
        ("ep8", "gpu1", R.CRASHED, "kimi-k2.6", "/models/kimi-k2.6")
    assert (entry.error_class, entry.error) == ("out-of-memory", "CUDA out of memory while loading the weights")
    assert entry.journal_line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert (entry.gpu_model, entry.driver_version, entry.sglang_version) == ("NVIDIA H200", "580.95.05", "0.5.23")
    assert entry.flags_hash == L.flags_hash(ARGV) and entry.layout.startswith("tp 8") and entry.flags_changed == ()
    assert run_switch.host.reads == ["fitness if-baseline", "failed start /opt/venv"]
    message = str(error)
    assert message.startswith(f"readiness: {R.CRASHED}: it exited") and "Rolled back: restarted" in message
    assert message.rstrip().endswith(f"Recorded in the failure ledger as entry {entry.id} (CUDA out of memory while loading "
                                     "the weights): `plan` and `preview` of these flags warn before the next start "
                                     f"(`python -m components ledger` lists it; `ledger clear --id {entry.id}` once it is fixed).")
    # What plan, preview and advise then say before the same start (one function, the same words).
    said = ledger_store.warnings_before_start(ARGV)
    assert said == [L.warning(entry)] and said[0].startswith("this layout with these flags crashed on gpu1 on ")


def test_the_flags_that_differ_from_the_stacks_last_good_start(run_switch, ledger):
    good = [("0.88" if a == "0.92" else a) for a in ARGV]
    ledger_record._LAST_GOOD.clear()
    ledger_record.remember_last_good({"stack": "ep8", "unit": UNIT, "hostEntry": "gpu1", "execStart": shlex.join(good),
                                      "readinessReport": {"status": R.READY}})
    # A state whose last start failed is no good start: it never replaces the one that was.
    ledger_record.remember_last_good({"stack": "ep8", "unit": UNIT, "hostEntry": "gpu1", "execStart": shlex.join(ARGV),
                                      "readinessReport": {"status": R.CRASHED}})
    _, _, _, error, _ = failed(run_switch)
    entry, = ledger.list()
    assert entry.flags_changed == ("--mem-fraction-static 0.92 (last good: 0.88)",)
    assert "changed since the last good start: --mem-fraction-static 0.92 (last good: 0.88)" in str(error)
    ledger_record._LAST_GOOD.clear()


def test_a_failed_rollback_is_recorded_as_such(run_switch, ledger):
    _, _, _, error, _ = failed(run_switch, rollback_fails=True)
    assert isinstance(error, provider_errors.RollbackFailed)
    entry, = ledger.list()
    assert entry.outcome == L.ROLLBACK_FAILED and entry.error_class == "out-of-memory"
    assert f"Recorded in the failure ledger as entry {entry.id}" in str(error)
    assert L.warning(entry).startswith("this layout with these flags crashed and its rollback failed on gpu1 on ")


@pytest.mark.parametrize("backend,why", [("s3://bucket/state", "PULUMI_BACKEND_URL is s3: the failure ledger lives beside"),
                                         ("", "PULUMI_BACKEND_URL is (not set)")])
def test_a_ledger_that_cannot_record_never_changes_the_failure(run_switch, monkeypatch, backend, why):
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend)
    _, changes, _, error, _ = failed(run_switch)
    assert isinstance(error, provider_errors.DeployError) and not isinstance(error, provider_errors.RollbackFailed)
    message = str(error)
    assert message.startswith(f"readiness: {R.CRASHED}: it exited") and "Rolled back: restarted" in message
    assert message.rstrip().splitlines()[-1].startswith(f"The failure ledger could not record this start: {why}")
    assert changes[-1] == "start sglang-kimi-k2.6-tp8.service"  # the rollback ran as ever
