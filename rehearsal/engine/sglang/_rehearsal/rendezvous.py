"""Multi-node rendezvous over the rehearsal network: what torch.distributed's TCP store and NCCL
do between SGLang nodes, reduced to what a deployment can observe.

Node 0 listens on the port of ``--dist-init-addr`` (on every address, as torch's TCPStore server
does) and waits, within the rendezvous window, for every other node to connect and say hello
(its node rank, its layout, its GPUs). Nodes >= 1 connect to it, retrying until the window
closes. Then:

  node 0 -> all: ``go`` (the world's smallest free GPU memory, which sizes every KV pool, as
                 SGLang's distributed memory probe does) or ``refused`` (a layout mismatch);
  all -> node 0: ``loaded`` when their weights are in;
  node 0 -> all: ``serving`` once every node has loaded (ranks >= 1 then open their dummy
                 health server; node 0 warms up and serves).

Every link carries a ping each second; a closed connection or a silence of ``SILENCE_SECONDS``
means the peer is gone (a real NCCL communicator fails the same way when a peer dies), which the
engine turns into a failure and a non-zero exit on whichever side is left.

The wire format is one JSON object per line. Stdlib only; no threads survive the process.
"""
from __future__ import annotations

import json
import queue
import socket
import threading
import time

PING_SECONDS = 1.0
SILENCE_SECONDS = 15.0   # no ping for this long: the peer is gone (its host froze or vanished)
HELLO_SECONDS = 10.0     # a connection that says nothing for this long is not a node
FINISH_SECONDS = 2.0     # a last message (a refusal): how long the peer gets to read it and close


class RendezvousError(Exception):
    """The rendezvous failed; exc_type/message as torch would raise them, note from the rehearsal."""

    def __init__(self, exc_type: str, message: str, note: str = ""):
        super().__init__(message)
        self.exc_type, self.message, self.note = exc_type, message, note


def parse_addr(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (SGLang's --dist-init-addr)."""
    text = (value or "").strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {value!r} is not host:port")
    return host, int(port)


class Link:
    """One node-to-node connection: JSON lines, a ping each second, a reader thread that queues
    every message and notices when the peer goes away."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self.rfile = sock.makefile("rb")
        self.send_lock = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        self.lost = threading.Event()
        self.lost_reason = ""
        self.closed = False
        self.draining = False

    def send(self, obj: dict) -> bool:
        data = (json.dumps(obj) + "\n").encode()
        try:
            with self.send_lock:
                self.sock.sendall(data)
            return True
        except OSError as exc:
            self._lose(f"send failed: {exc}")
            return False

    def read_one(self, timeout: float) -> dict | None:
        """One message, read directly (before the reader thread runs); None on EOF or garbage."""
        self.sock.settimeout(timeout)
        try:
            line = self.rfile.readline()
        except OSError:
            return None
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def start(self, on_lost=None):
        """Read in the background from now on; ping every PING_SECONDS."""
        self.on_lost = on_lost
        self.sock.settimeout(SILENCE_SECONDS)
        threading.Thread(target=self._reader, daemon=True, name=f"rendezvous-read-{self.peer}").start()
        threading.Thread(target=self._pinger, daemon=True, name=f"rendezvous-ping-{self.peer}").start()

    def _reader(self):
        while not self.lost.is_set():
            try:
                line = self.rfile.readline()
            except socket.timeout:
                self._lose(f"no message for {SILENCE_SECONDS:.0f} s")
                return
            except OSError as exc:
                self._lose(f"connection error: {exc}")
                return
            if not line:
                self._lose("the connection was closed")
                return
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "ping" not in obj:
                self.inbox.put(obj)

    def _pinger(self):
        while not self.lost.is_set() and not self.closed and not self.draining:
            if not self.send({"ping": time.time()}):
                return
            self.lost.wait(PING_SECONDS)

    def _lose(self, reason: str):
        if self.lost.is_set() or self.closed:
            return
        self.lost_reason = reason
        self.lost.set()
        callback = getattr(self, "on_lost", None)
        if callback:
            callback(self, reason)

    def wait_for(self, keys: tuple[str, ...], stop: threading.Event, deadline: float | None = None) -> dict | None:
        """The next message carrying one of `keys`; None when the link is lost, stop is set or
        time runs out."""
        while not stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return None
            # What the peer sent before it closed is still read: its last message (a refusal)
            # arrives together with the end of the connection, and the reader thread queues the
            # one before it marks the link lost.
            lost = self.lost.is_set()
            try:
                obj = self.inbox.get_nowait() if lost else self.inbox.get(timeout=0.1)
            except queue.Empty:
                if lost:
                    return None
                continue
            if any(key in obj for key in keys):
                return obj
        return None

    def finish(self, timeout: float):
        """The last message is sent: end our side and wait (up to `timeout`) for the peer to
        close its own. Closing at once, with the peer's pings still unread here, would reset the
        connection, and a reset can take the peer's unread last message with it."""
        self.draining = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        self.lost.wait(timeout)

    def close(self):
        # Shut the socket down first: that wakes the reader thread with EOF (closing the reader
        # file while that thread is inside readline would wait for it forever).
        self.closed = True
        for closer in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                closer()
            except OSError:
                pass


class Server:
    """Node 0's side: listen, gather the other nodes' hellos within the window."""

    def __init__(self, port: int, log):
        self.port, self.log = port, log
        self.sock = None
        self.joined: dict[int, tuple[Link, dict]] = {}
        self.arrivals: queue.Queue = queue.Queue()

    def listen(self):
        # torch's TCPStore server listens on every address, whatever host --dist-init-addr names.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", self.port))
        except OSError as exc:
            sock.close()
            raise RendezvousError(
                "torch.distributed.DistNetworkError",
                f"The server socket has failed to listen on any local network address. port: {self.port}, "
                f"useIpv6: false, code: -{exc.errno}, name: {_errno_name(exc.errno)}, message: "
                f"{(exc.strerror or str(exc)).lower()}",
                f"node 0 cannot open the rendezvous port {self.port} (--dist-init-addr): another process holds it")
        sock.listen(64)
        sock.settimeout(0.2)
        self.sock = sock

    def gather(self, expected: set[int], deadline: float, stop: threading.Event, on_hello) -> set[int]:
        """Accept connections until every node of `expected` said hello or the deadline passes.
        on_hello(node_rank, hello, address) may raise RendezvousError (a mismatch). Returns the
        node ranks still missing."""
        while set(self.joined) < expected and time.monotonic() < deadline and not stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                conn = None
            except OSError:
                conn = None
            if conn is not None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=self._hello, args=(conn, addr[0]), daemon=True).start()
            while True:
                try:
                    link, hello = self.arrivals.get_nowait()
                except queue.Empty:
                    break
                rank = hello.get("node_rank")
                if rank in self.joined:
                    first = self.joined[rank][0].peer
                    link.send({"refused": f"node rank {rank} already joined from {first}"})
                    link.finish(FINISH_SECONDS)
                    link.close()
                    raise RendezvousError("RuntimeError", f"node rank {rank} joined twice (from {first} and {link.peer})",
                                          "two nodes were started with the same --node-rank")
                self.joined[rank] = (link, hello)
                on_hello(rank, hello, link.peer)
        return expected - set(self.joined)

    def _hello(self, conn: socket.socket, address: str):
        link = Link(conn, address)
        hello = link.read_one(HELLO_SECONDS)
        if not hello or not isinstance(hello.get("hello"), dict):
            link.close()  # not a node (a port probe): it does not count
            return
        link.start()  # ping from now on: the node waits for `go` as long as the window lasts
        self.arrivals.put((link, hello["hello"]))

    def links(self) -> list[tuple[int, Link]]:
        return [(rank, link) for rank, (link, _) in sorted(self.joined.items())]

    def broadcast(self, obj: dict):
        for _, link in self.links():
            link.send(obj)

    def broadcast_last(self, obj: dict):
        """`obj` to every node, as the last message: each link then ends cleanly (Link.finish)."""
        self.broadcast(obj)
        deadline = time.monotonic() + FINISH_SECONDS
        for _, link in self.links():
            link.finish(max(0.0, deadline - time.monotonic()))

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None
        for _, link in self.links():
            link.close()


def connect(host: str, port: int, deadline: float, stop: threading.Event, log, window: float) -> Link | None:
    """A node >= 1 connecting to node 0, retrying until the deadline (torch's TCP store client
    retries the same way). None when stopped; RendezvousError when the window closes."""
    tries = 0
    last_note = 0.0
    while not stop.is_set():
        try:
            sock = socket.create_connection((host, port), timeout=2.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Link(sock, f"{host}:{port}")
        except OSError as exc:
            now = time.monotonic()
            if now >= deadline:
                raise RendezvousError(
                    "torch.distributed.DistNetworkError",
                    f"The client socket has timed out after {int(window * 1000)}ms while trying to connect to "
                    f"({host}, {port}).",
                    f"node 0's rendezvous port {host}:{port} did not accept a connection within {window:g} s "
                    f"(last error: {exc})")
            if tries == 0 or now - last_note >= 30:
                log.warning(f"[c10d] TCP client failed to connect/validate to host {host}:{port} - retrying "
                            f"(try={tries}, timeout={int(window * 1000)}ms): {exc}")
                last_note = now
            tries += 1
            stop.wait(min(1.0, max(deadline - now, 0.05)))
    return None


def _errno_name(number) -> str:
    import errno
    return errno.errorcode.get(number or 0, "UNKNOWN")
