"""The host-wide switch lock: one switch (or file write of one) at a time on a machine, whoever
runs it. `flock` held by a remote process for as long as our SSH channel is open: a dropped
connection ends it, so a crashed run never leaves the host locked."""
from __future__ import annotations

import time

from . import ssh
from .common import progress

LOCK_PATH = "/run/lock/gpu-serving.lock"
# How long a switch or a file write waits for another switch on the same host: a switch holds the
# lock through the server's load and readiness check, minutes for a large model.
LOCK_WAIT_SECONDS = 900


def acquire(t: ssh.Target, wait: int = LOCK_WAIT_SECONDS):
    """The lock's channel. Call it inside `ssh.one_connection`; give it back with `release`."""
    ssh.note_change(t)  # a switch begins: nothing read before it is served after it
    transport = ssh.client(t).get_transport()
    chan = transport.open_session(timeout=max(t.connect_timeout, 10.0))
    chan.exec_command(f"flock -w {wait} {LOCK_PATH} sh -c 'echo locked; cat >/dev/null'")
    buf = b""
    deadline = time.monotonic() + wait + 30
    chan.settimeout(5)
    while b"locked" not in buf:
        if not transport.is_active():
            chan.close()
            raise ssh.RemoteError(f"the SSH connection to {t.label} was lost while waiting for the gpu-serving lock; "
                                  "nothing was changed. Run `pulumi up` again.")
        if time.monotonic() > deadline or chan.exit_status_ready():
            chan.close()
            raise ssh.RemoteError(f"another switch holds the gpu-serving lock on {t.label} ({LOCK_PATH}); "
                                  f"waited {wait} s. Run the switches one after the other.")
        try:
            data = chan.recv(64)
            if not data and chan.exit_status_ready():
                continue
            buf += data
        except Exception:
            progress(f"waiting for the gpu-serving lock on {t.label} (another switch is running)")
    return chan


def release(chan) -> None:
    if chan is None:
        return
    try:
        chan.shutdown_write()
        chan.close()
    except Exception:
        pass
