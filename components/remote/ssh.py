"""SSH transport: one pinned, reused connection per host, commands with timeouts.

Everything that reaches a remote shell goes through `run`, which takes an argv list and quotes
it (`shlex.join`): no setting is ever interpolated raw into a shell line. File contents travel
by SFTP, never on a command line. Errors name the host and the command's purpose, and never
carry a secret: known secret values are redacted from anything that is raised.

Nothing waits for ever: a command has a deadline for its whole run (not only between two reads),
SFTP requests and channel opens time out, and connecting stops retrying after twice
``connectTimeout``; a host that could not be reached is not tried again by every resource of the
same operation one after the other (the failure is remembered for `FAILURE_MEMORY` seconds).

An answer counts only with its exit status: a channel that ends without one lost its connection
(its output may be cut short), so the command runs again once on a new connection, or fails.
No half-close is sent for a command without input (see `_exec`).

Reads can be started ahead (`prefetch`, see readcache.py): a read-only request (`fetch`, or `run`
with ``read=True``, `read_file`, `stat_mode`, `stat_owner`) takes a prefetched result of the very same request
when there is one; every other command, write or removal first drops what was prefetched of
the host, so nothing read before a change is served after it.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import io
import logging
import os
import posixpath
import secrets
import shlex
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import handoff, readcache


def _lazy_import(name: str):
    """The module, loaded on its first attribute access (importlib's LazyLoader). The Pulumi
    program imports this module only to declare the providers, and never connects: paramiko's
    ~60 ms of imports are paid by the provider process alone, which connects."""
    import importlib.util
    import sys
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


# paramiko imports invoke (a dependency of its own) only to run the `Match exec` lines of an
# ssh_config file, and gpu-serving never reads one: every connection setting is the stack's.
# invoke's import (asyncio, unittest.mock, yaml) was ~0.1 s of every provider process's first
# read (docs/benchmarks.md). Marked absent, paramiko takes its own "no invoke" path; a process
# that loaded invoke already keeps it.
sys.modules.setdefault("invoke", None)
paramiko = _lazy_import("paramiko")
# paramiko's transport thread logs a connection it gives up (a host that sends no SSH banner) with
# its traceback, which lands on the provider's stderr and so in the engine's output (issue 36.12);
# the caller gets the same failure as one line (Unreachable). No handler: nothing of it is printed.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# Seconds between connection attempts: a host rebooting or sshd restarting gets a few tries.
# No attempt starts later than 2 x connectTimeout after the first, so an unreachable host fails
# within about that (each stage of an attempt, TCP, banner, auth, is bounded by connectTimeout).
CONNECT_BACKOFF = (1.0, 3.0)
# A host that could not be reached fails the other resources of the same operation at once
# instead of each one retrying in turn behind the connection lock.
FAILURE_MEMORY = 30.0


class RemoteError(Exception):
    """A remote step failed; the message is safe to show (secrets redacted)."""


# Reads started ahead of the resource that needs them (readcache.py): one store per process.
prefetched = readcache.ReadCache()
# A change of a host also drops what this process would hand to the update (handoff.py).
prefetched.on_change(handoff.recorder.forget_scope)


# The rehearsal hosts' own record of how to reach them (`python -m rehearsal up` writes it).
REHEARSAL_RUN = "/run/gpu-serving/rehearsal"
# Parts of a connection that only name it in messages: never a reason to reconnect or update.
CONNECTION_LABELS = ("entry", "keyFrom", "rehearsal")


def rehearsal_addresses() -> dict[str, str]:
    """Every running rehearsal host's address by name (from the host.json files)."""
    out = {}
    try:
        names = os.listdir(REHEARSAL_RUN)
    except OSError:
        return out
    for name in names:
        info = rehearsal_info(name)
        if info and isinstance(info.get("address"), str):
            out[name] = info["address"]
    return out


def rehearsal_info(name: str) -> Optional[dict]:
    """The running rehearsal host `name` as its host.json says (address, keys), or None."""
    import json
    try:
        with open(posixpath.join(REHEARSAL_RUN, name, "host.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("state") == "running" and info.get("address") else None


def _rehearsal_now(c: dict) -> dict:
    """A rehearsal entry's connection as the host says now. Its host.json on this machine is the
    declaration (the program builds the connection from it), so a rehearsal host rebuilt since the
    last up, with a new host key, address or login key, is read as it is now rather than through
    the state's stale copy."""
    info = rehearsal_info(c["rehearsal"]) if isinstance(c.get("rehearsal"), str) else None
    if info is None or not info.get("host_public_key") or not info.get("private_key"):
        return c
    try:
        with open(info["private_key"]) as f:
            key = f.read()
    except OSError:
        return c
    return {**c, "host": info["address"], "port": int(info.get("port", 22)), "user": info.get("user", "root"),
            "privateKey": key, "hostKey": info["host_public_key"]}


def reach(connection: Any) -> Any:
    """What a connection is compared by in a diff: where and how it connects, not its labels."""
    if not isinstance(connection, dict):
        return connection
    return {k: v for k, v in connection.items() if k not in CONNECTION_LABELS}


def another_machine(old: Any, new: Any) -> bool:
    """Whether two connections reach different machines: another rehearsal host, or another
    address *and* another host key. A machine renumbered keeps its key and one reinstalled
    keeps its address: both are the same machine (an update there); a stack pointed at another
    box is a move (its unit is started there and stopped and removed where it served)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return False
    if old.get("rehearsal") and new.get("rehearsal"):
        return old["rehearsal"] != new["rehearsal"]  # a rebuilt rehearsal host keeps its name
    return old.get("host") != new.get("host") and key_blob(old.get("hostKey", "")) != key_blob(new.get("hostKey", ""))


def key_blob(line: str) -> str:
    """"type base64" of a host key line (a comment dropped), to compare two keys."""
    return " ".join(str(line or "").split()[:2])


def key_fingerprint(line: str) -> str:
    """The key's type and SHA256 fingerprint as `ssh-keygen -l` prints it."""
    import base64
    kind, _, rest = key_blob(line).partition(" ")
    try:
        blob = base64.b64decode(rest, validate=True)
    except ValueError:
        return f"{kind} (not a valid key)"
    return f"{kind} SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class Target:
    """Where and how to reach a host. Built from a provider's props (a plain dict)."""

    host: str
    port: int
    user: str
    private_key: str
    host_key: str
    connect_timeout: float = 15.0
    command_timeout: float = 600.0
    # For messages only: the stack's name for the machine (`hosts[gpu2]`, `gpu-serving:host`)
    # and where the pinned key comes from.
    entry: str = ""
    key_from: str = ""

    @classmethod
    def from_props(cls, props: dict[str, Any], stored: bool = False) -> "Target":
        """`stored`: the props are the state's (a read or a delete), so the key was recorded at
        the last up; messages say so."""
        c = _rehearsal_now(props["connection"])
        key_from = c.get("keyFrom") or "gpu-serving:host.hostKey"
        if stored and not c.get("rehearsal"):
            key_from = f"the stack's state (recorded from {key_from} at the last `pulumi up`)"
        return cls(host=c["host"], port=int(c["port"]), user=c["user"], private_key=c["privateKey"],
                   host_key=c["hostKey"], connect_timeout=float(c.get("connectTimeout", 15)),
                   command_timeout=float(c.get("commandTimeout", 600)), entry=c.get("entry") or "", key_from=key_from)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def named(self) -> str:
        """The label with the stack's name for the machine: `hosts[gpu2] (root@10.0.0.12:22)`."""
        return f"{self.entry} ({self.label})" if self.entry else self.label

    @property
    def key(self) -> tuple:
        return (self.host, self.port, self.user, self.host_key, hashlib.sha256(self.private_key.encode()).hexdigest())


class HostKeyChanged(RemoteError):
    """The host presented another key than the pinned one; nothing was sent to it (the check
    comes before authentication). `presented` is its public key line."""

    def __init__(self, message: str, presented: str = "", pinned: str = ""):
        super().__init__(message)
        self.presented, self.pinned = presented, pinned


class Unreachable(RemoteError):
    """No SSH connection could be opened (refused, no route, no answer within the bound)."""


def redact(text: str, secret_values: Iterable[str]) -> str:
    for value in secret_values:
        if value and len(value) >= 4:
            text = text.replace(value, "[secret]")
    return text


def _load_key(pem: str) -> paramiko.PKey:
    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(pem))
        except Exception as exc:  # wrong type: try the next one
            errors.append(type(exc).__name__)
    # Never include the key text: it is the secret.
    raise RemoteError("the SSH private key (gpu-serving:sshPrivateKey or host.privateKeyPath) could not be read "
                      "as an ed25519, ECDSA or RSA key")


def _fingerprint(key: paramiko.PKey) -> str:
    import base64
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


_clients: dict[tuple, paramiko.SSHClient] = {}
_failures: dict[tuple, tuple[float, RemoteError]] = {}
_lock = threading.Lock()
# One lock per host for opening its connection: a fleet's hosts connect at the same time (under
# `_lock` alone, each waited for the handshakes of the hosts before it: issue 18).
_connecting: dict[tuple, threading.Lock] = {}
_local = threading.local()
# Counts connections opened by this process (the benchmarks read sshd's logs for the truth).
opened_connections = 0


def _connect(t: Target) -> paramiko.SSHClient:
    global opened_connections
    kind, _, b64 = t.host_key.partition(" ")
    try:
        pinned = paramiko.PKey.from_type_string(kind, __import__("base64").b64decode(b64.split()[0]))
    except Exception:
        raise RemoteError(f"gpu-serving:host.hostKey for {t.label} is not a valid public key line") from None
    client = paramiko.SSHClient()
    hostname = t.host if t.port == 22 else f"[{t.host}]:{t.port}"
    client.get_host_keys().add(hostname, pinned.get_name(), pinned)
    # Only the pinned key is accepted; an unknown host is refused, never learned.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    pkey = _load_key(t.private_key)
    last: Optional[Exception] = None
    start = time.monotonic()
    attempts = 0
    for pause in (*CONNECT_BACKOFF, None):
        attempts += 1
        sock = None
        try:
            sock = _tcp(t)
            # `timeout` still bounds the key exchange (paramiko's start_client) with our socket.
            client.connect(t.host, port=t.port, username=t.user, pkey=pkey, sock=sock, timeout=t.connect_timeout,
                           banner_timeout=t.connect_timeout, auth_timeout=t.connect_timeout,
                           channel_timeout=t.connect_timeout, allow_agent=False, look_for_keys=False)
            transport = client.get_transport()
            transport.set_keepalive(15)
            opened_connections += 1
            return client
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyChanged(
                f"host identity check failed for {t.named}: it presented {exc.key.get_name()} {_fingerprint(exc.key)}, "
                f"but {t.key_from} pins {pinned.get_name()} {_fingerprint(pinned)}. Refusing to connect: nothing was "
                "sent to it. Another machine answers there, or this one was reinstalled or got a new key: verify the "
                "key on the machine itself, then set it as the entry's hostKey (docs/real-hosts.md: \"A host reinstalled\").",
                presented=f"{exc.key.get_name()} {exc.key.get_base64()}", pinned=t.host_key) from None
        except paramiko.AuthenticationException:
            raise RemoteError(f"SSH authentication as {t.user} failed on {t.label}: the key is not authorized there") from None
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
            last = exc
            client.close()
            if sock is not None:
                sock.close()
            if pause is None or time.monotonic() - start + pause >= 2 * t.connect_timeout:
                break
            time.sleep(pause)
    # A fleet's entry first (`hosts[gpu3]: `), as the providers' own errors name it.
    raise Unreachable(f"{t.entry + ': ' if t.entry.startswith('hosts[') else ''}"
                      f"cannot reach {t.label} over SSH after {attempts} attempt(s) in {time.monotonic() - start:.0f} s "
                      f"({type(last).__name__}: {last or 'no answer'}); is the host up and sshd listening?")


def _tcp(t: Target) -> socket.socket:
    """The TCP connection an SSH connection runs over, with Nagle's algorithm off.

    paramiko writes each SSH message as it is made (a channel open, an exec request, an SFTP
    request) and waits for the answer; with Nagle on, a small write that follows one the host has
    not acknowledged yet waits for that acknowledgement, which the host delays by ~40 ms (delayed
    ACK). Measured on a rehearsal host: a `true` over an open connection took 48 ms with Nagle and
    3 ms without it, the connection itself 69 ms and 23 ms (docs/benchmarks.md, eleventh round).
    Interactive OpenSSH clients turn it off for the same reason."""
    sock = socket.create_connection((t.host, t.port), timeout=t.connect_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        raise
    return sock


def _pin(t: Target) -> Optional[tuple]:
    return getattr(_local, "pins", {}).get(t.key)


def load() -> None:
    """Load paramiko now (it is imported lazily, see `client`): the provider process does it while
    the program is still loading (remote/ahead.py), not in its first read."""
    with _lock:
        paramiko.Transport  # noqa: B018


def client(t: Target, remember: Callable[[RemoteError], bool] = lambda exc: True) -> paramiko.SSHClient:
    """The cached connection to `t`, opened (or reopened, if it dropped) on demand; inside
    `one_connection`, the connection pinned there or an error. A failure to connect is kept for
    FAILURE_MEMORY seconds, and raised again to the next callers, when `remember(error)`."""
    pin = _pin(t)
    if pin is not None:
        c, during = pin
        tr = c.get_transport()
        if tr is None or not tr.is_active():
            raise RemoteError(f"the SSH connection to {t.label} was lost during {during}; what it held (the host's "
                              "switch lock) went with it, so nothing more was done. Run `pulumi up` again to converge.")
        return c
    with _lock:
        # paramiko loads on its first attribute access (LazyLoader), which Python 3.11 does not
        # make safe for several threads at once: load it here, before the hosts connect in parallel.
        paramiko.Transport  # noqa: B018
        connecting = _connecting.setdefault(t.key, threading.Lock())
    with connecting:
        with _lock:
            c = _clients.get(t.key)
            failed = _failures.get(t.key)
        if c is not None:
            tr = c.get_transport()
            if tr is not None and tr.is_active():
                return c
            c.close()
        if failed and time.monotonic() - failed[0] < FAILURE_MEMORY:
            raise copy.copy(failed[1])  # the same kind of error: a changed host key stays one
        try:
            c = _connect(t)
        except RemoteError as exc:
            if remember(exc):
                with _lock:
                    _failures[t.key] = (time.monotonic(), exc)
            raise
        with _lock:
            _failures.pop(t.key, None)
            _clients[t.key] = c
        return c


def connect_ahead(t: Target) -> bool:
    """Open the connection to `t` before any resource asks for it (remote/ahead.py). Whether it
    opened; never raises. Of its failures only "cannot reach" is kept for the reads that follow
    (they would say the same after the same wait); any other (a changed host key, a refused key)
    is theirs to meet again and word: a read names where the key it checks was recorded."""
    try:
        client(t, remember=lambda exc: isinstance(exc, Unreachable))
        return True
    except Exception:  # noqa: BLE001 - the reads connect again and report
        return False


@contextmanager
def one_connection(t: Target, during: str):
    """Run a block of steps over one connection: if it drops, the next step fails with a clear
    error instead of quietly reconnecting. For steps that hold something on the connection (the
    host-wide switch lock is a remote `flock` that lives as long as its channel)."""
    pins = _local.__dict__.setdefault("pins", {})
    outer = pins.get(t.key)
    pins[t.key] = (outer[0], outer[1]) if outer else (client(t), during)
    try:
        yield pins[t.key][0]
    finally:
        if outer is None:
            pins.pop(t.key, None)


def drop(t: Target) -> None:
    with _lock:
        c = _clients.pop(t.key, None)
    if c:
        c.close()


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class _Expired(Exception):
    pass


class _Lost(EOFError):
    """The command's channel closed without an exit status: the connection dropped under it
    (or the command was killed by a signal, which OpenSSH reports as no status paramiko reads).
    Its output may be cut short, so it is never a result: `_run` reconnects and runs it again."""


# What the transport saw (benchmarks and the rehearsal stress test read them): commands that
# lost their connection, the commands run again on a new one, sessions sshd refused (asked again).
counters = {"lost": 0, "retried": 0, "refused": 0}
_counters_lock = threading.Lock()


def _count(name: str) -> None:
    with _counters_lock:
        counters[name] += 1


# sshd refuses channels beyond MaxSessions per connection (OpenSSH's default: 10), and paramiko
# can only report the refusal as a lost connection. A refresh reads every resource at once and
# starts their reads ahead, so the sessions open at the same time on one connection are capped
# here, below that default with room for the switch lock's own channel (providers._lock).
MAX_CHANNELS = 8
# First pause before asking again for a session sshd refused (doubling up to 0.5 s).
REFUSED_PAUSE = 0.02
_channel_slots: dict[tuple, threading.BoundedSemaphore] = {}
_channel_slots_lock = threading.Lock()


def _slots(t: Target) -> threading.BoundedSemaphore:
    with _channel_slots_lock:
        return _channel_slots.setdefault(t.key, threading.BoundedSemaphore(MAX_CHANNELS))


def _open_channel(t: Target, c: paramiko.SSHClient, timeout: float) -> paramiko.Channel:
    """A new session on the connection, once one of its MAX_CHANNELS slots is free; the caller
    gives the slot back with `_close_channel` (exactly once)."""
    transport = c.get_transport()
    if transport is None or not transport.is_active():
        raise EOFError("the connection is closed")
    if not _slots(t).acquire(timeout=timeout):
        raise socket.timeout(f"no free SSH session on the connection within {timeout:g} s")
    try:
        wait = min(timeout, max(t.connect_timeout, 10.0))
        deadline, pause = time.monotonic() + wait, REFUSED_PAUSE
        while True:
            try:
                return transport.open_session(timeout=wait)
            except paramiko.SSHException as exc:
                # An open that sshd answered with a refusal, on a live connection, is not a lost
                # connection: its MaxSessions also counts sessions whose command has exited until
                # sshd has reaped it, so a burst of short commands can meet a refusal under our
                # own cap. (paramiko keeps one refusal per connection: with several opens at once,
                # the others see a bare "Unable to open channel.") Ask again shortly; dropping the
                # connection would cut every other command on it. No answer at all (a timeout, a
                # frozen connection) stays a lost connection: the caller opens a new one.
                refused = isinstance(exc, paramiko.ChannelException) or str(exc) == "Unable to open channel."
                if not refused or not transport.is_active():
                    raise
                if time.monotonic() + pause > deadline:
                    raise paramiko.ChannelException(getattr(exc, "code", 0), getattr(exc, "text", str(exc))) from None
                _count("refused")
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
    except BaseException:
        _slots(t).release()
        raise


def _close_channel(t: Target, chan: paramiko.Channel) -> None:
    try:
        chan.close()
    finally:
        _slots(t).release()


def _exec(t: Target, c: paramiko.SSHClient, command: str, input: Optional[bytes], timeout: float) -> tuple[int, bytes, bytes]:
    """One command with a deadline for its whole run: at the deadline the channel is closed."""
    chan = _open_channel(t, c, timeout)
    expired = threading.Event()

    def expire():
        expired.set()
        chan.close()
    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        chan.settimeout(timeout)
        if input is None:
            # No half-close when there is nothing to send: an EOF sent after a short command's
            # channel was already closed by the server makes OpenSSH drop the whole connection
            # ("ieof packet referred to nonexistent channel"). Stdin is /dev/null instead, so a
            # command that reads it sees its end at once, as it would have seen our EOF.
            chan.exec_command(command + " </dev/null")
        else:
            chan.exec_command(command)
            chan.sendall(input)
            chan.shutdown_write()
        out, err = bytearray(), bytearray()
        for sink, recv in ((out, chan.recv), (err, chan.recv_stderr)):
            while True:
                data = recv(65536)
                if not data:
                    break
                sink += data
        rc = chan.recv_exit_status()
        if rc is None or rc < 0:
            # paramiko's "no status came" (-1): the output read so far may be cut short.
            transport = c.get_transport()
            gone = transport is None or not transport.is_active()
            raise _Lost("the connection dropped" if gone else "the command ended without an exit status")
    except (socket.timeout, paramiko.SSHException, EOFError, OSError) as exc:
        # socket.timeout: no data for `timeout` seconds, i.e. the deadline as well.
        if expired.is_set() or isinstance(exc, socket.timeout):
            raise _Expired() from None
        raise
    finally:
        timer.cancel()
        _close_channel(t, chan)
    if expired.is_set():
        raise _Expired()
    return rc, bytes(out), bytes(err)


def _scope(t: Target) -> tuple:
    """What a change invalidates: the host (whoever logs in to it)."""
    return (t.host, t.port)


def run(t: Target, argv: list[str] | str, *, purpose: str, input: Optional[bytes] = None,
        timeout: Optional[float] = None, check: bool = True, secrets: Iterable[str] = (), read: bool = False,
        reuse: bool = False) -> Result:
    """Run a command on the host. `argv` is quoted; a str is a fixed script of ours (no settings
    inside), run by ``sh -c``. Raises `RemoteError` (or returns the result with check=False).
    `timeout` (default host.commandTimeoutSeconds) bounds the whole run of the command.
    `read`: the command only reads the host, so it may be served by a prefetch of the same
    command line (a failed one, with `check`, runs again); any other command is a change, and
    drops what was prefetched of the host before it runs. `reuse` (a read): its result is
    kept for the next same read of this process until the host changes (readcache.py)."""
    command = shlex.join(argv) if isinstance(argv, list) else "sh -c " + shlex.quote(argv)
    timeout = timeout or t.command_timeout
    scope = _scope(t)
    key = (t.key, "run", command)
    reuse = reuse and read and input is None
    mark = None
    started = None
    if read and input is None:
        hit = prefetched.take_read(scope, key, keep=reuse)
        if hit is not readcache.MISS and not (check and hit[0].rc != 0):
            handoff.recorder.note(t.key, key[1:], hit[1], hit[0])
            return hit[0]
        mark = prefetched.mark(scope) if reuse else None
        started = time.monotonic()
    elif not read:
        prefetched.begin_change(scope)
    try:
        rc, out, err = _run(t, command, input, timeout, purpose)
    finally:
        if read:
            prefetched.touch(scope)
        else:
            prefetched.end_change(scope)
    result = Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))
    if mark is not None and rc == 0:
        prefetched.remember(scope, key, result, mark)
    if started is not None and isinstance(rc, int) and rc >= 0:
        handoff.recorder.note(t.key, key[1:], started, result)
    if check and rc != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise RemoteError(redact(f"{purpose} on {t.label} failed (exit {rc}):\n{tail}", secrets))
    return result


def _run(t: Target, command: str, input: Optional[bytes], timeout: float, purpose: str) -> tuple[int, bytes, bytes]:
    for attempt in range(2):
        c = client(t)
        try:
            rc, out, err = _exec(t, c, command, input, timeout)
            break
        except _Expired:
            raise RemoteError(f"{purpose} on {t.label} did not finish within {timeout:g} s (timed out)") from None
        except paramiko.ChannelException as exc:
            # Refused again and again (see _open_channel) on a live connection: not a lost one.
            raise RemoteError(f"{purpose} on {t.label}: sshd refused a new session ({exc.text or exc.code}); "
                              "is MaxSessions in its sshd_config below 10?") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A connection that died between two commands, or under one (no exit status), is
            # reopened once and the command run again; a second failure is real. Inside
            # one_connection it is not reopened at all (client() says why).
            _count("lost")
            why = str(exc) if isinstance(exc, _Lost) else type(exc).__name__
            if _pin(t) is not None:
                client(t)
                raise RemoteError(f"{purpose} on {t.label}: connection lost ({why})") from None
            drop(t)
            if attempt:
                raise RemoteError(f"{purpose} on {t.label}: connection lost ({why}), twice; "
                                  "no answer was taken from it") from None
            _count("retried")
    return rc, out, err


@contextmanager
def _sftp(t: Target, what: str):
    """An SFTP session whose requests time out (host.commandTimeoutSeconds), as a RemoteError."""
    c = client(t)
    try:
        chan, sftp = _start_sftp(t, c)
    except socket.timeout:
        raise RemoteError(f"{what} on {t.label}: the SFTP session did not open within {t.command_timeout:g} s") from None
    except (paramiko.SSHException, EOFError) as exc:
        if _pin(t) is not None:
            client(t)  # the pinned connection is never dropped here: it holds the lock
        else:
            drop(t)
        raise RemoteError(f"{what} on {t.label}: connection lost ({type(exc).__name__})") from None
    try:
        yield sftp
    except socket.timeout:
        raise RemoteError(f"{what} on {t.label}: no answer within {t.command_timeout:g} s (timed out)") from None
    except (paramiko.SSHException, EOFError) as exc:
        raise RemoteError(f"{what} on {t.label}: connection lost ({type(exc).__name__})") from None
    except OSError as exc:
        if exc.errno is not None:
            raise  # the server's answer about the file (no such file, permission denied, ...)
        raise RemoteError(f"{what} on {t.label}: connection lost ({exc})") from None
    finally:
        _end_sftp(t, chan, sftp)


def _start_sftp(t: Target, c: paramiko.SSHClient) -> tuple[paramiko.Channel, paramiko.SFTPClient]:
    """An SFTP client on a new session of connection `c` (paramiko's own errors; on one, the
    session and its slot are given back). End it with `_end_sftp`."""
    chan = _open_channel(t, c, t.command_timeout)
    try:
        chan.settimeout(t.command_timeout)
        chan.invoke_subsystem("sftp")
        return chan, paramiko.SFTPClient(chan)
    except BaseException:
        _close_channel(t, chan)
        raise


def _end_sftp(t: Target, chan: paramiko.Channel, sftp: paramiko.SFTPClient) -> None:
    try:
        sftp.close()
    finally:
        _close_channel(t, chan)


def _read_bytes(sftp: paramiko.SFTPClient, path: str) -> Optional[bytes]:
    try:
        with sftp.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IOError as exc:
        if getattr(exc, "errno", None) == 2:
            return None
        raise


def _mode(sftp: paramiko.SFTPClient, path: str) -> Optional[int]:
    try:
        return sftp.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def _owner(sftp: paramiko.SFTPClient, path: str) -> Optional[str]:
    try:
        st = sftp.stat(path)
    except FileNotFoundError:
        return None
    return f"{st.st_uid}:{st.st_gid}"


def _sftp_read(t: Target, kind: str, path: str, what: str, read):
    """A read by SFTP, or its prefetched result (the same `kind` of read of the same path)."""
    hit = prefetched.take_read(_scope(t), (t.key, kind, path))
    if hit is not readcache.MISS:
        handoff.recorder.note(t.key, (kind, path), hit[1], hit[0])
        return hit[0]
    started = time.monotonic()
    try:
        with _sftp(t, what) as sftp:
            value = read(sftp, path)
    finally:
        prefetched.touch(_scope(t))
    handoff.recorder.note(t.key, (kind, path), started, value)
    return value


def read_file(t: Target, path: str) -> Optional[bytes]:
    """The file's bytes, or None when it does not exist."""
    return _sftp_read(t, "read_file", path, f"reading {path}", _read_bytes)


def stat_mode(t: Target, path: str) -> Optional[int]:
    return _sftp_read(t, "stat_mode", path, f"reading the mode of {path}", _mode)


def stat_owner(t: Target, path: str) -> Optional[str]:
    """The file's owner as "uid:gid", or None when it does not exist."""
    return _sftp_read(t, "stat_owner", path, f"reading the owner of {path}", _owner)


# $1 directory, $2 name pattern of our temporary files for one target file.
_PREPARE_DIR = 'mkdir -p -- "$1" && find "$1" -maxdepth 1 -name "$2" -type f -mmin +1 -delete'


def write_file(t: Target, path: str, content: bytes, mode: int) -> None:
    """Write atomically: a temporary file in the same directory, chmod, then rename over the
    target, so a dropped connection never leaves a half-written unit or environment file. A
    temporary file left by a write that died (older than a minute: no write in progress) is
    removed by the next write of the same file."""
    prefetched.begin_change(_scope(t))
    try:
        _write_file(t, path, content, mode)
    finally:
        prefetched.end_change(_scope(t))


def _write_file(t: Target, path: str, content: bytes, mode: int) -> None:
    directory = posixpath.dirname(path)
    prefix = f".{posixpath.basename(path)}.gpu-serving-"
    run(t, ["sh", "-c", _PREPARE_DIR, "sh", directory, prefix + "*"], purpose=f"creating {directory}", timeout=60)
    tmp = posixpath.join(directory, prefix + secrets.token_hex(4))
    with _sftp(t, f"writing {path}") as sftp:
        try:
            # Created 0600 first: a secret never sits world-readable, not even for a moment.
            with sftp.open(tmp, "wb") as f:
                f.chmod(0o600)
                f.write(content)
                f.flush()
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except Exception:
            try:
                sftp.remove(tmp)
            except Exception:
                pass
            raise


def remove_file(t: Target, path: str) -> None:
    run(t, ["rm", "-f", "--", path], purpose=f"removing {path}", timeout=60)


def note_change(t: Target) -> None:
    """A change made other than by `run`/`write_file` (the switch lock): drop the prefetched reads."""
    prefetched.clear(_scope(t))


# ---------------------------------------------------------------------------------------------
# Read requests (reads.py) and their prefetch


def fetch(t: Target, request: dict):
    """Run one read request of reads.py: a `Result`, the file's bytes, or its mode (None when
    the file does not exist). Served by a prefetch of the same request when there is one."""
    op = request["op"]
    if op == "run":
        return run(t, list(request["argv"]), purpose=request["purpose"], timeout=float(request["timeout"]),
                   check=bool(request["check"]), read=True, reuse=bool(request.get("reuse")))
    if op == "read_file":
        return read_file(t, request["path"])
    if op == "stat_mode":
        return stat_mode(t, request["path"])
    if op == "stat_owner":
        return stat_owner(t, request["path"])
    raise ValueError(f"unknown read request {op!r}")


def fetch_first(t: Target, request: dict):
    """`fetch` for the host-facts read: when it was the only read of the host while it ran, it
    opens the prefetch window (readcache.py) for the check of the program's inputs that follows."""
    scope = _scope(t)
    before = prefetched.activity(scope)
    result = fetch(t, request)
    prefetched.open_window(scope, before, own_reads=2)  # its own take and touch
    return result


# The reads of a file (reads.py ops), each on an open SFTP session.
FILE_OPS = {"read_file": _read_bytes, "stat_mode": _mode, "stat_owner": _owner}


def request_key(t: Target, request: dict) -> Optional[tuple]:
    """The key a read request of reads.py is held under (readcache.py), or None if malformed."""
    op = request.get("op") if isinstance(request, dict) else None
    if op == "run" and isinstance(request.get("argv"), list) and request["argv"] \
            and all(isinstance(a, str) for a in request["argv"]):
        return (t.key, "run", shlex.join(request["argv"]))
    if op in FILE_OPS and isinstance(request.get("path"), str):
        return (t.key, op, request["path"])
    return None


def held(t: Target, request: dict) -> bool:
    """A result of this request is held (or being read ahead): reading it needs no connection."""
    key = request_key(t, request)
    return key is not None and prefetched.holds(_scope(t), key)


def seed(t: Target, entries: Iterable[tuple[tuple, float, Any]], max_age: float) -> int:
    """Hold results another process of this run read of `t` (handoff.py); the number held."""
    return sum(prefetched.seed(_scope(t), (t.key, *request), value, started, max_age)
               for request, started, value in entries)


def prefetch_window_open(t: Target) -> bool:
    return prefetched.window_open(_scope(t))


def prefetch(t: Target, requests: list[dict]) -> int:
    """Start read requests (reads.py) at once, on the connection already open to `t`, each on
    its own channel (a file's read and mode share one SFTP session); their results wait in
    `prefetched` for the same request. Returns the number of reads started. Never connects and
    never raises: connecting, and any error, belong to the real reads."""
    try:
        with _lock:
            c = _clients.get(t.key)
        transport = c.get_transport() if c is not None else None
        if transport is None or not transport.is_active() or _pin(t) is not None:
            return 0
        order: list[tuple] = []
        files: dict[str, list[str]] = {}
        for r in requests:
            key = request_key(t, r)  # None: not a well-formed read request
            if key is None:
                continue
            _, op, what = key
            if op == "run":
                order.append(("run", what, float(r.get("timeout") or t.command_timeout)))
            elif what.startswith("/"):
                if what not in files:
                    files[what] = []
                    order.append(("file", what))
                if op not in files[what]:
                    files[what].append(op)
        jobs = []
        for item in order:
            if item[0] == "run":
                _, command, timeout = item
                jobs.append(([(t.key, "run", command)], functools.partial(_prefetch_command, t, c, command, timeout)))
            else:
                path = item[1]
                ops = tuple(files[path])
                jobs.append(([(t.key, op, path) for op in ops], functools.partial(_prefetch_file, t, c, path, ops)))
        return prefetched.prefetch(_scope(t), jobs)
    except Exception:  # noqa: BLE001 - a prefetch that cannot start is only a missed one
        return 0


def _prefetch_command(t: Target, c: paramiko.SSHClient, command: str, timeout: float) -> dict:
    # Over the given connection only: no reconnect, no retry, no drop (the real read does those).
    # A lost connection (`_Lost`: no exit status) raises, so nothing is stored for the real read.
    rc, out, err = _exec(t, c, command, None, timeout)
    if rc is None or rc < 0:  # never a result, whatever _exec becomes
        raise _Lost("no exit status")
    return {(t.key, "run", command): Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))}


def _prefetch_file(t: Target, c: paramiko.SSHClient, path: str, ops: tuple) -> dict:
    chan, sftp = _start_sftp(t, c)
    out: dict = {}
    try:
        for op in ops:
            try:
                out[(t.key, op, path)] = FILE_OPS[op](sftp, path)
            except Exception:  # noqa: BLE001 - left out: the real read makes it, and says why it fails
                pass
    finally:
        _end_sftp(t, chan, sftp)
    return out
