"""A provider's messages to the engine, each as one message (issue 36.18).

The engine launches a resource plugin with the address of its own gRPC service as the first
argument, and reads the plugin's stderr line by line, each line a message of its own. So a block
(the switch block, the unit as it will be written) printed to stderr became one message a line:
`preview --diff` printed each followed by a blank line, and an `up`'s inline display repeated
every line. Sent through the engine's `Log` call instead, a block is one message (the display
shows its first line inline, the whole of it among the diagnostics), and a step of progress that
only says how far a wait got (`loading (12 s)`) is `ephemeral`: shown while it happens, not
repeated among the diagnostics at the end.

Only in the dynamic provider's process (its __main__ is pulumi.dynamic's server) with an address
to call; anywhere else, or once a call failed, the message goes to stderr as before.
"""
from __future__ import annotations

import re
import sys
import threading
from typing import Optional

# A call that does not return within this many seconds gives up, and the process writes to stderr.
LOG_TIMEOUT_SECONDS = 10.0
_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):[0-9]{1,5}")

_lock = threading.Lock()
_engine: dict = {}  # "stub": the EngineStub, or "failed": True once a call failed


def engine_address(argv: Optional[list[str]] = None, main_module: Optional[str] = None) -> Optional[str]:
    """The engine's address when this process is the dynamic provider's server the engine
    launched (its first argument that is host:port), else None."""
    if main_module is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        main_module = spec.name if spec is not None else None
    if main_module != "pulumi.dynamic.__main__":
        return None
    for arg in (sys.argv[1:] if argv is None else argv):
        if not arg.startswith("-") and _ADDRESS.fullmatch(arg):
            return arg
    return None


def _stub():
    with _lock:
        if _engine.get("failed"):
            return None
        if "stub" not in _engine:
            address = engine_address()
            if address is None:
                _engine["failed"] = True
                return None
            import grpc
            from pulumi.runtime.proto import engine_pb2_grpc
            _engine["stub"] = engine_pb2_grpc.EngineStub(grpc.insecure_channel(address))
        return _engine["stub"]


def say(message: str, ephemeral: bool = False) -> bool:
    """Send `message` to the engine as one informational message; False when it could not be
    (the caller writes it to stderr then)."""
    stub = _stub()
    if stub is None:
        return False
    try:
        from pulumi.runtime.proto import engine_pb2
        stub.Log(engine_pb2.LogRequest(severity=engine_pb2.INFO, message=message, urn="", ephemeral=ephemeral),
                 timeout=LOG_TIMEOUT_SECONDS)
        return True
    except Exception:  # noqa: BLE001 - a message is never a reason to fail: stderr from now on
        with _lock:
            _engine["failed"] = True
        return False
