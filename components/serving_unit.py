"""ServingUnit: the strategy's unit file, the model's shared environment file and the
service's state, each a resource with a real read so hand edits show up as drift."""
from __future__ import annotations

import shlex
import threading
from typing import Any, Mapping, Optional

import pulumi

from .core import readiness as R
from .core import status as S
from .core.plan import ServingPlan, declared_layout
from .core.specs import ReadinessDeadlines, ServiceSpec, file_spec
from .core.switch import switch_planned
from .core.unit import UNIT_DIR
from .gpu_host import GpuHost
from .resources import RemoteFile, Service, wait_in_children


# One delete hook for every serving unit, under one name the program always registers: Pulumi
# runs a resource's before_delete hooks by the names its state recorded and fails the run when
# the program did not register one, so a hook named after a fleet entry made removing that entry
# from gpu-serving:hosts impossible (the program no longer declares it). The units this run
# declares are looked up by resource name; a removed entry's is not among them.
DESTROY_HOOK = "destroy-leaves-nothing-serving"
_DECLARED: dict[str, tuple[ServingPlan, GpuHost]] = {}
_hook: list[pulumi.ResourceHook] = []


def begin_run() -> None:
    """A program run starts: no unit declared, the hook not yet registered with this engine."""
    _DECLARED.clear()
    _hook.clear()


def _destroy_warning(args: pulumi.ResourceHookArgs) -> None:
    """Warns in a destroy's *preview* (or the preview of a run that removes a fleet entry) that
    nothing will serve there afterwards. Pulumi calls no provider code there; a delete hook runs
    in the program, which the destroy runs because hooks are bound (scripts/env.sh sets
    PULUMI_RUN_PROGRAM=true; a bare `pulumi destroy` asks for `--run-program`). The delete itself
    warns from the provider, so the hook keeps to previews."""
    if not pulumi.runtime.is_dry_run():
        return
    outputs = dict(args.old_outputs or {})
    prefix = str(args.name).removesuffix("service")
    # Where it serves: the state's machine (its id, "<address>:<unit>"), which is not the
    # declared one when the stack was pointed at another machine (the old half of a move).
    served = str(args.id or "").rpartition(":")[0]
    declared = _DECLARED.get(str(args.name))
    if declared is not None:
        served = served or declared[1].address
    where = f"hosts[{prefix[:-1]}] ({served})" if prefix else served
    if declared is None:
        message = S.destroy_warning(unit=str(outputs.get("unit")), stack=str(outputs.get("stack") or pulumi.get_stack()),
                                    where=where, outputs=outputs, removed=bool(prefix))
    else:
        plan, host = declared
        message = S.destroy_warning(unit=plan.unit.name, stack=plan.settings.stack, where=where, outputs=outputs,
                                    declared=None if served == host.address else host.address)
    if message:
        pulumi.log.warn(message)


def _destroy_warning_hook(name: str, prefix: str, plan: ServingPlan, host: GpuHost) -> pulumi.ResourceHook:
    _DECLARED[name] = (plan, host)
    # ignore_errors: a warning must never be what keeps a stack from being destroyed.
    options = pulumi.ResourceHookOptions(on_dry_run=True, ignore_errors=True)
    if not _hook:
        _hook.append(pulumi.ResourceHook(DESTROY_HOOK, _destroy_warning, options))
    if prefix:
        # The name a fleet's states written before the shared hook recorded (a single host's was
        # already this one), until the next `up` rewrites them.
        pulumi.ResourceHook(f"{prefix}{DESTROY_HOOK}", _destroy_warning, options)
    return _hook[0]


class SwitchNotice:
    """A line for the whole fleet (the roll order, or that every host stops at once), printed by
    the first strategy unit whose create or update starts or restarts it (switch.switch_planned),
    in the preview as in the update, and never in a run that switches nothing. A hook, not the
    program: the program runs the same whatever the engine then finds to change; the engine runs
    a resource's before_create/before_update hooks only for a step that creates or updates it,
    and in a preview too when the hook says on_dry_run."""

    def __init__(self, text: Optional[str]):
        self.text = text
        self._lock = threading.Lock()
        self._said = False

    def say(self) -> bool:
        with self._lock:
            if self._said or not self.text:
                return False
            self._said = True
        pulumi.log.info(self.text)
        return True

    async def maybe_say(self, args: pulumi.ResourceHookArgs) -> None:
        """The hook's callback (before_create: no old outputs; before_update: the refreshed ones)."""
        olds = await _plain(args.old_outputs) if args.old_outputs else None
        if switch_planned(olds, await _plain(args.new_inputs or {})):
            self.say()

    def hook(self, prefix: str) -> pulumi.ResourceHook:
        # ignore_errors: a notice must never be what stops a switch.
        return pulumi.ResourceHook(f"{prefix}switch-notice", self.maybe_say,
                                   pulumi.ResourceHookOptions(on_dry_run=True, ignore_errors=True))


async def _plain(values: Mapping[str, Any]) -> dict:
    """A hook's inputs or outputs with the secret ones (given as Outputs) unwrapped."""
    out = {}
    for key, value in values.items():
        out[key] = await value.future() if isinstance(value, pulumi.Output) else value
    return out


class ServingUnit(pulumi.ComponentResource):
    unit_name: str
    active: pulumi.Output[bool]
    readiness_report: pulumi.Output

    def __init__(self, name: str, plan: ServingPlan, host: GpuHost, secret_environment: Optional[pulumi.Output] = None,
                 opts: Optional[pulumi.ResourceOptions] = None, prefix: str = "",
                 router: Optional[pulumi.Output] = None, after: Optional[list] = None,
                 notice: Optional[SwitchNotice] = None):
        # `prefix` ("gpu1-") keeps the children's names unique in a fleet: a URN holds the
        # parent's type, not its name. `router`: this host's place behind the fleet's router
        # (a switch takes it out and puts it back, components/remote/router.py); `after`: the
        # services of the roll's previous batch, which switch first; `notice`: the fleet's line
        # printed when a switch is planned.
        opts, installs = wait_in_children(opts)
        super().__init__("gpu-serving:index:ServingUnit", name, {}, opts)
        # The files wait for the host and its installs (the service after the files, so after them too).
        child = pulumi.ResourceOptions(parent=self, depends_on=installs)
        # A fleet's resources name their entry, so the providers' lines and errors say `hosts[gpu2]`.
        entry = prefix[:-1] if prefix else ""
        s = plan.settings
        self.unit_name = plan.unit.name
        # The environment file is shared by every strategy stack of this model (the same bytes
        # from each: Pulumi.yaml's variables only): destroying one stack must not take it from
        # the others.
        self.environment_file = RemoteFile(f"{prefix}environment-file", file_spec(
            host.connection, plan.unit.environment_path, plan.environment_text, "0600", entry,
            secretEnvironment=secret_environment if secret_environment is not None else {}, retainOnDelete=True,
        ).to_props(), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(retain_on_delete=True)))
        # Printed whole by the provider's check when the file is new (see RemoteFileProvider.check).
        self.unit_file = RemoteFile(f"{prefix}unit-file", file_spec(
            host.connection, f"{UNIT_DIR}/{plan.unit.name}", plan.unit.text, "0644", entry, reloadSystemd=True, showWhenNew=True,
        ).to_props(), child)
        said = notice.hook(prefix) if notice is not None and notice.text else None
        secret_hash = (secret_environment or pulumi.Output.from_input({})).apply(R.secret_hash)
        self.service = Service(f"{prefix}service", ServiceSpec(
            connection=host.connection,
            unit=plan.unit.name,
            config_hash=secret_hash.apply(lambda sh: R.running_config_hash(plan.unit.exec_start, plan.environment, sh)),
            # What the main process must run, compared with /proc/<MainPID> on refresh: one
            # shell-quoted line (a preview shows it as one line, not one per argument).
            exec_start=shlex.join(str(a) for a in plan.unit.exec_start),
            environment=plan.environment,
            bind=s.serving.host,
            port=s.serving.port,
            declared=declared_layout(plan),
            readiness=ReadinessDeadlines.from_settings(s.readiness),
            secret_environment=secret_environment if secret_environment is not None else {},
            stack=s.stack,
            router_props=router,
            host_entry=entry,
        ).to_props(), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
            depends_on=[self.environment_file, self.unit_file, *(after or [])],
            hooks=pulumi.ResourceHookBinding(
                before_delete=[_destroy_warning_hook(f"{prefix}service", prefix, plan, host)],
                before_create=[said] if said else None, before_update=[said] if said else None))))
        self.active = self.service.active
        self.readiness_report = self.service.readinessReport
        self.register_outputs({"unit": self.unit_name, "active": self.active})
