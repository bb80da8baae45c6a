"""The test run on two workers (scripts/test: pytest-xdist, --dist loadfile) keeps what one
process gave: the hardening summary adds up every worker's figures, and one worker's start does
not take the other's rehearsal hosts for abandoned."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests import conftest
from tests import hardening_support as H


@pytest.fixture
def fresh_figures(monkeypatch):
    monkeypatch.setattr(H, "FIGURES", H.Figures())
    return H


def _worker(refused=(), by_pulumi=(), faults=None, outputs=(0, 0), batch=()) -> dict:
    """What one worker hands over: its own figures, counted by the same calls the tests make."""
    saved = copy.deepcopy(H.FIGURES)
    H.FIGURES = H.Figures()
    for case in refused:
        H.refused(case)
    for case in by_pulumi:
        H.refused(case, through_pulumi=True, operations=("preview",))
    for name, survived in (faults or {}).items():
        H.fault_injected(name)
        if survived:
            H.fault_survived(name)
    H.secrets_checked(*outputs)
    if batch:
        H.corpus_batch(*batch)
    config = SimpleNamespace(workeroutput={})
    H.SummaryPlugin().pytest_sessionfinish(SimpleNamespace(config=config))
    H.FIGURES = saved
    return config.workeroutput


def test_the_summary_adds_up_every_workers_figures(fresh_figures):
    a = _worker(refused=["a", "b"], by_pulumi=["b"], faults={"kill": True}, outputs=(10, 0), batch=(1, 2, 3, 4.0))
    b = _worker(refused=["c"], faults={"stall": False}, outputs=(5, 1))
    plugin = H.SummaryPlugin()
    for out in (a, b):
        plugin.pytest_testnodedown(SimpleNamespace(workeroutput=out), None)
    assert H.summary_line() == ("hardening: 3 invalid configs refused (1 through pulumi with 0 host commands: "
                                "1 by preview), 2 faults injected, 1 survived, 1 secrets found in outputs "
                                "(15 outputs checked)")
    assert H.FIGURES.batch == (1, 2, 3, 4.0)


def test_a_worker_that_counted_nothing_changes_nothing(fresh_figures):
    H.refused("x")
    H.SummaryPlugin().pytest_testnodedown(SimpleNamespace(workeroutput={}), None)
    H.SummaryPlugin().pytest_testnodedown(SimpleNamespace(workeroutput=_worker()), None)
    assert H.summary_line().startswith("hardening: 1 invalid configs refused (0 through pulumi")


def test_a_live_worker_is_the_owner_of_its_hosts_and_a_dead_process_is_not(monkeypatch):
    """An execnet worker runs `python -c ...`: its hosts are left alone; a pid that no longer runs,
    or runs something that is not Python, had its hosts taken down."""
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    other = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        from rehearsal import host
        names = [f"pt{worker.pid}a", f"pt{other.pid}", f"pt{dead.pid}-b", f"pt{os.getpid()}c", "default"]
        monkeypatch.setattr(host, "list_hosts", lambda: [SimpleNamespace(name=n) for n in names])
        downed: list[str] = []
        monkeypatch.setattr(host, "down", downed.append)
        conftest._reap_abandoned_test_hosts()
        assert downed == [f"pt{other.pid}", f"pt{dead.pid}-b"]
    finally:
        worker.stdin.close()
        worker.wait()
        other.kill()
        other.wait()
