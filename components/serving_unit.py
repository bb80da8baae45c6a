"""ServingUnit: the strategy's unit file, the model's shared environment file and the
service's state, each a resource with a real read so hand edits show up as drift."""
from __future__ import annotations

import shlex
from typing import Optional

import pulumi

from .core import readiness as R
from .core import status as S
from .core.plan import ServingPlan, declared_layout
from .core.unit import UNIT_DIR
from .gpu_host import GpuHost
from .resources import RemoteFile, Service


def _destroy_warning_hook(prefix: str, plan: ServingPlan, host: GpuHost) -> pulumi.ResourceHook:
    """Warns in a destroy's *preview* that nothing will serve afterwards. Pulumi calls no provider
    code there; a delete hook runs in the program, which the destroy runs because hooks are
    bound (scripts/env.sh sets PULUMI_RUN_PROGRAM=true; a bare `pulumi destroy` asks for
    `--run-program`). The destroy itself warns from the provider's delete, so the hook keeps to
    previews."""
    where = f"hosts[{prefix[:-1]}] ({host.address})" if prefix else host.address

    def warn(args: pulumi.ResourceHookArgs) -> None:
        if not pulumi.runtime.is_dry_run():
            return
        message = S.destroy_warning(unit=plan.unit.name, stack=plan.settings.stack, where=where,
                                    outputs=dict(args.old_outputs or {}))
        if message:
            pulumi.log.warn(message)

    # ignore_errors: a warning must never be what keeps a stack from being destroyed.
    return pulumi.ResourceHook(f"{prefix}destroy-leaves-nothing-serving", warn,
                               pulumi.ResourceHookOptions(on_dry_run=True, ignore_errors=True))


class ServingUnit(pulumi.ComponentResource):
    unit_name: str
    active: pulumi.Output[bool]
    readiness_report: pulumi.Output

    def __init__(self, name: str, plan: ServingPlan, host: GpuHost, secret_environment: Optional[pulumi.Output] = None,
                 opts: Optional[pulumi.ResourceOptions] = None, prefix: str = "",
                 router: Optional[pulumi.Output] = None, after: Optional[list] = None):
        # `prefix` ("gpu1-") keeps the children's names unique in a fleet: a URN holds the
        # parent's type, not its name. `router`: this host's place behind the fleet's router
        # (a switch takes it out and puts it back, components/remote/router.py); `after`: the
        # services of the roll's previous batch, which switch first.
        super().__init__("gpu-serving:index:ServingUnit", name, {}, opts)
        child = pulumi.ResourceOptions(parent=self)
        # A fleet's resources name their entry, so the providers' lines and errors say `hosts[gpu2]`.
        entry = {"hostEntry": prefix[:-1]} if prefix else {}
        s = plan.settings
        self.unit_name = plan.unit.name
        # The environment file is shared by every strategy stack of this model (the same bytes
        # from each: Pulumi.yaml's variables only): destroying one stack must not take it from
        # the others.
        self.environment_file = RemoteFile(f"{prefix}environment-file", {
            "connection": host.connection,
            "path": plan.unit.environment_path,
            "content": plan.environment_text,
            "mode": "0600",
            "secretEnvironment": secret_environment if secret_environment is not None else {},
            "retainOnDelete": True,
            **entry,
        }, pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(retain_on_delete=True)))
        self.unit_file = RemoteFile(f"{prefix}unit-file", {
            "connection": host.connection,
            "path": f"{UNIT_DIR}/{plan.unit.name}",
            "content": plan.unit.text,
            "mode": "0644",
            "reloadSystemd": True,
            # Printed whole by the provider's check when the file is new (see RemoteFileProvider.check).
            "showWhenNew": True,
            **entry,
        }, child)
        secret_hash = (secret_environment or pulumi.Output.from_input({})).apply(R.secret_hash)
        self.service = Service(f"{prefix}service", {
            "connection": host.connection,
            "unit": plan.unit.name,
            "configHash": secret_hash.apply(lambda sh: R.running_config_hash(plan.unit.exec_start, plan.environment, sh)),
            # What the main process must run, compared with /proc/<MainPID> on refresh: one
            # shell-quoted line (a preview shows it as one line, not one per argument).
            "execStart": shlex.join(str(a) for a in plan.unit.exec_start),
            "environment": plan.environment,
            "bind": s.serving.host,
            "port": s.serving.port,
            "declared": declared_layout(plan),
            "readiness": s.readiness.model_dump(by_alias=True),
            "secretEnvironment": secret_environment if secret_environment is not None else {},
            "stack": s.stack,
            **({"router": router} if router is not None else {}),
            **entry,
        }, pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=[self.environment_file, self.unit_file, *(after or [])],
            hooks=pulumi.ResourceHookBinding(before_delete=[_destroy_warning_hook(prefix, plan, host)]))))
        self.active = self.service.active
        self.readiness_report = self.service.readinessReport
        self.register_outputs({"unit": self.unit_name, "active": self.active})
