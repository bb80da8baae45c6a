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
No half-close is sent for a command without input (see channels.py).

The parts live one floor down: the host key and a machine's identity (host_keys.py), what runs
on one open connection (channels.py), the Target (target.py), the errors (errors.py). Callers
use them through this module (`ssh.Target`, `ssh.RemoteError`, `ssh.key_fingerprint`, ...).

Reads can be started ahead (`prefetch`, see readcache.py): a read-only request (`fetch`, or `run`
with ``read=True``, `read_file`, `stat_mode`, `stat_owner`) takes a prefetched result of the very same request
when there is one; every other command, write or removal first drops what was prefetched of
the host, so nothing read before a change is served after it.
"""
from __future__ import annotations

import copy
import functools
import posixpath
import secrets
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Optional

from . import channels, handoff, host_keys, readcache
from .errors import RemoteError, Unreachable, redact
from .lazy_paramiko import paramiko
from .target import Target
# The transport's one name for callers: they use these as ssh.<name>, wherever they are defined.
from .channels import Result, counters  # noqa: F401
from .host_keys import (CONNECTION_LABELS, HostKeyChanged, another_machine, key_blob,  # noqa: F401
                        key_fingerprint, reach)

# Seconds between connection attempts: a host rebooting or sshd restarting gets a few tries.
# No attempt starts later than 2 x connectTimeout after the first, so an unreachable host fails
# within about that (each stage of an attempt, TCP, banner, auth, is bounded by connectTimeout).
CONNECT_BACKOFF = (1.0, 3.0)
# A host that could not be reached fails the other resources of the same operation at once
# instead of each one retrying in turn behind the connection lock.
FAILURE_MEMORY = 30.0


# Reads started ahead of the resource that needs them (readcache.py): one store per process.
prefetched = readcache.ReadCache()
# A change of a host also drops what this process would hand to the update (handoff.py).
prefetched.on_change(handoff.recorder.forget_scope)


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
    pinned = host_keys.pinned_key(t)
    client = paramiko.SSHClient()
    hostname = t.host if t.port == 22 else f"[{t.host}]:{t.port}"
    client.get_host_keys().add(hostname, pinned.get_name(), pinned)
    # Only the pinned key is accepted; an unknown host is refused, never learned.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    pkey = host_keys.load_key(t.private_key)
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
            raise host_keys.changed(t, exc.key, pinned) from None
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
            rc, out, err = channels.execute(t, c, command, input, timeout)
            break
        except channels.Expired:
            raise RemoteError(f"{purpose} on {t.label} did not finish within {timeout:g} s (timed out)") from None
        except paramiko.ChannelException as exc:
            # Refused again and again (see channels.open_channel) on a live connection: not a lost one.
            raise RemoteError(f"{purpose} on {t.label}: sshd refused a new session ({exc.text or exc.code}); "
                              "is MaxSessions in its sshd_config below 10?") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A connection that died between two commands, or under one (no exit status), is
            # reopened once and the command run again; a second failure is real. Inside
            # one_connection it is not reopened at all (client() says why).
            channels.count("lost")
            why = str(exc) if isinstance(exc, channels.Lost) else type(exc).__name__
            if _pin(t) is not None:
                client(t)
                raise RemoteError(f"{purpose} on {t.label}: connection lost ({why})") from None
            drop(t)
            if attempt:
                raise RemoteError(f"{purpose} on {t.label}: connection lost ({why}), twice; "
                                  "no answer was taken from it") from None
            channels.count("retried")
    return rc, out, err


@contextmanager
def _sftp(t: Target, what: str):
    """An SFTP session whose requests time out (host.commandTimeoutSeconds), as a RemoteError."""
    c = client(t)
    try:
        chan, sftp = channels.start_sftp(t, c)
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
        channels.end_sftp(t, chan, sftp)


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
    return _sftp_read(t, "read_file", path, f"reading {path}", channels.read_bytes)


def stat_mode(t: Target, path: str) -> Optional[int]:
    return _sftp_read(t, "stat_mode", path, f"reading the mode of {path}", channels.mode)


def stat_owner(t: Target, path: str) -> Optional[str]:
    """The file's owner as "uid:gid", or None when it does not exist."""
    return _sftp_read(t, "stat_owner", path, f"reading the owner of {path}", channels.owner)


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


def request_key(t: Target, request: dict) -> Optional[tuple]:
    """The key a read request of reads.py is held under (readcache.py), or None if malformed."""
    op = request.get("op") if isinstance(request, dict) else None
    if op == "run" and isinstance(request.get("argv"), list) and request["argv"] \
            and all(isinstance(a, str) for a in request["argv"]):
        return (t.key, "run", shlex.join(request["argv"]))
    if op in channels.FILE_OPS and isinstance(request.get("path"), str):
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
        jobs: list[readcache.Job] = []
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
    # A lost connection (`channels.Lost`: no exit status) raises, so nothing is stored for the real read.
    rc, out, err = channels.execute(t, c, command, None, timeout)
    if rc is None or rc < 0:  # never a result, whatever execute becomes
        raise channels.Lost("no exit status")
    return {(t.key, "run", command): Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))}


def _prefetch_file(t: Target, c: paramiko.SSHClient, path: str, ops: tuple) -> dict:
    chan, sftp = channels.start_sftp(t, c)
    out: dict = {}
    try:
        for op in ops:
            try:
                out[(t.key, op, path)] = channels.FILE_OPS[op](sftp, path)
            except Exception:  # noqa: BLE001 - left out: the real read makes it, and says why it fails
                pass
    finally:
        channels.end_sftp(t, chan, sftp)
    return out
