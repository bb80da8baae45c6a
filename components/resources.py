"""The dynamic resources (thin: props in, provider out). Output properties are declared with
None so Pulumi exposes them as attributes.

Each has its own type token, `pulumi-python:dynamic/gpu-serving:<Name>` (a preview names what
it changes), and an alias to the one token all of them had before, so that stacks deployed
then are taken over in place instead of deleted and created again (the serving unit's service
deleted is the server stopped). The provider classes stay in components/remote/: they are
pickled into the state by module path."""
from __future__ import annotations

import copy
from typing import Any, Optional

import pulumi
from pulumi.dynamic import Resource

from .core.readiness import AS_DECLARED
from .remote import bench as remote_bench
from .remote import multinode, providers
from .remote.refusal import RunRefusedProvider
from .remote.router import RouterReadinessProvider, RouterServiceProvider


# `module` of every dynamic resource's type token: pulumi-python:dynamic/gpu-serving:<name>.
MODULE = "gpu-serving"
# The token every dynamic resource had until issue 14 (the SDK's default for a subclass that
# names none). Only the type changes: the alias keeps the name and the parent (the component),
# so the engine finds the old URN, whose type chain runs through the parent's type.
PREVIOUS_TYPE = "pulumi-python:dynamic:Resource"


def dynamic_options(opts: Optional[pulumi.ResourceOptions], secret: list[str]) -> pulumi.ResourceOptions:
    """The options every dynamic resource adds to its caller's: its secret outputs, and the
    alias to the previous type token."""
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
        additional_secret_outputs=secret, aliases=[pulumi.Alias(type_=PREVIOUS_TYPE)]))


def wait_in_children(opts: Optional[pulumi.ResourceOptions]) -> tuple[Optional[pulumi.ResourceOptions], list]:
    """A component's options without its `depends_on`, and that list, for its children to wait on.

    A component's registration is a step of its own in the engine (with `refresh: always`, a
    refresh and a "same", ~10 ms on this project's machines), and its children cannot register
    before it has. A component that waits for its dependencies puts that step in the chain of
    every run, one more for each level (host, installs, files, service): measured in
    docs/benchmarks.md, eleventh round. Waiting in its children instead keeps every change in the
    same order (each child still waits for every dependency the caller named) while the
    component registers at once, off the chain."""
    if opts is None or not opts.depends_on:
        return opts, []
    deps = opts.depends_on
    after = list(deps) if isinstance(deps, (list, tuple)) else [deps]
    own = copy.copy(opts)
    own.depends_on = None
    return own, after


class HostFacts(Resource, module=MODULE, name="HostFacts"):
    facts: pulumi.Output[dict]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.HostFactsProvider(), name, {**props, "facts": None}, dynamic_options(opts, ["connection"]))


class RemoteFile(Resource, module=MODULE, name="RemoteFile"):
    sha256: pulumi.Output[str]
    content: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.RemoteFileProvider(), name, {**props, "sha256": None},
                         dynamic_options(opts, ["connection", "secretEnvironment"]))


def _service_inputs(props: dict[str, Any]) -> dict[str, Any]:
    """A service's declared inputs and the outputs its provider fills in (unknown until it runs)."""
    return {**props, "active": props.get("active", True), "enabled": props.get("enabled", True),
            "runningServer": AS_DECLARED, "previous": None, "readinessReport": None, "switchFailure": None}


class Service(Resource, module=MODULE, name="SystemdService"):
    active: pulumi.Output[bool]
    # "as declared" when the main process runs the declared ExecStart and environment; after a
    # refresh, what it runs otherwise (the named drift field a preview shows).
    runningServer: pulumi.Output[str]
    enabled: pulumi.Output[bool]
    previous: pulumi.Output[Optional[str]]
    readinessReport: pulumi.Output[Optional[dict]]
    # Set when the last switch failed and so did its rollback: the message the run fails with.
    switchFailure: pulumi.Output[Optional[str]]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.ServiceProvider(), name, _service_inputs(props),
                         dynamic_options(opts, ["connection", "router"]))


class MultiNodeService(Resource, module=MODULE, name="MultiNodeService"):
    """The units of a multi-node layout on all its nodes, switched as one (remote/multinode.py)."""
    active: pulumi.Output[bool]
    runningServer: pulumi.Output[str]
    enabled: pulumi.Output[bool]
    previous: pulumi.Output[Optional[str]]
    readinessReport: pulumi.Output[Optional[dict]]
    # As Service's: set when the last switch failed and so did its rollback on some node.
    switchFailure: pulumi.Output[Optional[str]]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(multinode.MultiNodeServiceProvider(), name, _service_inputs(props),
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                             additional_secret_outputs=["connection", "ranks"])))


class RendezvousCheck(Resource, module=MODULE, name="RendezvousCheck"):
    """Every node of a multi-node layout reaches rank 0's address, checked before its units change."""

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(multinode.RendezvousCheckProvider(), name, props,
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["connection", "nodes"])))


class Readiness(Resource, module=MODULE, name="Readiness"):
    status: pulumi.Output[str]
    # The rest of the readiness report (core/readiness.py, Report.as_dict), as the provider returns it.
    url: pulumi.Output[Any]
    probe: pulumi.Output[Any]
    seconds_to_ready: pulumi.Output[Any]
    checked_at: pulumi.Output[Any]
    checked_by: pulumi.Output[Any]
    layout: pulumi.Output[Any]
    model: pulumi.Output[Any]
    served_model_name: pulumi.Output[Any]
    version: pulumi.Output[Any]
    mismatches: pulumi.Output[Any]
    reason: pulumi.Output[Any]
    rollback: pulumi.Output[Any]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        outs = {k: None for k in ("status", "url", "probe", "seconds_to_ready", "checked_at", "checked_by", "layout",
                                  "model", "served_model_name", "version", "mismatches", "reason", "rollback")}
        super().__init__(providers.ReadinessProvider(), name, {**props, **outs}, dynamic_options(opts, ["connection"]))


class FailedSwitch(Resource, module=MODULE, name="FailedSwitch"):
    """Fails the run with `message` (a switch whose rollback failed); never created."""

    def __init__(self, name: str, message: Any, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.FailedSwitchProvider(), name, {"message": message}, opts)


class Benchmark(Resource, module=MODULE, name="Benchmark"):
    """`benchmark.onDeploy`: SGLang's serving benchmark after readiness (remote/bench.py)."""
    summary: pulumi.Output[dict]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(remote_bench.BenchmarkProvider(), name, {**props, "summary": None}, dynamic_options(opts, ["connection"]))


class RouterService(Resource, module=MODULE, name="RouterService"):
    active: pulumi.Output[bool]
    enabled: pulumi.Output[bool]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(RouterServiceProvider(), name, {**props, "active": None, "enabled": None},
                         dynamic_options(opts, ["connection", "adminKey"]))


class RouterReadiness(Resource, module=MODULE, name="RouterReadiness"):
    status: pulumi.Output[str]
    reason: pulumi.Output[str]
    workers: pulumi.Output[list]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(RouterReadinessProvider(), name, {**props, "status": None, "reason": None, "workers": None},
                         dynamic_options(opts, ["connection", "adminKey"]))


class RunRefused(Resource, module=MODULE, name="RunRefused"):
    """Fails the run, before anything changes, with `message` (components/fleet_check.py): every
    resource of the stack waits for it. Never created."""

    def __init__(self, name: str, message: str, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(RunRefusedProvider(), name, {"message": message}, opts)
