"""GpuHost: how to reach the host (pinned key, secret private key) and what it has."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pulumi
from pulumi.runtime import config as runtime_config

from .core.config import StackSettings
from .core.specs import ExpectedHardware, HostFactsSpec
from .remote import rehearsal_adapter
from .resources import HostFacts


@dataclass
class GpuHostArgs:
    settings: StackSettings
    # gpu-serving:sshPrivateKey (a Pulumi secret), when the key is not a file.
    private_key: Optional[pulumi.Output[str]] = None
    # The reads the later resources make on refresh (components/core/reads.py: refresh_reads), started ahead.
    prefetch: Optional[list] = None
    # The fleet entry's name ("" for the one-host form): messages name the machine as the stack does.
    entry: str = ""
    # The setting that declares a machine outside gpu-serving:host and :hosts (the router's own
    # machine: "gpu-serving:router.host"), for the messages.
    setting: str = ""


def connection_of(args: GpuHostArgs) -> tuple[pulumi.Output, str, Optional[dict]]:
    """(the secret connection object the providers use, the host's address, the same object as
    a plain dict when the program knows it now: None while the key is only an Output)."""
    h = args.settings.host
    shared: dict[str, Any] = {"connectTimeout": h.connect_timeout_seconds, "commandTimeout": h.command_timeout_seconds}
    # Labels for messages (ssh.CONNECTION_LABELS: never a change): which entry, where its key is set.
    entry = args.setting or (f"hosts[{args.entry}]" if args.entry else "gpu-serving:host")
    if h.is_rehearsal:
        shared.update(entry=entry, rehearsal=h.rehearsal, keyFrom=rehearsal_adapter.key_from(h.rehearsal))
    else:
        shared.update(entry=entry, keyFrom=f"{entry}.hostKey")
    if h.is_rehearsal:
        reach = rehearsal_adapter.connection(h.rehearsal)
        if reach is None:
            # One host: preview still works without it, and `up` stops with this sentence. A fleet's
            # or a multi-node stack's run stops before anything changes (fleet_check.py).
            conn: dict[str, Any] = {"host": f"rehearsal-{h.rehearsal}", "port": 22, "user": "root", "privateKey": "",
                                    "hostKey": "", "unavailable": rehearsal_adapter.not_running(h.rehearsal, entry), **shared}
            return pulumi.Output.secret(conn), conn["host"], None
        conn = {**reach, **shared}
        return pulumi.Output.secret(conn), conn["host"], conn
    assert h.address is not None  # not a rehearsal host: it has its address
    if not h.host_key:
        raise pulumi.RunError(f"{args.setting or 'gpu-serving:host'}.hostKey is required for a real host: pin its SSH host key "
                              f"(ssh-keyscan -t ed25519 {h.address}), so nobody else can answer in its place")

    def plain(key: str) -> dict[str, Any]:
        return {"host": h.address, "port": h.port, "user": h.user, "privateKey": key, "hostKey": h.host_key, **shared}

    if args.private_key is not None:
        # The Output's text, from the engine's config, so that the connection is known while the
        # program runs (for the reads started ahead, `GpuHost.ahead`); else (the SDK's mocks) later.
        text = runtime_config.get_config("gpu-serving:sshPrivateKey")
        if isinstance(text, str):
            conn = plain(text)
            return pulumi.Output.secret(conn), h.address, conn
        secret_key: pulumi.Output[str] = pulumi.Output.secret(args.private_key)
        return secret_key.apply(plain), h.address, None
    if h.private_key_path:
        conn = plain(Path(h.private_key_path).expanduser().read_text())
        return pulumi.Output.secret(conn), h.address, conn
    raise pulumi.RunError("no SSH key: set the secret gpu-serving:sshPrivateKey "
                          "(pulumi config set --secret gpu-serving:sshPrivateKey < key) or host.privateKeyPath")


# The machines declared in this program run, in order (program.run clears it first and sends
# their `ahead` props last: provider_start.read_ahead).
DECLARED: list["GpuHost"] = []


class GpuHost(pulumi.ComponentResource):
    """The host: SSH connection and the facts read at deploy time (checked against the stack).
    `needed_gpus` 0: a machine that runs no strategy (the router's own): its facts are read and
    shown, and nothing about GPUs, driver or CUDA is expected of it."""

    connection: pulumi.Output
    facts: pulumi.Output[dict]

    def __init__(self, name: str, args: GpuHostArgs, needed_gpus: int, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("gpu-serving:index:GpuHost", name, {}, opts)
        s = args.settings
        self.connection, self.address, plain = connection_of(args)
        # What the provider process needs to connect and start this machine's reads before the
        # engine asks (remote/ahead.py): the host-facts props below that its reads use.
        self.ahead = {"connection": plain, "cudaHome": s.cuda.home, "prefetch": args.prefetch or []} if plain else None
        DECLARED.append(self)
        expect = ExpectedHardware(needed_gpus, s.host.gpu_count, s.host.gpu_memory_gb, s.host.interconnect) if needed_gpus \
            else ExpectedHardware(0)
        self.facts_resource = HostFacts(f"{name}-facts", HostFactsSpec(
            connection=self.connection,
            cuda_home=s.cuda.home,
            expect=expect,
            # Plumbing (which reads to start ahead), shown as one opaque value, not six blocks.
            prefetch=pulumi.Output.secret(args.prefetch) if args.prefetch else args.prefetch,
            host_entry=args.entry,
        ).to_props(), pulumi.ResourceOptions(parent=self))
        self.facts = self.facts_resource.facts
        self.register_outputs({"facts": self.facts})
