"""The errors a provider raises on purpose, and how they read: one line (or block) naming the
host, never buried under a Python traceback."""
from __future__ import annotations

import sys

from . import ssh


class DeployError(Exception):
    """A failure the user must act on; its message is complete (reason, journal, rollback)."""


# How a failed switch's message says that its rollback failed too (tests and README quote it).
ROLLBACK_FAILED = "rollback failed:"


class RollbackFailed(DeployError):
    """A switch failed and so did its rollback: nothing serves. The service does not fail with
    it: it records `outs` (its report says `rollback: failed ...`), so that the readiness
    resource and the stack outputs say so too (Pulumi keeps the old outputs of a resource that
    fails, and the old stack outputs when an exported value depends on it); FailedSwitch then
    fails the run with this message."""

    def __init__(self, message: str, outs: dict):
        super().__init__(message)
        self.outs = outs


def who(entry: str) -> str:
    """The fleet entry a message is about (`hosts[gpu2]: `), so a fleet's lines and errors name
    their host; empty for the one-host form."""
    return f"hosts[{entry}]: " if entry else ""


def named(entry: str, exc: Exception) -> Exception:
    """`exc` with its message prefixed by the host entry (a fleet), same type."""
    prefix = who(entry)
    if not prefix or str(exc).startswith((prefix, "hosts[")):  # already names its host (a multi-node rank)
        return exc
    if isinstance(exc, RollbackFailed):  # it carries the outputs the service records
        return RollbackFailed(prefix + str(exc), exc.outs)
    return type(exc)(prefix + str(exc))


def clean_errors_in_provider_process() -> None:
    """Show our own errors without a Python traceback.

    Pulumi's dynamic-provider server reports any exception as `traceback.format_exc()`, which
    buries "readiness: timed_out ..." under frames of our code. In that process only (its
    __main__ is pulumi.dynamic's server), errors we raise on purpose are shown by their message;
    anything else keeps its full traceback, as a bug should. The traceback module's own function
    is replaced (the server looks it up at each error) and asks at each error which process it is
    in: with warm starts this module is imported in the warm process, before its fork runs the
    server as __main__, and the server's errors all came with their traceback (issue 36.12).
    """
    import traceback
    if getattr(traceback.format_exc, "gpu_serving", False):
        return
    original = traceback.format_exc

    def format_exc(*args, **kwargs):
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if isinstance(sys.exc_info()[1], (DeployError, ssh.RemoteError)) and getattr(spec, "name", "") == "pulumi.dynamic.__main__":
            return str(sys.exc_info()[1])
        return original(*args, **kwargs)

    format_exc.gpu_serving = True  # type: ignore[attr-defined]
    traceback.format_exc = format_exc


# Installed when the providers' process imports this module (every provider module does): the
# hook asks at each error which process it runs in, so importing it elsewhere changes nothing.
clean_errors_in_provider_process()
