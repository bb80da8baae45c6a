"""Start the dynamic-provider process while the program is still loading, and tell it early
which machines this run reads.

The engine launches the process that serves every gpu-serving resource (`python -m
pulumi.dynamic`, ~0.3 s: it imports the whole Pulumi SDK and grpc) only when the program first
asks for it, and the Python SDK sends the program's requests only once the program's body has
run: importing the settings models, checking the stack and declaring the resources (~0.4 s). So
every program run paid both, one after the other, before its first read of the host.

Asking the engine, first thing, to call the dynamic provider makes it launch that process at
once, so its start-up overlaps the program's own; the process answers at once and loads its
modules meanwhile. The program's last step, once every setting is checked and every resource
declared, is a second call naming the machines (`read_ahead`): the provider connects and starts
their reads while the engine is still on its way to the first Read (remote/ahead.py). Both are
invokes of the dynamic provider's package, answered by the same process the resources use (the
engine's default provider for `pulumi-python`): nothing is added to the stack or its state, and
the answers are never waited for (daemon threads; a refusal is ignored). Measured in
docs/benchmarks.md (issue 18, fifth and seventh rounds).
"""
from __future__ import annotations

import json
import threading
from typing import Optional

from .remote.ahead import READ_AHEAD, START

# The token of the first call (remote/ahead.py answers it: the provider loads its modules).
TOKEN = START


def start_provider_early() -> threading.Thread | None:
    """Ask the engine, in a daemon thread, to start the dynamic provider now. Does nothing outside
    a real engine run (no monitor, or the SDK's mocks in tests)."""
    return _invoke(TOKEN, None, "gpu-serving-provider-start")


def read_ahead(hosts: list[dict]) -> threading.Thread | None:
    """Tell the provider process which machines this run reads (the host-facts props of each, as
    the program declared them): it connects and starts their reads while the engine is still on
    its way to the first Read (remote/ahead.py). Called last, once the program has declared
    everything without an error; nothing is sent for no machine."""
    if not hosts:
        return None
    from pulumi.runtime import rpc

    try:
        # A JSON text, so that numbers arrive as they were (a Struct makes every one a float),
        # marked secret: it holds the private keys, and the engine keeps a secret out of its logs.
        secret = {rpc._special_sig_key: rpc._special_secret_sig, "value": json.dumps(hosts)}
        # dryRun: a preview's provider keeps its reads for the update of the same `pulumi up`,
        # whose provider starts from them (remote/handoff.py).
        from pulumi.runtime import is_dry_run
        return _invoke(READ_AHEAD, {"hosts": secret, "dryRun": bool(is_dry_run())}, "gpu-serving-read-ahead")
    except Exception:  # noqa: BLE001 - reading ahead is never a reason to fail the run: the engine's reads do it all
        return None


def _invoke(token: str, args: Optional[dict], name: str) -> threading.Thread | None:
    from pulumi.runtime import settings
    from pulumi.runtime.proto import resource_pb2, resource_pb2_grpc

    monitor = settings.get_monitor()
    if not isinstance(monitor, resource_pb2_grpc.ResourceMonitorStub):
        return None
    request = resource_pb2.ResourceInvokeRequest(tok=token)
    if args is not None:
        request.args.update(args)

    def call() -> None:
        try:
            monitor.Invoke(request)
        except Exception:  # noqa: BLE001 - an answer is never waited for: the resources' own calls do the work
            pass

    thread = threading.Thread(target=call, name=name, daemon=True)
    thread.start()
    return thread
