"""A host whose SSH host key changed since the last `up`: neither a dead end nor a blind connection.

With `refresh: always` every run first reads each resource with the connection recorded in the
state, so with the key the host had at the last `up`. A machine reinstalled (or given a new key)
presents another one: the read connects to nobody (the key is checked before anything is sent)
and, instead of failing the whole run, records the key the host presented (`hostKeyPresented`)
and reads nothing. The check of the program's inputs (the engine's Check, which follows the
refresh and gets the refreshed state as `olds`) then decides, before any command:

- the declared `hostKey` is the key the host presents (the operator verified it and set it, or a
  rehearsal host printed it): the connection is a change in the diff, and the update connects
  with the declared key, pinned as always, and puts everything back;
- the declared key is still the old one, or a third one: the run stops with the identity error,
  naming both keys, where each comes from and the fleet entry. Nothing is read or changed.

So a key that is neither the state's nor the declared one is never accepted: every connection
pins exactly one key (ssh._connect), and this record only ever leads to a connection pinned to
the declared one. A connection to another address than the state's is not judged by a key seen
at the old one: the update connects to the declared address with the declared key.
"""
from __future__ import annotations

import functools
import sys
import threading

from pulumi.dynamic import ReadResult

from . import ssh

PRESENTED = "hostKeyPresented"

_said: set[tuple] = set()
_said_lock = threading.Lock()


def _say_once(key: tuple, message: str) -> None:
    # Every resource of the host reads and diffs: one line per host and run is enough.
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    print(message, file=sys.stderr, flush=True)


def _named(c: dict) -> str:
    try:
        port = int(c.get("port"))  # a number comes back from the engine as a float
    except (TypeError, ValueError):
        port = c.get("port")
    where = f"{c.get('user')}@{c.get('host')}:{port}"
    return f"{c['entry']} ({where})" if c.get("entry") else where


def checked_read(read):
    """Wrap a provider's `read`: a host presenting another key than the state's is recorded,
    not read (see the module's docstring); a read that connects clears an earlier record."""
    @functools.wraps(read)
    def wrapper(self, id, props):
        props = {k: v for k, v in props.items() if k != PRESENTED}
        try:
            return read(self, id, props)
        except ssh.HostKeyChanged as exc:
            c = props.get("connection") or {}
            _say_once(("read", ssh.key_blob(exc.presented), ssh.key_blob(exc.pinned)),
                      f"{_named(c)}: the host presents another SSH host key, {ssh.key_fingerprint(exc.presented)}, "
                      f"than the one the stack's state recorded at the last `pulumi up` "
                      f"({ssh.key_fingerprint(exc.pinned)}); nothing was read from it. If the declared "
                      f"{c.get('keyFrom') or 'hostKey'} is the new key, this run connects with it; otherwise it stops.")
            outs = {**props, PRESENTED: ssh.key_blob(exc.presented)}
            # In the inputs too: the engine's Check gets the refreshed inputs as `olds`.
            return ReadResult(id_=id, outs=outs, inputs=dict(outs))
    return wrapper


def check(olds: dict, news: dict) -> None:
    """Before anything connects, with the program's inputs (`news`) and the refreshed state
    (`olds`): raise the identity error when the host presented a key (recorded by the read) that
    the declaration does not pin. Not in the diff: the engine also diffs the refreshed outputs
    against the stored inputs to show a refresh, and that diff cannot be told apart from the
    program's when the declared key is still the old one."""
    presented = olds.get(PRESENTED)
    old, new = olds.get("connection"), news.get("connection")
    if not presented or not isinstance(old, dict) or not isinstance(new, dict) or new.get("unavailable"):
        return
    if (str(new.get("host")), str(new.get("port"))) != (str(old.get("host")), str(old.get("port"))):
        return  # another address: the update connects there, pinned to the declared key
    declared = ssh.key_blob(new.get("hostKey"))
    stored = ssh.key_blob(old.get("hostKey"))
    entry, key_from = new.get("entry") or "gpu-serving:host", new.get("keyFrom") or "the declared hostKey"
    if declared == ssh.key_blob(presented):
        _say_once(("diff", declared, stored),
                  f"{_named(new)}: connecting with the declared key, {ssh.key_fingerprint(declared)} ({key_from}), which "
                  f"the host presents; the stack's state still had {ssh.key_fingerprint(stored)} from the last `pulumi up`.")
        return
    same = "is still that old key" if declared == stored else f"pins a third key, {ssh.key_fingerprint(declared)}"
    if new.get("rehearsal"):
        fix = (f"The rehearsal host's own record is stale: `python -m rehearsal restart {new['rehearsal']}` boots it "
               "with the key it printed, or rebuild it (down, up) and run `pulumi up` again.")
    else:
        fix = (f"If this machine was reinstalled or given a new key, verify the key on the machine itself (its console: "
               f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then set it as {entry}.hostKey; the next "
               "`pulumi up` connects with it and repairs the host (README: \"A host reinstalled\").")
    raise ssh.RemoteError(
        f"host identity check failed for {_named(new)}: it presents {ssh.key_fingerprint(presented)}, but the key the "
        f"stack's state recorded at the last `pulumi up` is {ssh.key_fingerprint(stored)}, and {key_from} {same}. "
        f"Refusing to connect: nothing was read from it or sent to it. {fix}")


def guarded(cls):
    """Class decorator for a provider: its `read` records a changed host key (`checked_read`),
    and its `check` (its own or the inherited one) runs `check` first."""
    cls.read = checked_read(cls.read)
    inner = cls.check

    @functools.wraps(inner)
    def checked(self, olds, news):
        check(olds or {}, news or {})
        return inner(self, olds, news)
    cls.check = checked
    return cls
