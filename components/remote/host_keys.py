"""A host's identity: the host key pinned for it, the key it presents, and whether two
connections reach one machine.

Only the pinned key is accepted when connecting (ssh.py's `_connect`): an unknown host is
refused, never learned, and the refusal comes before authentication, so nothing is sent to a
machine that answers with another key.
"""
from __future__ import annotations

import base64
import hashlib
import io
from typing import TYPE_CHECKING, Any

from .errors import RemoteError
from .lazy_paramiko import paramiko

if TYPE_CHECKING:
    from .target import Target

# Parts of a connection that only name it in messages: never a reason to reconnect or update.
CONNECTION_LABELS = ("entry", "keyFrom", "rehearsal")


class HostKeyChanged(RemoteError):
    """The host presented another key than the pinned one; nothing was sent to it (the check
    comes before authentication). `presented` is its public key line."""

    def __init__(self, message: str, presented: str = "", pinned: str = ""):
        super().__init__(message)
        self.presented, self.pinned = presented, pinned


def key_blob(line: str) -> str:
    """"type base64" of a host key line (a comment dropped), to compare two keys."""
    return " ".join(str(line or "").split()[:2])


def key_fingerprint(line: str) -> str:
    """The key's type and SHA256 fingerprint as `ssh-keygen -l` prints it."""
    kind, _, rest = key_blob(line).partition(" ")
    try:
        blob = base64.b64decode(rest, validate=True)
    except ValueError:
        return f"{kind} (not a valid key)"
    return f"{kind} SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


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


def pinned_key(t: Target) -> paramiko.PKey:
    """The host key `t` pins, as paramiko compares it."""
    kind, _, b64 = t.host_key.partition(" ")
    try:
        return paramiko.PKey.from_type_string(kind, base64.b64decode(b64.split()[0]))
    except Exception:
        raise RemoteError(f"gpu-serving:host.hostKey for {t.label} is not a valid public key line") from None


def load_key(pem: str) -> paramiko.PKey:
    """The login key (the private key text) as paramiko signs with it."""
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(pem))
        except Exception:  # wrong type: try the next one
            continue
    # Never include the key text: it is the secret.
    raise RemoteError("the SSH private key (gpu-serving:sshPrivateKey or host.privateKeyPath) could not be read "
                      "as an ed25519, ECDSA or RSA key")


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def changed(t: Target, presented: paramiko.PKey, pinned: paramiko.PKey) -> HostKeyChanged:
    """The refusal of a host that presented `presented` where `t` pins `pinned`."""
    return HostKeyChanged(
        f"host identity check failed for {t.named}: it presented {presented.get_name()} {fingerprint(presented)}, "
        f"but {t.key_from} pins {pinned.get_name()} {fingerprint(pinned)}. Refusing to connect: nothing was "
        "sent to it. Another machine answers there, or this one was reinstalled or got a new key: verify the "
        "key on the machine itself, then set it as the entry's hostKey (docs/real-hosts.md: \"A host reinstalled\").",
        presented=f"{presented.get_name()} {presented.get_base64()}", pinned=t.host_key)
