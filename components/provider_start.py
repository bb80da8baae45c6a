"""Start the dynamic-provider process while the program is still loading.

The engine launches the process that serves every gpu-serving resource (`python -m
pulumi.dynamic`, ~0.3 s: it imports the whole Pulumi SDK and grpc) only when the program first
asks for it, and the Python SDK sends the program's requests only once the program's body has
run: importing the settings models, checking the stack and declaring the resources (~0.4 s). So
every program run paid both, one after the other, before its first read of the host.

Asking the engine, first thing, to call the dynamic provider makes it launch that process at
once, so its start-up overlaps the program's own. The call is an invoke the dynamic provider does
not implement: it answers "not implemented" as soon as it is up, and that answer is the only
thing waited for (in a thread; it is ignored). The process is the same one the resources use (the
engine's default provider for `pulumi-python`): nothing is added to the stack or its state, and
nothing touches a host. Measured in docs/benchmarks.md (issue 18, fifth round).
"""
from __future__ import annotations

import threading

# The token of the call: in the dynamic provider's package, so the engine loads that provider.
TOKEN = "pulumi-python:dynamic:startProvider"


def start_provider_early() -> threading.Thread | None:
    """Ask the engine, in a daemon thread, to start the dynamic provider now. Does nothing outside
    a real engine run (no monitor, or the SDK's mocks in tests)."""
    from pulumi.runtime import settings
    from pulumi.runtime.proto import resource_pb2, resource_pb2_grpc

    monitor = settings.get_monitor()
    if not isinstance(monitor, resource_pb2_grpc.ResourceMonitorStub):
        return None

    def call() -> None:
        try:
            monitor.Invoke(resource_pb2.ResourceInvokeRequest(tok=TOKEN))
        except Exception:  # noqa: BLE001 - "not implemented" is the expected answer; any other is the resources' to meet
            pass

    thread = threading.Thread(target=call, name="gpu-serving-provider-start", daemon=True)
    thread.start()
    return thread
