"""components/pulumi_sdk.py: what the program changes in the Pulumi SDK (the SDK's debug lines,
the stack trace recorded with each resource), on the SDK's own objects. The engine side (a
preview with --debug, the state of a deployed stack) is in tests/integration/test_engine.py and
tests/e2e/test_deploy_switch_drift.py."""
from __future__ import annotations

import pulumi
import pytest
from pulumi.runtime import resource as sdk_resource
from pulumi.runtime.proto import source_pb2

from components import pulumi_sdk


def trace(*paths: str):
    return source_pb2.StackTrace(frames=[
        source_pb2.StackFrame(pc=source_pb2.SourcePosition(uri=p, line=i + 1)) if p else source_pb2.StackFrame()
        for i, p in enumerate(paths)])


def uris(t) -> list[str]:
    return [f.pc.uri for f in t.frames]


def test_only_the_projects_own_frames_are_kept_and_the_first_whatever_it_is(tmp_path):
    root = tmp_path.resolve().as_uri()
    roots = pulumi_sdk.project_roots(tmp_path)
    full = trace(f"{root}/components/resources.py", f"{root}/components/program.py", f"{root}/__main__.py", "",
                 "file:///opt/pulumi/bin/pulumi-language-python-exec",
                 f"{root}/.venv/lib/python3.11/site-packages/pulumi/runtime/stack.py",
                 "file:///usr/lib/python3.11/asyncio/events.py")
    assert uris(pulumi_sdk.project_frames(full, roots)) == [
        f"{root}/components/resources.py", f"{root}/components/program.py", f"{root}/__main__.py"]
    # The first frame is the resource's source position: kept even outside the project.
    assert uris(pulumi_sdk.project_frames(trace("file:///usr/lib/x.py", f"{root}/a.py"), roots)) == [
        "file:///usr/lib/x.py", f"{root}/a.py"]
    # A directory that only starts like the project's is not the project.
    assert uris(pulumi_sdk.project_frames(trace(f"{root}/a.py", f"{root}-other/b.py"), roots)) == [f"{root}/a.py"]
    # Nothing to drop: the same message.
    same = trace(f"{root}/a.py", f"{root}/b.py")
    assert pulumi_sdk.project_frames(same, roots) is same


@pytest.fixture
def restore_sdk():
    from pulumi.runtime import settings
    debug, stack_trace, grpc_error = pulumi.log.debug, sdk_resource._get_stack_trace, settings.grpc_error_to_exception
    yield
    pulumi.log.debug, sdk_resource._get_stack_trace, settings.grpc_error_to_exception = debug, stack_trace, grpc_error


@pytest.mark.parametrize("value, made", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_sdks_debug_lines_are_made_only_when_asked(monkeypatch, restore_sdk, tmp_path, value, made):
    monkeypatch.setenv(pulumi_sdk.SDK_DEBUG_ENV, value)
    pulumi_sdk.adjust(tmp_path)
    assert (pulumi.log.debug is pulumi_sdk._SDK_DEBUG) is made
    # The SDK's modules look `log.debug` up when they call it: they get the same function.
    from pulumi.runtime import rpc_manager
    assert rpc_manager.log.debug is pulumi.log.debug


def test_a_project_reached_through_a_symbolic_link_keeps_its_frames_either_way(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    roots = pulumi_sdk.project_roots(tmp_path / "link")
    given, resolved = (tmp_path / "link").absolute().as_uri(), real.resolve().as_uri()
    t = trace("file:///usr/lib/x.py", f"{given}/a.py", f"{resolved}/b.py", "file:///usr/lib/y.py")
    assert uris(pulumi_sdk.project_frames(t, roots)) == ["file:///usr/lib/x.py", f"{given}/a.py", f"{resolved}/b.py"]


def test_the_sdk_records_the_trimmed_trace(restore_sdk, tmp_path, monkeypatch):
    root = tmp_path.resolve().as_uri()
    monkeypatch.setattr(pulumi_sdk, "_SDK_STACK_TRACE", lambda: trace(f"{root}/a.py", "file:///usr/lib/b.py"))
    pulumi_sdk.adjust(tmp_path)
    assert uris(sdk_resource._get_stack_trace()) == [f"{root}/a.py"]


class _Failed(Exception):
    """A failed gRPC request as the SDK sees one (grpc.RpcError and grpc.Call)."""

    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "the details"


def test_once_the_engine_has_stopped_the_program_ends_without_a_second_error(restore_sdk, tmp_path):
    """Issue 36.12: after a refusal the engine shows, the requests the program still had in flight
    failed as "Resource monitor has terminated, shutting down", a second error line. Now such a
    failure ends the program quietly (the status the SDK's runner uses for "already shown"); any
    other failure is the SDK's as before."""
    import grpc
    from pulumi.runtime import settings

    pulumi_sdk.adjust(tmp_path)
    with pytest.raises(SystemExit) as ended:
        settings.handle_grpc_error(_Failed(grpc.StatusCode.UNAVAILABLE))
    assert ended.value.code == pulumi_sdk.SHOWN_ALREADY
    with pytest.raises(Exception, match="the details"):
        settings.handle_grpc_error(_Failed(grpc.StatusCode.UNKNOWN))
