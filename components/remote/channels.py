"""What runs on one open SSH connection: its sessions (channels) under sshd's cap, a command
with a deadline for its whole run, and an SFTP session with the reads of a file.

Nothing here connects, reconnects or retries: ssh.py does, with these as its steps. An answer
counts only with its exit status: a channel that ends without one raises `Lost` (its output may
be cut short). No half-close is sent for a command without input (see `execute`).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .lazy_paramiko import paramiko

if TYPE_CHECKING:
    from .target import Target


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class Expired(Exception):
    """The command's deadline passed: its channel was closed."""


class Lost(EOFError):
    """The command's channel closed without an exit status: the connection dropped under it
    (or the command was killed by a signal, which OpenSSH reports as no status paramiko reads).
    Its output may be cut short, so it is never a result: ssh.py reconnects and runs it again."""


# What the transport saw (benchmarks and the rehearsal stress test read them): commands that
# lost their connection, the commands run again on a new one, sessions sshd refused (asked again).
counters = {"lost": 0, "retried": 0, "refused": 0}
_counters_lock = threading.Lock()


def count(name: str) -> None:
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


def open_channel(t: Target, c: paramiko.SSHClient, timeout: float) -> paramiko.Channel:
    """A new session on the connection, once one of its MAX_CHANNELS slots is free; the caller
    gives the slot back with `close_channel` (exactly once)."""
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
                count("refused")
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
    except BaseException:
        _slots(t).release()
        raise


def close_channel(t: Target, chan: paramiko.Channel) -> None:
    try:
        chan.close()
    finally:
        _slots(t).release()


def execute(t: Target, c: paramiko.SSHClient, command: str, input: Optional[bytes], timeout: float) -> tuple[int, bytes, bytes]:
    """One command with a deadline for its whole run: at the deadline the channel is closed."""
    chan = open_channel(t, c, timeout)
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
            raise Lost("the connection dropped" if gone else "the command ended without an exit status")
    except (socket.timeout, paramiko.SSHException, EOFError, OSError) as exc:
        # socket.timeout: no data for `timeout` seconds, i.e. the deadline as well.
        if expired.is_set() or isinstance(exc, socket.timeout):
            raise Expired() from None
        raise
    finally:
        timer.cancel()
        close_channel(t, chan)
    if expired.is_set():
        raise Expired()
    return rc, bytes(out), bytes(err)


# ---------------------------------------------------------------------------------------------
# SFTP


def start_sftp(t: Target, c: paramiko.SSHClient) -> tuple[paramiko.Channel, paramiko.SFTPClient]:
    """An SFTP client on a new session of connection `c` (paramiko's own errors; on one, the
    session and its slot are given back). End it with `end_sftp`."""
    chan = open_channel(t, c, t.command_timeout)
    try:
        chan.settimeout(t.command_timeout)
        chan.invoke_subsystem("sftp")
        return chan, paramiko.SFTPClient(chan)
    except BaseException:
        close_channel(t, chan)
        raise


def end_sftp(t: Target, chan: paramiko.Channel, sftp: paramiko.SFTPClient) -> None:
    try:
        sftp.close()
    finally:
        close_channel(t, chan)


def read_bytes(sftp: paramiko.SFTPClient, path: str) -> Optional[bytes]:
    try:
        with sftp.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IOError as exc:
        if getattr(exc, "errno", None) == 2:
            return None
        raise


def mode(sftp: paramiko.SFTPClient, path: str) -> Optional[int]:
    try:
        return sftp.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def owner(sftp: paramiko.SFTPClient, path: str) -> Optional[str]:
    try:
        st = sftp.stat(path)
    except FileNotFoundError:
        return None
    return f"{st.st_uid}:{st.st_gid}"


# The reads of a file (reads.py ops), each on an open SFTP session.
FILE_OPS = {"read_file": read_bytes, "stat_mode": mode, "stat_owner": owner}
