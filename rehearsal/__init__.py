"""The rehearsal host: a local Debian bookworm host (systemd as PID 1, OpenSSH) booted with
systemd-nspawn in its own network namespace, with simulated GPUs and a rehearsal SGLang engine.

    python -m rehearsal up|down|stop|restart|status|list|ssh|rootfs|isolate

Python API: ``from rehearsal import RehearsalHost`` (or the module functions below).
"""
from .host import (DEFAULT_MODEL, DEFAULT_NAME, DEFAULT_PROFILE, HostInfo, RehearsalError,
                   RehearsalHost, down, ensure_rootfs, isolate_range, list_hosts, restart, ssh_argv, status,
                   stop, up)

__all__ = ["DEFAULT_MODEL", "DEFAULT_NAME", "DEFAULT_PROFILE", "HostInfo", "RehearsalError",
           "RehearsalHost", "down", "ensure_rootfs", "isolate_range", "list_hosts", "restart", "ssh_argv",
           "status", "stop", "up"]
