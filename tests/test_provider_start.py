"""components/provider_start.py: the program asks the engine for the dynamic provider first thing,
without waiting for the answer, and only inside a real engine run."""
from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from pulumi.runtime import settings
from pulumi.runtime.proto import resource_pb2_grpc

from components import provider_start

ROOT = Path(__file__).resolve().parents[1]


class NotImplementedByTheProvider(grpc.RpcError):
    pass


class HeldMonitor(resource_pb2_grpc.ResourceMonitorStub):
    """The engine's monitor as the program sees it, whose Invoke answers only when released."""

    def __init__(self):  # no channel: only Invoke is called
        self.tokens: list[str] = []
        self.release = threading.Event()

    def Invoke(self, request):
        self.tokens.append(request.tok)
        assert self.release.wait(10)
        raise NotImplementedByTheProvider("Invoke is not implemented by the dynamic provider")


def test_the_call_goes_to_the_dynamic_provider_and_the_program_does_not_wait_for_it(monkeypatch):
    monitor = HeldMonitor()
    monkeypatch.setattr(settings, "get_monitor", lambda: monitor)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    thread = provider_start.start_provider_early()
    assert thread is not None and thread.daemon
    assert thread.is_alive()  # returned while the engine has not answered
    monitor.release.set()
    thread.join(10)
    assert not thread.is_alive()
    assert monitor.tokens == [provider_start.TOKEN]
    assert provider_start.TOKEN.startswith("pulumi-python:dynamic:")  # the package of every gpu-serving resource
    assert failures == []  # "not implemented" is the expected answer, not an error


@pytest.mark.parametrize("monitor", [None, object()], ids=["no engine", "the SDK's mocks"])
def test_nothing_is_called_outside_a_real_engine_run(monkeypatch, monitor):
    monkeypatch.setattr(settings, "get_monitor", lambda: monitor)
    assert provider_start.start_provider_early() is None


def test_the_program_asks_before_it_loads():
    source = (ROOT / "__main__.py").read_text()
    assert source.index("start_provider_early()") < source.index("from components.program import run")
