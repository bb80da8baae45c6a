"""The transport's TCP connection has Nagle's algorithm off (ssh._tcp), and connecting over a
socket of its own keeps every rule of the connection: the pinned host key, the key login, a clear
"cannot reach". Against a real SSH server on loopback (paramiko's server side, in this process):
real key exchange, authentication, channels and exit statuses over a real TCP connection."""
import io
import socket
import threading
import time

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from components.remote import ssh


def new_key() -> tuple[str, paramiko.PKey]:
    """A fresh ed25519 key: (its OpenSSH private key text, the paramiko key)."""
    text = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                      serialization.NoEncryption()).decode()
    return text, paramiko.Ed25519Key.from_private_key(io.StringIO(text))


def public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


class Server(paramiko.ServerInterface):
    """Accepts the one client key; runs nothing, answers every exec with exit status 0 and the
    command echoed back (so a test sees its own command arrive)."""

    def __init__(self, client_key: paramiko.PKey):
        self.client_key = client_key

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = username == "root" and key.asbytes() == self.client_key.asbytes()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        def answer():
            channel.sendall(b"ran: " + command)
            channel.send_exit_status(0)
            # An end of output, not a close: a close can overtake the exec's own reply.
            channel.shutdown_write()

        threading.Thread(target=answer, daemon=True).start()
        return True


def loopback(handle) -> socket.socket:
    """A listening socket on 127.0.0.1 whose connections are given to `handle`, one after another,
    in the listener's own thread, until the listener is closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            handle(conn)

    threading.Thread(target=serve, daemon=True).start()
    return listener


@pytest.fixture
def sshd():
    """(port, host key line, client key text) of a loopback SSH server."""
    _, host_key = new_key()
    client_text, client_key = new_key()
    transports: list = []

    def handle(conn):
        t = paramiko.Transport(conn)
        t.add_server_key(host_key)
        transports.append(t)
        try:
            t.start_server(server=Server(client_key))
        except (paramiko.SSHException, EOFError, OSError):
            pass

    listener = loopback(handle)
    yield listener.getsockname()[1], public_line(host_key), client_text
    listener.close()
    for t in transports:
        t.close()


def target(port: int, host_key: str, private_key: str, timeout: float = 5.0) -> ssh.Target:
    return ssh.Target(host="127.0.0.1", port=port, user="root", private_key=private_key, host_key=host_key,
                      connect_timeout=timeout, command_timeout=10.0)


def test_the_connection_runs_with_nagle_off_and_commands_run_over_it(sshd):
    port, host_key, key = sshd
    client = ssh._connect(target(port, host_key, key))
    try:
        sock = client.get_transport().sock
        # Off: each small SSH message leaves at once instead of waiting ~40 ms for the host's
        # delayed acknowledgement of the one before (ssh._tcp).
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        for n in range(3):  # several channels, one after the other, on the one connection
            chan = client.get_transport().open_session()
            chan.exec_command(f"echo {n}")
            assert chan.recv_exit_status() == 0
            assert chan.makefile("rb").read() == f"ran: echo {n}".encode()
    finally:
        client.close()


def test_another_host_key_is_still_refused_before_the_login_and_the_socket_closed(sshd, monkeypatch):
    port, _, key = sshd
    _, other = new_key()
    made = []
    monkeypatch.setattr(ssh, "_tcp", lambda t, tcp=ssh._tcp: made.append(tcp(t)) or made[-1])
    with pytest.raises(ssh.HostKeyChanged, match="Refusing to connect: nothing was sent to it"):
        ssh._connect(target(port, public_line(other), key))
    # The refused connection's socket is not left open on this side.
    assert len(made) == 1 and made[0].fileno() == -1


def test_a_key_the_host_does_not_accept_is_a_login_failure(sshd):
    port, host_key, _ = sshd
    wrong, _ = new_key()
    with pytest.raises(ssh.RemoteError, match="SSH authentication as root failed on root@127.0.0.1"):
        ssh._connect(target(port, host_key, wrong))


def test_nothing_listening_is_cannot_reach_within_the_bound():
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = spare.getsockname()[1]
    try:
        _, host_key = new_key()
        with pytest.raises(ssh.Unreachable, match=rf"cannot reach root@127.0.0.1:{port} over SSH after \d attempt"):
            ssh._connect(target(port, public_line(host_key), new_key()[0], timeout=0.6))
    finally:
        spare.close()


def test_a_host_that_stalls_in_the_key_exchange_is_cannot_reach_not_a_hang():
    """Connecting over our own socket keeps the key exchange bounded by connectTimeout: a server
    that sends its banner and then says nothing more is given up, not waited for forever."""
    held = []

    def stall(conn):
        held.append(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u6\r\n")  # then silence

    listener = loopback(stall)
    port = listener.getsockname()[1]
    outcome: list = []

    def attempt():
        try:
            ssh._connect(target(port, public_line(new_key()[1]), new_key()[0], timeout=0.5))
        except Exception as exc:  # noqa: BLE001 - the test looks at what it was
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(30)
    took = time.monotonic() - started
    try:
        assert not worker.is_alive(), "connecting to a host stalled in the key exchange did not end"
        # One attempt, no second (it would start after 2 x 0.5 s): counted, not timed.
        assert len(held) == 1, held
        # Bounded by connectTimeout (0.5 s), not by paramiko's own 15 s handshake limit: that bound
        # is the promise, kept below 15 s with room for a loaded machine.
        assert took < 12, took
        assert len(outcome) == 1 and isinstance(outcome[0], ssh.Unreachable), outcome
        assert f"cannot reach root@127.0.0.1:{port} over SSH" in str(outcome[0])
    finally:
        listener.close()
        for conn in held:
            conn.close()
