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
import json
import threading
from typing import Any, Optional

from pulumi.dynamic import ReadResult

from . import rehearsal_adapter, ssh
from .common import connection_of, progress

PRESENTED = "hostKeyPresented"
# A refresh read that cannot reach the state's machine fails the run as it always did, unless
# the stack no longer names that machine (it was pointed at another one, or its fleet entry
# removed): the machine the stack moves off is often a dead one. Then the read records why
# (`hostUnreachable`) and reads nothing, and the deletes there say what they leave behind.
UNREACHABLE = "hostUnreachable"
MARKERS = (PRESENTED, UNREACHABLE)
# The machines (address, port) this run moves off and found unreachable (`left_behind`).
_left: set[tuple[str, str]] = set()
# The host settings of the stack as the engine configured the provider with them: this run's
# (the program's config) in a preview, up, destroy or `refresh --run-program`; the last up's in
# a bare `pulumi refresh`, so that one still fails on an unreachable host.
_declared: dict[str, Any] = {}
HOST_SETTINGS = ("gpu-serving:host", "gpu-serving:hosts", "gpu-serving:router")

_said: set[tuple] = set()
_said_lock = threading.Lock()
# What this run declares, from the engine's Check of every declared resource (which comes before
# any delete of the run, in the same provider process): (connection, "unit" or "path", value).
# A resource renamed by the program (a fleet entry renamed, a stack turned from gpu-serving:host
# into a fleet of that machine) is a new resource taking over the same unit on the same machine,
# and the old one's delete must not stop that unit or remove its file.
_claimed: list[tuple[dict, str, str]] = []
_claimed_lock = threading.Lock()


def _say_once(key: tuple, message: str) -> None:
    # Every resource of the host reads and diffs: one line per host and run is enough.
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    progress(message)


def _named(c: dict) -> str:
    port: Any = c.get("port")
    try:
        port = int(port)  # a number comes back from the engine as a float
    except (TypeError, ValueError):
        pass
    where = f"{c.get('user')}@{c.get('host')}:{port}"
    return f"{c['entry']} ({where})" if c.get("entry") else where


def checked_read(read):
    """Wrap a provider's `read`: a host presenting another key than the state's is recorded,
    not read (see the module's docstring); a read that connects clears an earlier record."""
    @functools.wraps(read)
    def wrapper(self, id, props):
        props = {k: v for k, v in props.items() if k not in MARKERS}
        try:
            return read(self, id, props)
        except ssh.Unreachable as exc:
            c = connection_of(props)
            now = declared_machine(c)
            if now is None:
                raise  # the stack still names this machine (or cannot tell): the run stops, as ever
            _left.add(_where(c))
            instead = f"it now names {now}" if now else "its entry is gone from gpu-serving:hosts"
            _say_once(("moved-off", _where(c)),
                      f"{_named(c)} does not answer ({exc}); the stack no longer names that machine ({instead}), so "
                      "nothing is read there, and what served there cannot be stopped from here. If it comes back, "
                      "it starts that unit again at boot: disable it there (`systemctl disable --now <unit>`).")
            outs = {**props, UNREACHABLE: str(exc)}
            return ReadResult(id_=id, outs=outs, inputs=dict(outs))
        except ssh.HostKeyChanged as exc:
            c = connection_of(props)
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
    unreachable = olds.get(UNREACHABLE)
    if unreachable and isinstance(old, dict) and isinstance(new, dict) and not ssh.another_machine(old, new):
        raise ssh.Unreachable(str(unreachable))  # read as moved off, yet declared here: never carry on
    if not presented or not isinstance(old, dict) or not isinstance(new, dict) or new.get("unavailable"):
        return
    if (str(new.get("host")), str(new.get("port"))) != (str(old.get("host")), str(old.get("port"))):
        return  # another address: the update connects there, pinned to the declared key
    declared = ssh.key_blob(new.get("hostKey") or "")
    stored = ssh.key_blob(old.get("hostKey") or "")
    entry, key_from = new.get("entry") or "gpu-serving:host", new.get("keyFrom") or "the declared hostKey"
    if declared == ssh.key_blob(presented):
        _say_once(("diff", declared, stored),
                  f"{_named(new)}: connecting with the declared key, {ssh.key_fingerprint(declared)} ({key_from}), which "
                  f"the host presents; the stack's state still had {ssh.key_fingerprint(stored)} from the last `pulumi up`.")
        return
    same = "is still that old key" if declared == stored else f"pins a third key, {ssh.key_fingerprint(declared)}"
    if new.get("rehearsal"):
        fix = rehearsal_adapter.stale_record_fix(str(new["rehearsal"]))
    else:
        fix = (f"If this machine was reinstalled or given a new key, verify the key on the machine itself (its console: "
               f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), then set it as {entry}.hostKey; the next "
               "`pulumi up` connects with it and repairs the host (docs/real-hosts.md: \"A host reinstalled\").")
    raise ssh.RemoteError(
        f"host identity check failed for {_named(new)}: it presents {ssh.key_fingerprint(presented)}, but the key the "
        f"stack's state recorded at the last `pulumi up` is {ssh.key_fingerprint(stored)}, and {key_from} {same}. "
        f"Refusing to connect: nothing was read from it or sent to it. {fix}")


def _where(c: dict) -> tuple[str, str]:
    return (str(c.get("host")), str(c.get("port")))


def left_behind(props: dict) -> bool:
    """Whether this run found this resource's machine unreachable and the stack no longer names
    it: its delete there can only say what it leaves (a machine still named fails the run)."""
    c = connection_of(props)
    return bool(c) and UNREACHABLE in props and bool(props[UNREACHABLE]) and _where(c) in _left


def remember_config(config: Any) -> None:
    """The provider's `configure`: keep the stack's host settings (JSON text from the engine)."""
    for key in HOST_SETTINGS:
        value = config.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        if value is not None:
            _declared[key] = value


def declared_machine(c: dict) -> Optional[str]:
    """Where the stack's settings now put the machine of connection `c` (its `entry` label):
    None when that is still this machine or cannot be told (no settings, a state without the
    label); otherwise the other machine in words, or "" when the entry is gone."""
    entry = str(c.get("entry") or "")
    if not _declared or not entry:
        return None
    host = _declared.get("gpu-serving:host")
    host = host if isinstance(host, dict) else {}
    fleet = _declared.get("gpu-serving:hosts")
    now: Any  # the entry's settings as written (a dict, checked below where it may not be)
    if entry == "gpu-serving:host":
        if fleet:
            return ""  # the stack now lists its machines in gpu-serving:hosts instead
        now = host
    elif entry.startswith("hosts[") and entry.endswith("]"):
        named = [h for h in fleet or [] if isinstance(h, dict) and h.get("name") == entry[6:-1]]
        if not named:
            return ""
        now = {**host, **named[0]}
    elif entry == "gpu-serving:router.host":
        router = _declared.get("gpu-serving:router")
        now = router.get("host") if isinstance(router, dict) else None
        if not isinstance(now, dict):
            return ""
    else:
        return None
    target = {"host": now.get("address"), "hostKey": now.get("hostKey") or "", "rehearsal": now.get("rehearsal")}
    if now.get("rehearsal"):
        # Where it runs now, for a state without the label.
        target.update(rehearsal_adapter.machine(str(now["rehearsal"])) or {"host": None, "hostKey": ""})
    if not ssh.another_machine(c, target):
        return None
    return f"the rehearsal host {now['rehearsal']!r}" if now.get("rehearsal") else str(now.get("address"))


def claim(news: dict) -> None:
    """Record the unit and the file a declared resource's inputs name on their machine."""
    c = news.get("connection")
    if not isinstance(c, dict):
        return
    with _claimed_lock:
        for key in ("unit", "path"):
            if isinstance(news.get(key), str):
                _claimed.append((c, key, news[key]))


def claimed_elsewhere(props: dict, key: str) -> bool:
    """Whether another resource this run declares names the same unit (`key` "unit") or file
    ("path") as the state's `props`, on the same machine: then a delete of `props` only forgets
    it (Pulumi creates the new name before it deletes the old one)."""
    c, value = connection_of(props), props.get(key)
    if not c or not isinstance(value, str):
        return False
    with _claimed_lock:
        return any(k == key and v == value and not ssh.another_machine(c, other) for other, k, v in _claimed)


def guarded(cls):
    """Class decorator for a provider: its `read` records a changed host key (`checked_read`),
    and its `check` (its own or the inherited one) runs `check` first."""
    cls.read = checked_read(cls.read)
    cls.configure = lambda self, req: remember_config(req.config)
    inner = cls.check

    @functools.wraps(inner)
    def checked(self, olds, news):
        check(olds or {}, news or {})
        claim(news or {})
        return inner(self, olds, news)
    cls.check = checked
    return cls
