"""What the program changes in how the Pulumi SDK talks to the engine, and why. Both are costs of
every run that nobody sees: measured in docs/benchmarks.md (twelfth round). `adjust` is the first
thing each program run does (program.run); a run in a warm fork changes only its own fork.

- The SDK's own debug lines ("beginning rpc register resource", "resource registration
  successful: ...", ~80 a program run, two runs an `up`) are each a blocking gRPC call to the
  engine on the program's event loop, and the CLI prints them only under `--debug`: they are not
  made unless GPU_SERVING_SDK_DEBUG is set.
- The stack trace the SDK records with every resource (the engine keeps it in the state) holds
  the whole Python stack: the language host, asyncio, the warm-start runner, ~20 frames, about a
  quarter of the state's bytes. The engine writes the whole state after each step of an update
  (twice for each refresh), so its size is paid per step and grows with the fleet. Kept: the
  frames in the project's own files (components/, __main__.py), and the first frame whatever it
  is (the resource's source position is the first frame).
- Once the engine stops on an error it has shown (a refused switch, a failed check), the program's
  requests still in flight fail with "the monitor is unavailable", which the SDK raised as a
  second error, "Resource monitor has terminated, shutting down", under the first (issue 36.12).
  The engine has said why it stopped: the program ends there without a word, with the status that
  tells the engine its message was shown.
"""
from __future__ import annotations

import os
from pathlib import Path

import pulumi
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime import settings as sdk_settings

SDK_DEBUG_ENV = "GPU_SERVING_SDK_DEBUG"
_SDK_DEBUG = pulumi.log.debug
# The SDK's function (pinned SDK, requirements.txt): without it, the traces stay as they are.
_SDK_STACK_TRACE = getattr(sdk_resource, "_get_stack_trace", None)


# The SDK's mapping of a failed request (pinned SDK) and the status its runner ends with when the
# user has been shown why (pulumi-language-python-exec: the engine then adds nothing).
_SDK_GRPC_ERROR = sdk_settings.grpc_error_to_exception
SHOWN_ALREADY = 32


def _no_debug(*_args, **_kwargs) -> None:
    return None


def _quiet_when_the_engine_stopped(exn):
    import grpc
    if exn.code() == grpc.StatusCode.UNAVAILABLE:
        raise SystemExit(SHOWN_ALREADY)
    return _SDK_GRPC_ERROR(exn)


def debug_wanted() -> bool:
    return os.environ.get(SDK_DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def project_roots(project: Path) -> tuple[str, ...]:
    """The file-URI prefixes of `project`'s files as the SDK writes them: as given and with its
    symbolic links resolved (a frame's file name is the path it was imported by)."""
    return tuple(sorted({p.absolute().as_uri().rstrip("/") + "/" for p in (project, project.resolve())}))


def project_frames(trace, roots: tuple[str, ...]):
    """`trace` (the SDK's StackTrace message) with only its first frame and those in the project's
    own files (under one of `roots`, not in a virtualenv's or site-packages under it)."""
    def ours(uri: str) -> bool:
        for root in roots:
            if uri.startswith(root):
                below = "/" + uri[len(root):]
                return "/site-packages/" not in below and "/.venv/" not in below
        return False

    kept = [f for i, f in enumerate(trace.frames) if i == 0 or ours(f.pc.uri)]
    return trace if len(kept) == len(trace.frames) else type(trace)(frames=kept)


def adjust(project: Path) -> None:
    pulumi.log.debug = _SDK_DEBUG if debug_wanted() else _no_debug
    sdk_settings.grpc_error_to_exception = _quiet_when_the_engine_stopped
    if _SDK_STACK_TRACE is not None:
        roots = project_roots(project)
        sdk_resource._get_stack_trace = lambda: project_frames(_SDK_STACK_TRACE(), roots)
