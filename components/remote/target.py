"""Target: a host reached over SSH with these facts (address, port, login, keys, bounds)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from . import rehearsal_adapter


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
    # For messages only: the stack's name for the machine (`hosts[gpu2]`, `gpu-serving:host`)
    # and where the pinned key comes from.
    entry: str = ""
    key_from: str = ""

    @classmethod
    def from_props(cls, props: dict[str, Any], stored: bool = False) -> "Target":
        """`stored`: the props are the state's (a read or a delete), so the key was recorded at
        the last up; messages say so. A connection labelled with a rehearsal host's name is
        taken as that host says now (rehearsal_adapter.connection_now)."""
        c = rehearsal_adapter.connection_now(props["connection"])
        key_from = c.get("keyFrom") or "gpu-serving:host.hostKey"
        if stored and not c.get("rehearsal"):
            key_from = f"the stack's state (recorded from {key_from} at the last `pulumi up`)"
        return cls(host=c["host"], port=int(c["port"]), user=c["user"], private_key=c["privateKey"],
                   host_key=c["hostKey"], connect_timeout=float(c.get("connectTimeout", 15)),
                   command_timeout=float(c.get("commandTimeout", 600)), entry=c.get("entry") or "", key_from=key_from)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def named(self) -> str:
        """The label with the stack's name for the machine: `hosts[gpu2] (root@10.0.0.12:22)`."""
        return f"{self.entry} ({self.label})" if self.entry else self.label

    @property
    def key(self) -> tuple:
        return (self.host, self.port, self.user, self.host_key, hashlib.sha256(self.private_key.encode()).hexdigest())
