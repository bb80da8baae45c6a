"""The dynamic resources (thin: props in, provider out). Output properties are declared with
None so Pulumi exposes them as attributes."""
from __future__ import annotations

from typing import Any, Optional

import pulumi
from pulumi.dynamic import Resource

from .core.readiness import AS_DECLARED
from .remote import providers


def _opts(opts: Optional[pulumi.ResourceOptions], secret: list[str]) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=secret))


class HostFacts(Resource):
    facts: pulumi.Output[dict]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.HostFactsProvider(), name, {**props, "facts": None}, _opts(opts, ["connection"]))


class RemoteFile(Resource):
    sha256: pulumi.Output[str]
    content: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.RemoteFileProvider(), name, {**props, "sha256": None},
                         _opts(opts, ["connection", "secretEnvironment"]))


class Service(Resource):
    active: pulumi.Output[bool]
    # "as declared" when the main process runs the declared ExecStart and environment; after a
    # refresh, what it runs otherwise (the named drift field a preview shows).
    runningServer: pulumi.Output[str]
    enabled: pulumi.Output[bool]
    previous: pulumi.Output[Optional[str]]
    readinessReport: pulumi.Output[Optional[dict]]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(providers.ServiceProvider(), name,
                         {**props, "active": props.get("active", True), "enabled": props.get("enabled", True),
                          "runningServer": AS_DECLARED, "previous": None, "readinessReport": None},
                         _opts(opts, ["connection"]))


class Readiness(Resource):
    status: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: Optional[pulumi.ResourceOptions] = None):
        outs = {k: None for k in ("status", "url", "probe", "seconds_to_ready", "checked_at", "checked_by", "layout",
                                  "model", "served_model_name", "version", "mismatches", "reason")}
        super().__init__(providers.ReadinessProvider(), name, {**props, **outs}, _opts(opts, ["connection"]))
