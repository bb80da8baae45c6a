"""ReadinessCheck: the verdict on the started unit, kept as a resource so that `pulumi
refresh` probes the server again and a server that died since the last `up` is drift."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import pulumi

from .core.plan import ServingPlan, declared_layout
from .core.specs import ReadinessDeadlines, ReadinessSpec
from .gpu_host import GpuHost
from .resources import FailedSwitch, Readiness
from .serving_unit import ServingUnit

if TYPE_CHECKING:
    from .multinode import MultiNodeServing


class ReadinessCheck(pulumi.ComponentResource):
    report: pulumi.Output[dict]

    def __init__(self, name: str, plan: ServingPlan, host: GpuHost, unit: Union[ServingUnit, MultiNodeServing],
                 opts: Optional[pulumi.ResourceOptions] = None, prefix: str = ""):
        super().__init__("gpu-serving:index:ReadinessCheck", name, {}, opts)
        s = plan.settings
        self.resource = Readiness(f"{prefix}readiness", ReadinessSpec(
            connection=host.connection,
            unit=plan.unit.name,
            bind=s.serving.host,
            port=s.serving.port,
            declared=declared_layout(plan),
            # The deadlines, for an `up` that finds the server loading (restarted by systemd or
            # an interrupted run) and waits for it.
            readiness=ReadinessDeadlines.from_settings(s.readiness),
            # The service's own wait-for-ready result; re-probed on refresh. Plumbing between two
            # resources, shown as one opaque value (its fields are this resource's outputs).
            report=pulumi.Output.secret(unit.readiness_report),
            host_entry=prefix[:-1] if prefix else "",
        ).to_props(), pulumi.ResourceOptions(parent=self, depends_on=[unit]))
        r = self.resource
        # The stack output `readiness` is a record of the check at `checked_at` (Pulumi updates a
        # stack's outputs only when that stack runs): another stack's switch, a crash or a destroy
        # since then leave it as it was. Its verdict is therefore `status_when_checked`, never a
        # plain `status` a script could take for the host's state now (issue 36.15); the host's
        # state now: `python -m components status`.
        self.report = pulumi.Output.all(
            status_when_checked=r.status, unit=plan.unit.name, url=r.url, probe=r.probe, seconds_to_ready=r.seconds_to_ready,
            checked_at=r.checked_at, checked_by=r.checked_by, layout=r.layout, model=r.model, served_model_name=r.served_model_name,
            version=r.version, mismatches=r.mismatches, reason=r.reason, rollback=r.rollback)
        self.register_outputs({"report": self.report})
        # A switch whose rollback failed too leaves nothing serving. The service records it
        # rather than failing (a failed resource keeps its old outputs, and so would the stack's
        # `readiness`); the run fails here, after the readiness resource has recorded it, so
        # the outputs say "rollback failed" as the run's error does. Only in an update: a
        # preview knows nothing of it yet.
        unit.service.switchFailure.apply(lambda message: self._fail_run(prefix, message))

    def _fail_run(self, prefix: str, message: Optional[str]) -> None:
        if message and not pulumi.runtime.is_dry_run():
            FailedSwitch(f"{prefix}switch-failed", message, pulumi.ResourceOptions(parent=self, depends_on=[self.resource]))
