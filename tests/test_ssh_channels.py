"""The transport never has more sessions open on one connection than sshd allows (OpenSSH's
MaxSessions defaults to 10; beyond it sshd refuses the channel, which paramiko can only report as
a lost connection). A refresh reads every resource at once and starts their reads ahead: 20
concurrent commands on one connection must queue, not fail."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from components.remote import ssh


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
        results = list(pool.map(lambda _: ssh._exec(t, c, "true", None, 30), range(20)))
    assert all(rc == 0 for rc, _, _ in results)
    assert c.transport.most == ssh.MAX_CHANNELS  # used to the cap, never past it
    assert not c.transport.open_now
    # Every slot came back: a second burst gets the whole cap again.
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda _: ssh._exec(t, c, "true", None, 30), range(20)))
    assert c.transport.most == ssh.MAX_CHANNELS
