"""What every part of the rehearsal host shares: the error, where state lives on this machine,
running commands, locks, atomic writes and mounts. Imports no other rehearsal module.

Layout (see `python -m rehearsal --help`):

  ${GPU_SERVING_CACHE:-/var/cache/gpu-serving}/rehearsal/
      rootfs-bookworm-v<N>-<spec hash>/   read-only base, built once by debootstrap (rootfs.py)
      debs/                               debootstrap's package cache (rebuilds are faster)
      instances/<name>/                   PERSISTENT per-instance state (survives restart)
          instance.json                     name, index, profile, model, rootfs
          id_ed25519, id_ed25519.pub        client key pair (root login)
          ssh_host_ed25519_key{,.pub}       the instance's own host key (pinned)
          upper/ work/                      overlay upper and work dirs
          merged/                           overlay mount point = the container's /
  ${GPU_SERVING_RUN:-/run/gpu-serving}/rehearsal/<name>/
      host.json                           what `up`/`status` print
      nspawn.pid                          PID of the systemd-nspawn process
      known_hosts                         the pinned host key for ssh
      console.log                         the container console (boot messages)

Only the root user can run this (mounts, network namespaces, nspawn).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence


class RehearsalError(RuntimeError):
    """A rehearsal host operation failed; the message says why and what to do."""


# --------------------------------------------------------------------------------------
# Paths


def cache_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_CACHE") or "/var/cache/gpu-serving") / "rehearsal"


def run_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_RUN") or "/run/gpu-serving") / "rehearsal"


def instances_root() -> Path:
    return cache_root() / "instances"


def instance_dir(name: str) -> Path:
    return instances_root() / name


def state_dir(name: str) -> Path:
    return run_root() / name


# --------------------------------------------------------------------------------------
# Small helpers


def log(msg: str) -> None:
    print(f"rehearsal: {msg}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], *, check: bool = True, timeout: Optional[float] = 120,
         capture: bool = True, input: Optional[bytes] = None,
         env: Optional[dict] = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), input=input, timeout=timeout, env=env,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.PIPE if capture else None)
    except FileNotFoundError as exc:
        raise RehearsalError(f"{argv[0]} not found: run scripts/install-host-deps") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr or b"").decode(errors="replace").strip()
        raise RehearsalError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{err}")
    return proc


@contextlib.contextmanager
def flock(path: Path) -> Iterator[int]:
    """An exclusive flock; yields the fd (pass it to a child to keep the lock while it runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def global_lock():
    return flock(run_root() / ".locks" / "global.lock")


def write_file(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = content.encode() if isinstance(content, str) else content
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def require_root() -> None:
    if os.geteuid() != 0:
        raise RehearsalError("the rehearsal host needs root (mounts, network namespaces, "
                             "systemd-nspawn): run as root")


def require_tools() -> None:
    missing = [t for t in ("systemd-nspawn", "debootstrap", "ip", "ssh", "ssh-keygen", "mount",
                           "umount") if shutil.which(t) is None]
    if missing:
        raise RehearsalError(f"missing host tools {', '.join(missing)}: run "
                             "scripts/install-host-deps")


# --------------------------------------------------------------------------------------
# Mounts


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    base = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = _unescape_mount(line.split()[4])
            if mp == base or mp.startswith(base + "/"):
                found.append(mp)
    return sorted(set(found), key=len, reverse=True)


def umount_all_under(path: Path) -> None:
    for mp in mounts_under(path):
        if run(["umount", mp], check=False).returncode != 0:
            run(["umount", "-l", mp], check=False)
    left = mounts_under(path)
    if left:
        raise RehearsalError(f"could not unmount {', '.join(left)}")


def safe_rmtree(path: Path) -> None:
    """rm -rf that first unmounts anything below `path` and never crosses a file system."""
    if not path.exists() and not path.is_symlink():
        return
    umount_all_under(path)
    run(["rm", "-rf", "--one-file-system", str(path)], timeout=600)


# Every rehearsal host's systemd, logind and dbus run as this machine's root (no user namespace),
# so all hosts share root's inotify budget. Each booted host holds 7 inotify instances; the
# kernel's default of 128 per user stops the ~18th host's systemd at boot ("Failed to allocate
# manager object: Too many open files"), which a full test run reaches. Only ever raised.
INOTIFY_FLOORS = {"max_user_instances": 8192, "max_user_watches": 524288}


def ensure_inotify_room(proc_dir: Path = Path("/proc/sys/fs/inotify")) -> list[str]:
    """Raise this machine's inotify limits to INOTIFY_FLOORS where they are lower; return what
    changed, as `name old -> new` strings (empty when nothing did)."""
    changed = []
    for name, floor in INOTIFY_FLOORS.items():
        path = proc_dir / name
        current = int(path.read_text().strip())
        if current < floor:
            path.write_text(f"{floor}\n")
            changed.append(f"fs.inotify.{name} {current} -> {floor}")
    return changed
