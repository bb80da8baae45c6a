"""The transport never has more sessions open on one connection than sshd allows (OpenSSH's
MaxSessions defaults to 10; beyond it sshd refuses the channel, which paramiko can only report as
a lost connection). A refresh reads every resource at once and starts their reads ahead: 20
concurrent commands on one connection must queue, not fail."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from components.remote import channels, ssh


class Channel:
    def __init__(self, transport):
        self.transport = transport

    def settimeout(self, _):
        pass

    def exec_command(self, _):
        time.sleep(0.05)  # the command runs a while: the others arrive meanwhile

    def sendall(self, _):
        pass

    def shutdown_write(self):
        pass

    def recv(self, _):
        return b""

    recv_stderr = recv

    def recv_exit_status(self):
        return 0

    def close(self):
        self.transport.closed(self)


class Transport:
    def __init__(self):
        self.lock = threading.Lock()
        self.open_now, self.most = set(), 0

    def is_active(self):
        return True

    def open_session(self, timeout=None):
        chan = Channel(self)
        with self.lock:
            self.open_now.add(chan)
            self.most = max(self.most, len(self.open_now))
            if len(self.open_now) > 10:
                raise ssh.paramiko.SSHException("open failed: Connect failed")  # what sshd does
        return chan

    def closed(self, chan):
        with self.lock:
            self.open_now.discard(chan)


class Client:
    def __init__(self):
        self.transport = Transport()

    def get_transport(self):
        return self.transport


def test_concurrent_commands_on_one_connection_queue_below_maxsessions():
    t = ssh.Target(host="10.9.9.9", port=22, user="root", private_key="k", host_key="ssh-ed25519 AAAA")
    c = Client()
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: channels.execute(t, c, "true", None, 30), range(20)))
    assert all(rc == 0 for rc, _, _ in results)
    assert c.transport.most == channels.MAX_CHANNELS  # used to the cap, never past it
    assert not c.transport.open_now
    # Every slot came back: a second burst gets the whole cap again.
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda _: channels.execute(t, c, "true", None, 30), range(20)))
    assert c.transport.most == channels.MAX_CHANNELS


# --- a connection lost under a command: never a result ------------------------------------------
# The fake below plays a host whose commands answer from a script of outcomes: ("ok", rc, out) or
# ("drop", out): the connection dies after part of the output, before any exit status (paramiko's
# recv_exit_status then returns -1 without raising, as it does when OpenSSH drops a connection).

import pytest  # noqa: E402

from components.core import reads  # noqa: E402
from components.remote import readcache  # noqa: E402


class ScriptedChannel:
    def __init__(self, transport, outcome):
        self.transport, self.outcome = transport, outcome
        self.sent_eof, self.command, self.sent = False, None, b""
        self._out = None

    def settimeout(self, _):
        pass

    def exec_command(self, command):
        self.command = command
        self.transport.commands.append(command)

    def sendall(self, data):
        self.sent += data

    def shutdown_write(self):
        self.sent_eof = True
        self.transport.half_closes += 1

    def recv(self, _):
        if self._out is None:
            self._out = self.outcome[-1]
            if self.outcome[0] == "drop":
                self.transport.active = False
            return self._out
        return b""

    def recv_stderr(self, _):
        return b""

    def recv_exit_status(self):
        return self.outcome[1] if self.outcome[0] == "ok" else -1

    def close(self):
        pass


class ScriptedTransport:
    def __init__(self, outcomes):
        self.outcomes, self.active = outcomes, True
        self.commands, self.half_closes = [], 0

    def is_active(self):
        return self.active

    def open_session(self, timeout=None):
        if not self.active:
            raise EOFError("closed")
        return ScriptedChannel(self, self.outcomes.pop(0))


class ScriptedClient:
    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport

    def close(self):
        self.transport.active = False


@pytest.fixture
def scripted_host(monkeypatch):
    """`connect(*outcomes)`: the connections `ssh` will open, in order, each playing its outcomes."""
    t = ssh.Target(host="192.0.2.44", port=22, user="root", private_key="k", host_key="ssh-ed25519 AAAA")
    pending: list[ScriptedClient] = []
    opened: list[ScriptedClient] = []

    def connect(*outcomes):
        pending.append(ScriptedClient(ScriptedTransport(list(outcomes))))

    def fake_connect(target):
        opened.append(pending.pop(0))
        return opened[-1]

    monkeypatch.setattr(ssh, "_connect", fake_connect)
    monkeypatch.setattr(ssh, "prefetched", readcache.ReadCache())
    monkeypatch.setattr(channels, "counters", {"lost": 0, "retried": 0, "refused": 0})
    monkeypatch.setattr(ssh, "_clients", {})
    monkeypatch.setattr(ssh, "_failures", {})
    return t, connect, opened


FACTS_OUT = b"@@query\n0, GPU-a, NVIDIA H200, 143771, 580.95.05, 00000000:17:00.0\n"


def test_no_half_close_without_input_and_stdin_is_dev_null(scripted_host):
    t, connect, opened = scripted_host
    connect(("ok", 0, b"hi\n"), ("ok", 0, b""))
    assert ssh.run(t, ["echo", "hi"], purpose="saying hi").stdout == "hi\n"
    ssh.run(t, ["sh", "-c", "cat >/tmp/x"], purpose="writing", input=b"data")
    tr = opened[0].transport
    assert tr.commands == ["echo hi </dev/null", "sh -c 'cat >/tmp/x'"]
    assert tr.half_closes == 1  # only the command given input gets its EOF


def test_a_command_whose_connection_dropped_is_run_again_on_a_new_one(scripted_host):
    t, connect, opened = scripted_host
    connect(("drop", FACTS_OUT[:9]))  # cut short inside the first section
    connect(("ok", 0, FACTS_OUT))
    request, = reads.host_facts({"cudaHome": "/usr/local/cuda-13.0"})
    assert request["check"] is False  # even a read that takes any exit code
    got = ssh.fetch(t, request)
    assert got.rc == 0 and got.stdout == FACTS_OUT.decode()
    assert len(opened) == 2 and channels.counters == {"lost": 1, "retried": 1, "refused": 0}


def test_a_second_drop_is_an_error_never_a_result(scripted_host):
    t, connect, opened = scripted_host
    connect(("drop", b"@@query\n"))
    connect(("drop", b"@@query\n"))
    with pytest.raises(ssh.RemoteError, match=r"reading host facts on root@192\.0\.2\.44:22: connection lost "
                                              r"\(the connection dropped\), twice"):
        ssh.run(t, ["true"], purpose="reading host facts", check=False, read=True)
    assert channels.counters == {"lost": 2, "retried": 1, "refused": 0}


def test_no_exit_status_on_a_live_connection_is_not_a_result_either(scripted_host):
    t, connect, opened = scripted_host
    # A live transport but no status (e.g. the command was killed by a signal): run again once.
    connect(("nostatus", b"partial"))
    connect(("ok", 0, b"whole\n"))
    assert ssh.run(t, ["true"], purpose="probing", check=False).stdout == "whole\n"
    assert len(opened) == 2 and channels.counters["retried"] == 1


def test_a_drop_inside_one_connection_stays_an_error(scripted_host):
    t, connect, opened = scripted_host
    connect(("drop", b""))
    with ssh.one_connection(t, "the switch"):
        with pytest.raises(ssh.RemoteError, match="was lost during the switch"):
            ssh.run(t, ["systemctl", "start", "u"], purpose="starting u")
    assert len(opened) == 1  # never reconnected under the pin


def test_a_prefetch_cut_short_is_dropped_and_the_real_read_runs(scripted_host):
    t, connect, opened = scripted_host
    request, = reads.cuda_toolkit({"home": "/usr/local/cuda-13.0", "aptPackage": "cuda-toolkit-13-0"})
    connect(("drop", b"@@nvcc\n"))
    ssh.client(t)
    assert ssh.prefetch(t, [request]) == 1 and ssh.prefetched.wait_idle()
    assert ssh.prefetched.held(ssh._scope(t)) == []  # nothing stored
    connect(("ok", 0, b"@@nvcc\nrelease 13.0, V13.0.88\n"))
    assert "release 13.0" in ssh.fetch(t, request).stdout
    assert len(opened) == 2


@pytest.mark.parametrize("rc", [-1, None])
def test_the_store_never_keeps_a_result_without_an_exit_status(rc):
    cache = readcache.ReadCache()
    cache.prefetch("h", [(["k"], lambda: {"k": ssh.Result(rc, "@@query\n", "")})])
    assert cache.wait_idle() and cache.take("h", "k") is readcache.MISS
    cache.prefetch("h", [(["k"], lambda: {"k": ssh.Result(0, "@@query\n", "")})])
    assert cache.wait_idle() and cache.take("h", "k").rc == 0


WHOLE_FACTS = (FACTS_OUT + b"@@smi\n@@topo\n\tGPU0\tCPU Affinity\nGPU0\t X \t0-31\n@@nvcc\n@@rc=127\n@@fitness\n@@rc=9\n"
               b"@@iommu\n@@nccl\n@@os\n"
               b"PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n@@kernel\n6.1.0\n@@end\n")


def _facts_props(t):
    return {"connection": {"host": t.host, "port": t.port, "user": t.user, "privateKey": t.private_key,
                           "hostKey": t.host_key}, "cudaHome": "/usr/local/cuda-13.0", "expect": {}}


def test_host_facts_read_through_a_drop_sees_the_gpus(scripted_host):
    from components.remote import providers
    t, connect, opened = scripted_host
    connect(("drop", WHOLE_FACTS[:40]))
    connect(("ok", 0, WHOLE_FACTS))
    facts, drift = providers.HostFactsProvider()._read(_facts_props(t))
    assert facts["gpu_count"] == 1 and facts["problems"] == [] and drift == {}  # no baseline on the host: no drift


def test_host_facts_cut_short_with_an_exit_status_is_refused_not_zero_gpus(scripted_host):
    from components.remote import providers
    t, connect, opened = scripted_host
    connect(("ok", 0, WHOLE_FACTS[:WHOLE_FACTS.index(b"@@smi")]))
    with pytest.raises(ssh.RemoteError, match=r"reading host facts on root@192\.0\.2\.44:22 \(exit 0\): the host-facts "
                                              r"answer was cut short: it ends before its section\(s\) smi, topo"):
        providers.HostFactsProvider()._read(_facts_props(t))


def test_a_session_sshd_refuses_is_asked_again_on_the_same_connection(scripted_host, monkeypatch):
    t, connect, opened = scripted_host
    connect(("ok", 0, b"x\n"))
    tr_open = ScriptedTransport.open_session
    refusals = [2]

    def refusing(self, timeout=None):
        if refusals[0]:
            refusals[0] -= 1
            raise ssh.paramiko.ChannelException(2, "open failed")  # what sshd answers past MaxSessions
        return tr_open(self, timeout)
    monkeypatch.setattr(ScriptedTransport, "open_session", refusing)
    assert ssh.run(t, ["echo", "x"], purpose="x").stdout == "x\n"
    assert len(opened) == 1 and channels.counters == {"lost": 0, "retried": 0, "refused": 2}


def test_a_session_refused_until_the_deadline_is_an_error_that_keeps_the_connection(scripted_host, monkeypatch):
    t, connect, opened = scripted_host
    t = ssh.Target(**{**t.__dict__, "connect_timeout": 0.1})
    connect()

    def refusing(self, timeout=None):
        raise ssh.paramiko.ChannelException(2, "open failed")
    monkeypatch.setattr(ScriptedTransport, "open_session", refusing)
    monkeypatch.setattr(ssh, "_connect", lambda target: opened.append(ScriptedClient(ScriptedTransport([]))) or opened[-1])
    with pytest.raises(ssh.RemoteError, match="sshd refused a new session \\(open failed\\); is MaxSessions"):
        ssh.run(t, ["true"], purpose="probing", timeout=0.3)
    assert len(opened) == 1 and opened[0].transport.active  # not dropped: the others on it go on


def test_a_session_open_that_times_out_is_a_lost_connection_replaced_by_a_new_one(scripted_host, monkeypatch):
    t, connect, opened = scripted_host
    connect()
    connect(("ok", 0, b"fresh\n"))
    tr_open = ScriptedTransport.open_session

    def frozen_first(self, timeout=None):
        if self is opened[0].transport:
            raise ssh.paramiko.SSHException("Timeout opening channel.")  # no answer: not a refusal
        return tr_open(self, timeout)
    monkeypatch.setattr(ScriptedTransport, "open_session", frozen_first)
    assert ssh.run(t, ["echo", "fresh"], purpose="the next command").stdout == "fresh\n"
    assert len(opened) == 2 and channels.counters == {"lost": 1, "retried": 1, "refused": 0}


def test_a_fleets_hosts_connect_at_the_same_time_and_one_host_once(monkeypatch):
    """Opening the connection to one host never waits for another host's handshake (a fleet's
    hosts connect at once: issue 18, point 4), and threads asking for the same host share one
    connection. Each fake handshake waits until the other host's has begun: behind one lock for
    all hosts the barrier breaks."""
    barrier = threading.Barrier(2, timeout=10)
    calls: list[str] = []

    class Live:
        def get_transport(self):
            return self

        def is_active(self):
            return True

        def close(self):
            pass

    def connect(t):
        calls.append(t.host)
        barrier.wait()
        return Live()

    monkeypatch.setattr(ssh, "_connect", connect)
    monkeypatch.setattr(ssh, "_clients", {})
    a, b = (ssh.Target(host=h, port=22, user="root", private_key="k", host_key="x") for h in ("10.0.0.1", "10.0.0.2"))
    with ThreadPoolExecutor(4) as pool:
        clients = list(pool.map(ssh.client, [a, b, a, b]))
    assert sorted(calls) == ["10.0.0.1", "10.0.0.2"]
    assert clients[0] is clients[2] and clients[1] is clients[3] and clients[0] is not clients[1]
