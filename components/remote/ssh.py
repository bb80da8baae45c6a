"""SSH transport: one pinned, reused connection per host, commands with timeouts.

Everything that reaches a remote shell goes through `run`, which takes an argv list and quotes
it (`shlex.join`): no setting is ever interpolated raw into a shell line. File contents travel
by SFTP, never on a command line. Errors name the host and the command's purpose, and never
carry a secret: known secret values are redacted from anything that is raised.
"""
from __future__ import annotations

import hashlib
import io
import posixpath
import secrets
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import paramiko

# Seconds between connection attempts: a host rebooting or sshd restarting gets a few tries,
# an unreachable host fails within ~ (attempts x connect timeout), never hangs.
CONNECT_BACKOFF = (1.0, 3.0)


class RemoteError(Exception):
    """A remote step failed; the message is safe to show (secrets redacted)."""


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

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> "Target":
        c = props["connection"]
        return cls(host=c["host"], port=int(c["port"]), user=c["user"], private_key=c["privateKey"],
                   host_key=c["hostKey"], connect_timeout=float(c.get("connectTimeout", 15)),
                   command_timeout=float(c.get("commandTimeout", 600)))

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def key(self) -> tuple:
        return (self.host, self.port, self.user, self.host_key, hashlib.sha256(self.private_key.encode()).hexdigest())


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
    raise RemoteError("the SSH private key (gpu-serving:sshPrivateKey or host.privateKeyPath) could not be read as an ed25519, ECDSA or RSA key")


def _fingerprint(key: paramiko.PKey) -> str:
    import base64
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


_clients: dict[tuple, paramiko.SSHClient] = {}
_lock = threading.Lock()
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
    for attempt, pause in enumerate((*CONNECT_BACKOFF, None)):
        try:
            client.connect(t.host, port=t.port, username=t.user, pkey=pkey, timeout=t.connect_timeout,
                           banner_timeout=t.connect_timeout, auth_timeout=t.connect_timeout,
                           allow_agent=False, look_for_keys=False)
            transport = client.get_transport()
            transport.set_keepalive(15)
            opened_connections += 1
            return client
        except paramiko.BadHostKeyException as exc:
            raise RemoteError(
                f"host identity check failed for {t.label}: it presented {exc.key.get_name()} {_fingerprint(exc.key)}, "
                f"but gpu-serving:host.hostKey pins {pinned.get_name()} {_fingerprint(pinned)}. "
                "Refusing to connect (a different machine, or a reinstalled one: verify it, then update hostKey).") from None
        except paramiko.AuthenticationException:
            raise RemoteError(f"SSH authentication as {t.user} failed on {t.label}: the key is not authorized there") from None
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
            last = exc
            if pause is None:
                break
            time.sleep(pause)
    raise RemoteError(f"cannot reach {t.label} over SSH after {len(CONNECT_BACKOFF) + 1} attempts "
                      f"({type(last).__name__}: {last}); is the host up and sshd listening?")


def client(t: Target) -> paramiko.SSHClient:
    """The cached connection to `t`, opened (or reopened, if it dropped) on demand."""
    with _lock:
        c = _clients.get(t.key)
        if c is not None:
            tr = c.get_transport()
            if tr is not None and tr.is_active():
                return c
            c.close()
        c = _connect(t)
        _clients[t.key] = c
        return c


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


def run(t: Target, argv: list[str] | str, *, purpose: str, input: Optional[bytes] = None,
        timeout: Optional[float] = None, check: bool = True, secrets: Iterable[str] = ()) -> Result:
    """Run a command on the host. `argv` is quoted; a str is a fixed script of ours (no settings
    inside), run by ``sh -c``. Raises `RemoteError` (or returns the result with check=False)."""
    command = shlex.join(argv) if isinstance(argv, list) else "sh -c " + shlex.quote(argv)
    timeout = timeout or t.command_timeout
    for attempt in range(2):
        c = client(t)
        try:
            stdin, stdout, stderr = c.exec_command(command, timeout=timeout)
            if input is not None:
                stdin.write(input)
            stdin.channel.shutdown_write()
            out = stdout.read()
            err = stderr.read()
            rc = stdout.channel.recv_exit_status()
            break
        except socket.timeout:
            drop(t)
            raise RemoteError(f"{purpose} on {t.label} did not finish within {timeout:g} s (timed out)") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A connection that died between two commands is reopened once; a second failure is real.
            drop(t)
            if attempt:
                raise RemoteError(f"{purpose} on {t.label}: connection lost ({type(exc).__name__})") from None
    result = Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and rc != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise RemoteError(redact(f"{purpose} on {t.label} failed (exit {rc}):\n{tail}", secrets))
    return result


def read_file(t: Target, path: str) -> Optional[bytes]:
    """The file's bytes, or None when it does not exist."""
    sftp = client(t).open_sftp()
    try:
        with sftp.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IOError as exc:
        if getattr(exc, "errno", None) == 2:
            return None
        raise
    finally:
        sftp.close()


def stat_mode(t: Target, path: str) -> Optional[int]:
    sftp = client(t).open_sftp()
    try:
        return sftp.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None
    finally:
        sftp.close()


def write_file(t: Target, path: str, content: bytes, mode: int) -> None:
    """Write atomically: a temporary file in the same directory, chmod, then rename over the
    target, so a dropped connection never leaves a half-written unit or environment file."""
    directory = posixpath.dirname(path)
    run(t, ["mkdir", "-p", directory], purpose=f"creating {directory}")
    tmp = posixpath.join(directory, f".{posixpath.basename(path)}.gpu-serving-{secrets.token_hex(4)}")
    sftp = client(t).open_sftp()
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
    finally:
        sftp.close()


def remove_file(t: Target, path: str) -> None:
    run(t, ["rm", "-f", path], purpose=f"removing {path}")
