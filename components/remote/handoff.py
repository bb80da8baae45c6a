"""The reads of a `pulumi up`'s preview, handed to its update: the host is read once per `up`.

`pulumi up` runs the program twice, the preview and then the update, each with its own provider
process, and with `refresh: always` both read every resource of every host: the same requests,
a second or two apart, answered the same (issue 18: a no-op `up` was two connections and 14
sessions per host, pyinfra's one and 11). Here the preview's provider keeps what its resources
were served and the update's provider starts from it (remote/ahead.py), under readcache.py's
rules plus these:

- only within one `pulumi up`: the file is named after the CLI process that runs both (its PID
  and start time, the parent of the process the engine launched for the provider), and only a
  process whose parent is a `pulumi` executable running `up` writes one; the update takes the
  file of its own CLI and removes it;
- only what the preview's resources were actually served (a prefetch nobody took is left out),
  and nothing read after a change of the host in the preview (none is made there);
- a result is served to the same request of the same target (host, port, user, pinned host key,
  login key) at most MAX_AGE seconds after its read started: an `up` whose operator reads the
  preview for longer before answering "yes" reads the host again. Any change the update makes
  to a host drops what was handed over for it, as it drops prefetched reads;
- the file is encrypted with a key derived from the target's SSH login key (AES-GCM, HKDF with a
  random salt): whoever can read the results from it could read them from the host already. It
  lives in a directory of the user's own (0700, checked, never followed through a symlink).
  Files of a CLI that is gone, or older than a minute, are removed by the next run.

Nothing here raises into a run: a handoff that cannot be written or read is only a missed one,
and the update reads the host as it did before.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Optional

# Seconds from the start of a preview's read to the update's use of its result.
MAX_AGE = 10.0
# Files older than this are removed whatever their CLI (a crashed run's, a clock gone odd).
KEEP_SECONDS = 60.0
_INFO = b"gpu-serving read handoff v1"
_PREFIX = "reads-"


# ---- which `pulumi up` this process belongs to ------------------------------------------------

def _stat_fields(pid: int) -> Optional[list[str]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow its last ")".
    return text.rsplit(")", 1)[1].split()


def _parent(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _started(pid: int) -> Optional[str]:
    fields = _stat_fields(pid)
    return fields[19] if fields else None  # starttime, in clock ticks since boot


def cli_run(pid: Optional[int] = None) -> Optional[tuple[int, str, bool]]:
    """(PID, start time, is an `up`) of the `pulumi` process this provider serves, or None when
    its parent is not a `pulumi` executable (a provider started by a test, or by hand).

    The process the engine launched is this one, or, for a warm-started run, the runner that
    asked the warm process for this copy (gpu-serving-pyrun.py exports its PID)."""
    if pid is None:
        try:
            pid = int(os.environ.get("GPU_SERVING_LAUNCHED_PID") or os.getpid())
        except ValueError:
            return None
    cli = _parent(pid)
    if not cli or cli <= 1:
        return None
    try:
        if os.path.basename(os.readlink(f"/proc/{cli}/exe")) != "pulumi":
            return None
        with open(f"/proc/{cli}/cmdline", "rb") as f:
            args = f.read().split(b"\0")[1:]
    except OSError:
        return None
    started = _started(cli)
    if started is None:
        return None
    return cli, started, any(a in (b"up", b"update") for a in args)


# ---- where the files live ----------------------------------------------------------------------

def directory() -> Optional[str]:
    """The user's own directory for handoff files, made 0700; None when it is not safely ours."""
    base = os.environ.get("GPU_SERVING_HANDOFF_DIR") or f"/tmp/gpu-serving-handoff-{os.getuid()}"
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        return None
    return base


def _target_id(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


def _path(base: str, run: tuple, key: tuple) -> str:
    return os.path.join(base, f"{_PREFIX}{run[0]}-{run[1]}-{_target_id(key)}")


# ---- what is in a file -------------------------------------------------------------------------

def _key(secret: str, salt: bytes, run: tuple) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    info = _INFO + f" {run[0]} {run[1]}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret.encode())


def _encode(value: Any) -> Any:
    if all(hasattr(value, a) for a in ("rc", "stdout", "stderr")):  # a command's result (ssh.Result)
        return {"result": [value.rc, value.stdout, value.stderr]}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    return {"value": value}  # None, a mode (int) or an owner (str)


def _decode(value: Any, make_result: Callable[[int, str, str], Any]) -> Any:
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError("not an encoded read")
    kind, inner = next(iter(value.items()))
    if kind == "result":
        rc, out, err = inner
        return make_result(int(rc), str(out), str(err))
    if kind == "bytes":
        return base64.b64decode(inner)
    if kind == "value" and (inner is None or isinstance(inner, (int, str))):
        return inner
    raise ValueError("not an encoded read")


def seal(secret: str, run: tuple, entries: Iterable[tuple[tuple[Any, ...], float, Any]]) -> bytes:
    """The file's bytes: salt, nonce, then the AES-GCM sealed JSON of (request, started, result)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    body = json.dumps([[list(k), started, _encode(v)] for k, started, v in entries]).encode()
    salt, nonce = os.urandom(16), os.urandom(12)
    return salt + nonce + AESGCM(_key(secret, salt, run)).encrypt(nonce, body, _INFO)


def unseal(secret: str, run: tuple, data: bytes, make_result: Callable[[int, str, str], Any]) -> list[tuple[tuple, float, Any]]:
    """The entries of `seal`'s bytes (a command's result made by `make_result(rc, stdout,
    stderr)`); raises on a wrong key, another run's file, or damage."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    salt, nonce, sealed = data[:16], data[16:28], data[28:]
    body = json.loads(AESGCM(_key(secret, salt, run)).decrypt(nonce, sealed, _INFO))
    return [(tuple(k), float(started), _decode(v, make_result)) for k, started, v in body]


# ---- the preview's side: record what its resources were served --------------------------------

class Recorder:
    """Per provider process: the targets whose served reads are kept for the update, and the
    file of each, rewritten (atomically) whenever one more is served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[tuple, dict] = {}  # target key -> {"secret", "run", "path", "entries"}

    def start(self, key: tuple, secret: str, run: tuple, base: str) -> None:
        with self._lock:
            self._targets.setdefault(key, {"secret": secret, "run": run, "path": _path(base, run, key), "entries": {}})

    def recording(self, key: tuple) -> bool:
        return key in self._targets

    def note(self, key: tuple, request: Hashable, started: Optional[float], value: Any) -> None:
        if started is None or key not in self._targets:
            return
        with self._lock:
            rec = self._targets.get(key)
            if rec is None or rec["entries"].get(request, (None,))[0] == started:
                return
            rec["entries"][request] = (started, value)
            self._write(rec)

    def forget_scope(self, scope: Hashable) -> None:
        """Host `scope` (host, port) changed: nothing read of it before is handed on, through any
        login (the file goes too). A listener of the read store (ssh.prefetched), whose scopes
        are ssh's (host, port) tuples."""
        with self._lock:
            for key in [k for k in self._targets if tuple(k[:2]) == scope]:
                _remove(self._targets.pop(key)["path"])

    @staticmethod
    def _write(rec: dict) -> None:
        try:
            data = seal(rec["secret"], rec["run"], [(k, s, v) for k, (s, v) in rec["entries"].items()])
            tmp = f"{rec['path']}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, rec["path"])
        except Exception:  # noqa: BLE001 - a handoff not written is only a missed one
            pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ---- the update's side ----------------------------------------------------------------------------

def take(key: tuple, secret: str, run: tuple, base: str, now: float,
         make_result: Callable[[int, str, str], Any]) -> list[tuple[tuple, float, Any]]:
    """The preview's entries for target `key` of this run, young enough to serve, and the file
    removed (taken once). [] when there is none or it cannot be read."""
    path = _path(base, run, key)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return []
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    except OSError:
        return []
    finally:
        os.close(fd)
        _remove(path)
    try:
        entries = unseal(secret, run, data, make_result)
    except Exception:  # noqa: BLE001 - another key, another run, a damaged file: nothing to serve
        return []
    return [(k, started, v) for k, started, v in entries if 0 <= now - started <= MAX_AGE]


def sweep(base: str, now_wall: Optional[float] = None) -> int:
    """Remove the files of CLIs that are gone, and any older than KEEP_SECONDS; the number removed."""
    now_wall = time.time() if now_wall is None else now_wall
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        path = os.path.join(base, name)
        parts = name[len(_PREFIX):].split("-")
        try:
            pid, started = int(parts[0]), parts[1]
            old = now_wall - os.lstat(path).st_mtime > KEEP_SECONDS
        except (ValueError, IndexError, OSError):
            pid, started, old = 0, "", True
        if old or _started(pid) != started:
            _remove(path)
            removed += 1
    return removed


recorder = Recorder()
