"""The rehearsal host's public API, in one place: boot, stop, restart, remove and inspect local
rehearsal hosts (Debian bookworm, systemd as PID 1, OpenSSH, in systemd-nspawn and a network
namespace). ``from rehearsal import host``; ``python -m rehearsal`` is the same on the command
line.

The work is done one floor down, imports pointing one way only (tests/rehearsal/
test_rehearsal_layers.py checks it):

  machine.py   an instance's lifecycle: config and keys, overlay, nspawn, readiness, status
  network.py   namespaces, veths, addresses, and the range ending on this machine
  rootfs.py    the base root file system, built once
  common.py    the error, state paths, commands, locks, mounts
"""
from __future__ import annotations

from .common import RehearsalError, instance_dir, state_dir
from .machine import (DEFAULT_MODEL, DEFAULT_NAME, DEFAULT_PROFILE, HostInfo, down, list_hosts,
                      restart, ssh_argv, status, stop, up)
from .network import RANGE, isolate_range
from .rootfs import ensure_rootfs

__all__ = ["DEFAULT_MODEL", "DEFAULT_NAME", "DEFAULT_PROFILE", "HostInfo", "RANGE",
           "RehearsalError", "RehearsalHost", "down", "ensure_rootfs", "instance_dir",
           "isolate_range", "list_hosts", "restart", "ssh_argv", "state_dir", "status", "stop",
           "up"]


class RehearsalHost:
    """Python API (the same as the module functions)."""
    up = staticmethod(up)
    down = staticmethod(down)
    stop = staticmethod(stop)
    restart = staticmethod(restart)
    status = staticmethod(status)
    list = staticmethod(list_hosts)
    ssh_argv = staticmethod(ssh_argv)
    ensure_rootfs = staticmethod(ensure_rootfs)
    isolate_range = staticmethod(isolate_range)
