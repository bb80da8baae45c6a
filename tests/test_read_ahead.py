"""Work ahead of the engine's first Read (issue 18): the program's last step names the machines it
declared (provider_start.read_ahead), and the provider process connects and starts their reads
(remote/ahead.py) with the very requests its resources make. What a run with a refused setting
sends (nothing), what a failed early connection leaves for the reads, and the program's side."""
from __future__ import annotations

import json
import threading

import pytest
from google.protobuf import json_format
from pulumi.runtime import settings
from pulumi.runtime.proto import resource_pb2_grpc

from components import provider_start
from components.core import reads
from components.remote import ahead, ssh
from components.remote.providers import HostFactsProvider

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real one\n-----END OPENSSH PRIVATE KEY-----\n"
CONNECTION = {"host": "10.213.7.2", "port": 22, "user": "root", "privateKey": KEY,
              "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDGuLxcYD1bE0y3Bqf0b+8Q5pR1dD7cX1lGH5uQ9jUz1", "entry": "gpu-serving:host"}
PREFETCH = [reads.spec("cuda-toolkit", {"home": "/usr/local/cuda-12.8", "aptPackage": "cuda-toolkit-12-8"}),
            reads.spec("venv-packages", {"path": "/opt/venv"}),
            reads.spec("file", {"path": "/etc/gpu-serving/kimi-k2.6.env"}),
            reads.spec("service", {"unit": "sglang-kimi-k2.6-ep8.service"}),
            reads.spec("readiness", {"unit": "sglang-kimi-k2.6-ep8.service", "bind": "0.0.0.0", "port": 30000})]
PROPS = {"connection": CONNECTION, "cudaHome": "/usr/local/cuda-12.8", "prefetch": PREFETCH}


# ---- the provider's side ---------------------------------------------------------------------

def test_only_its_own_tokens_are_answered(monkeypatch):
    spawned = []
    monkeypatch.setattr(ahead, "_spawn", lambda fn, *a: spawned.append((fn.__name__, a)))
    assert ahead.handle("pulumi-python:dynamic:somethingElse", {}) is None  # the SDK's "not implemented"
    assert ahead.handle(ahead.START, {}) == {}
    hosts = json.dumps([PROPS, {**PROPS, "cudaHome": "/opt/cuda"}])
    assert ahead.handle(ahead.READ_AHEAD, {"hosts": hosts}) == {}
    assert spawned == [("warm_up", ()), ("read_ahead", (PROPS,)), ("read_ahead", ({**PROPS, "cudaHome": "/opt/cuda"},))]


@pytest.mark.parametrize("value, expected", [
    (json.dumps([PROPS]), [PROPS]),
    ({"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": json.dumps([PROPS])}, [PROPS]),
    (json.dumps([PROPS, 3, "x", None]), [PROPS]),
    ("not json", []), (json.dumps({"host": "x"}), []), (None, []), (7, []),
], ids=["json", "still a secret", "junk entries", "not json", "not a list", "missing", "a number"])
def test_the_hosts_sent_are_read_strictly(value, expected):
    assert ahead.hosts_of({"hosts": value} if value is not None else {}) == expected


def test_a_machine_is_read_ahead_with_the_requests_its_resources_make(monkeypatch):
    calls = []
    monkeypatch.setattr(ssh, "connect_ahead", lambda t: calls.append(("connect", t.key)) or True)
    monkeypatch.setattr(ssh, "prefetch", lambda t, requests: calls.append(("prefetch", t.key, requests)) or len(requests))
    started = ahead.read_ahead(PROPS)
    t = ssh.Target.from_props(PROPS)
    assert calls[0] == ("connect", t.key)
    _, key, requests = calls[1]
    assert key == t.key
    # The host-facts resource's own read first (the engine's first Read takes it), then exactly
    # what the later resources read: the same builders, so the keys match the real reads'.
    assert requests[0] == HostFactsProvider.read_requests(PROPS)[0]
    assert requests[1:] == reads.expand(PREFETCH)
    assert started == len(requests) == 1 + len(reads.expand(PREFETCH))


@pytest.mark.parametrize("props", [
    {**PROPS, "connection": {**CONNECTION, "unavailable": "the rehearsal host 'x' is not running"}},
    {**PROPS, "connection": None},
], ids=["rehearsal host not running", "no connection"])
def test_nothing_connects_for_a_machine_that_cannot_be_reached(monkeypatch, props):
    monkeypatch.setattr(ssh, "connect_ahead", lambda t: pytest.fail("connected"))
    assert ahead.read_ahead(props) == 0


def test_no_read_starts_when_the_connection_does_not_open(monkeypatch):
    monkeypatch.setattr(ssh, "connect_ahead", lambda t: False)
    monkeypatch.setattr(ssh, "prefetch", lambda t, r: pytest.fail("prefetched"))
    assert ahead.read_ahead(PROPS) == 0


def test_work_ahead_never_raises_out_of_its_thread(monkeypatch):
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    done = threading.Event()

    def boom():
        done.set()
        raise RuntimeError("no")

    ahead._spawn(boom)
    assert done.wait(5)
    for t in threading.enumerate():
        if t.name == "gpu-serving-ahead":
            t.join(5)
    assert failures == []


# ---- what a failed early connection leaves for the reads (ssh.connect_ahead) ---------------------

@pytest.fixture
def fresh_transport(monkeypatch):
    monkeypatch.setattr(ssh, "_clients", {})
    monkeypatch.setattr(ssh, "_failures", {})
    monkeypatch.setattr(ssh, "_connecting", {})
    monkeypatch.setattr(ssh, "paramiko", type("P", (), {"Transport": object}))
    attempts = []
    return attempts


@pytest.mark.parametrize("error, kept", [
    (ssh.Unreachable("cannot reach root@10.213.7.2:22 over SSH after 3 attempt(s) in 30 s"), True),
    (ssh.HostKeyChanged("host identity check failed for gpu-serving:host"), False),
    (ssh.RemoteError("SSH authentication as root failed on root@10.213.7.2:22"), False),
], ids=["cannot reach: kept", "another host key: the read's own", "key refused: the read's own"])
def test_only_cannot_reach_is_kept_for_the_reads(monkeypatch, fresh_transport, error, kept):
    attempts = fresh_transport

    def connect(t):
        attempts.append(t.key)
        raise error

    monkeypatch.setattr(ssh, "_connect", connect)
    t = ssh.Target.from_props(PROPS)
    assert ssh.connect_ahead(t) is False  # never raises
    with pytest.raises(type(error)) as info:
        ssh.client(t)  # the engine's read
    assert str(info.value) == str(error)
    # Kept: the read gets the same error at once, without waiting out a second attempt. Not kept:
    # the read tries itself and words its own error (a stored key is named as the state's).
    assert len(attempts) == (1 if kept else 2)


def test_an_open_connection_is_the_one_the_reads_use(monkeypatch, fresh_transport):
    class Transport:
        def is_active(self):
            return True

    class Client:
        def get_transport(self):
            return Transport()

    made = []
    monkeypatch.setattr(ssh, "_connect", lambda t: made.append(Client()) or made[-1])
    t = ssh.Target.from_props(PROPS)
    assert ssh.connect_ahead(t) is True
    assert ssh.client(t) is made[0] and len(made) == 1


# ---- the program's side ----------------------------------------------------------------------

class Monitor(resource_pb2_grpc.ResourceMonitorStub):
    def __init__(self):  # no channel: only Invoke is called
        self.requests = []
        self.answered = threading.Event()

    def Invoke(self, request):
        self.requests.append(request)
        self.answered.set()
        return None


def test_the_program_sends_the_machines_as_one_secret(monkeypatch):
    monitor = Monitor()
    monkeypatch.setattr(settings, "get_monitor", lambda: monitor)
    thread = provider_start.read_ahead([PROPS])
    assert thread is not None and thread.daemon
    thread.join(5)
    request, = monitor.requests
    assert request.tok == ahead.READ_AHEAD and request.tok.startswith("pulumi-python:dynamic:")
    args = json_format.MessageToDict(request.args)
    assert args["hosts"]["4dabf18193072939515e22adb298388d"] == "1b47061264138c4ac30d75fd1eb44270"
    # What the provider reads back is exactly what was sent: ports stay integers.
    assert ahead.hosts_of(args) == [PROPS]
    assert isinstance(ahead.hosts_of(args)[0]["connection"]["port"], int)


def test_a_machine_that_cannot_be_sent_fails_nothing(monkeypatch):
    monitor = Monitor()
    monkeypatch.setattr(settings, "get_monitor", lambda: monitor)
    assert provider_start.read_ahead([{**PROPS, "cudaHome": object()}]) is None  # not JSON
    assert monitor.requests == []


def test_nothing_is_sent_for_no_machine_or_outside_an_engine_run(monkeypatch):
    monitor = Monitor()
    monkeypatch.setattr(settings, "get_monitor", lambda: monitor)
    assert provider_start.read_ahead([]) is None
    monkeypatch.setattr(settings, "get_monitor", lambda: object())  # the SDK's mocks
    assert provider_start.read_ahead([PROPS]) is None
    assert monitor.requests == []


HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBk5Cd7Ad55IN5VS2Wro6PHRmPTvaG4gJLQZKW5EjmqI"


def _real_host_config(stack: str, **host) -> dict:
    from tests.test_program_mocks import stack_config
    config = stack_config(stack)
    base = json.loads(config["gpu-serving:host"])
    base.pop("rehearsal", None)
    config["gpu-serving:host"] = json.dumps({**base, "address": "10.213.7.2", "hostKey": HOST_KEY, **host})
    config["gpu-serving:sshPrivateKey"] = KEY
    return config


def _plain(value):
    """A value the mocks recorded, without the secret marking (the provider gets it without)."""
    if isinstance(value, dict) and "4dabf18193072939515e22adb298388d" in value:
        return value["value"]
    return value


def _run_program(stack: str, config: dict):
    """The program under the SDK's mocks, the private key a secret (as `config set --secret`)."""
    from tests.test_program_mocks import run_program
    return run_program(stack, config, ["gpu-serving:sshPrivateKey"])


def test_the_program_names_each_machine_with_its_host_facts_props_last(monkeypatch):
    from pathlib import Path

    from components import program
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    sent = []
    monkeypatch.setattr(program, "read_ahead", sent.append)
    rec = _run_program("ep8", _real_host_config("ep8"))
    (hosts,) = sent
    facts = [{k: _plain(v) for k, v in inputs.items()} for typ, name, inputs in rec.resources if name == "host-facts"]
    assert len(hosts) == len(facts) == 1
    # The props the provider reads ahead with are those the host-facts resource is given: its
    # connection (the key's text from the engine's config), its CUDA home and its prefetch list.
    assert hosts[0]["connection"] == facts[0]["connection"]
    assert hosts[0]["connection"]["privateKey"] == KEY and hosts[0]["connection"]["port"] == 22
    assert hosts[0]["cudaHome"] == facts[0]["cudaHome"] and hosts[0]["prefetch"] == facts[0]["prefetch"]


@pytest.mark.parametrize("bad", [{"port": 0}, {"hostKey": ""}], ids=["a refused setting", "no host key"])
def test_a_program_that_stops_on_its_settings_names_no_machine(monkeypatch, bad):
    from pathlib import Path

    from components import program
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    sent = []
    monkeypatch.setattr(program, "read_ahead", sent.append)
    with pytest.raises(Exception):
        _run_program("ep8", _real_host_config("ep8", **bad))
    assert sent == []
