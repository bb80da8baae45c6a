"""A strategy's serving plan: validated settings, resolved layout, memory plan, rendered unit.

`check_stack` is the one check of a stack, run by ``python -m components plan`` on the files
(stack_config.from_files) and by the program on the engine's config (stack_config.from_engine),
so ``plan`` shows offline exactly what ``pulumi preview`` will deploy, or refuses what it refuses.
One exception to Pulumi's reading, on both paths (`merge_serving`): a stack's `gpu-serving:serving`
is merged over the project's, key by key and `environment` variable by variable, so a stack file
states only what differs and never drops the project's NCCL settings by setting its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import autoswitch, pd_plan
from .pd_settings import WHERE as PD_SETTING
from .config import AUTOSWITCH_KEY, NAMESPACE, ServingSettings, StackSettings, parse_settings
from .cuda import settings_problems
from .errors import ConfigError, SettingError
from .layout_check import check_layout
from .memory import MemoryPlan
from .stack_config import (
    RawConfig,
    from_files,
    namespace_settings,
    project_settings,
    stack_names,
)
from .strategy import Layout, layout_of
from .unit import (
    RenderedUnit,
    environment,
    render_environment,
    render_unit,
    unit_environment,
)


@dataclass(frozen=True)
class ServingPlan:
    settings: StackSettings
    layout: Layout
    memory: MemoryPlan
    unit: RenderedUnit
    # The strategy's whole environment, and the project's part of it: the shared file's.
    environment: dict[str, str]
    shared_environment: dict[str, str]
    environment_text: str
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def node_gpus(self) -> int:
        """The GPUs this host's unit uses: the world, or its share on one node of a multi-node layout."""
        return self.layout.world_size // self.layout.nnodes

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "stack": s.stack,
            "strategy": s.strategy_name,
            "model": {"name": s.model.name, "path": s.model.path, "served_name": s.model.served_name},
            "host": {"address": s.host.address or f"rehearsal:{s.host.rehearsal}", "gpu_count": s.host.gpu_count,
                     "gpu_memory_gb": s.host.gpu_memory_gb, "interconnect": s.host.interconnect},
            "layout": {k: v for k, v in self.layout.as_dict().items() if k != "nnodes"},
            "world_size": self.world_size,
            "node": ({"rank": s.node.rank, "nnodes": s.node.nnodes, "nodes": list(s.node.names),
                      "dist_init_addr": s.node.dist_init_addr} if s.node else None),
            "memory": self.memory.as_dict(),
            "unit_name": self.unit.name,
            "conflicts": self.unit.conflicts,
            "exec_start": self.unit.exec_start,
            "environment_path": self.unit.environment_path,
            "environment": self.environment,
            "unit_text": self.unit.text,
            "environment_text": self.environment_text,
            "warnings": self.warnings,
        }


def shared_variable_errors(settings: StackSettings, project_environment: dict[str, str]) -> list[SettingError]:
    """A stack that gives a project-level variable another value would change the shared file
    under every other strategy (and a failed switch would leave its value to the one rolled back
    to): refused, naming the variable and both values."""
    mine = settings.serving.environment
    return [SettingError(f"{NAMESPACE}:serving.environment.{key}",
                         f"Pulumi.yaml sets {value!r} for every strategy (the units share {settings.serving.environment_dir}/"
                         f"{settings.model.name}.env); this stack's {mine[key]!r} would change it under the others",
                         "set the variable in each Pulumi.<stack>.yaml instead of Pulumi.yaml, or leave it out of this stack")
            for key, value in sorted(project_environment.items()) if key in mine and mine[key] != value]


def build_plan(settings: StackSettings, project_environment: dict[str, str] | None = None,
               project_environment_dir: str | None = None) -> ServingPlan:
    """Check every rule and render; raises `ConfigError` with all problems found.

    `project_environment`: the variables Pulumi.yaml sets (`project_environment`), which go to
    the shared file; the rest of the strategy's environment goes to its unit. None: all of
    `serving.environment` is the project's (settings without a project around them).
    `project_environment_dir`: Pulumi.yaml's `serving.environmentDir`; a stack with another one
    has a file of its own, where its values of the project's variables may differ."""
    shared = dict(settings.serving.environment if project_environment is None else project_environment)
    errors, memory = check_layout(settings)
    if project_environment_dir in (None, settings.serving.environment_dir):
        errors += shared_variable_errors(settings, shared)
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")
    env = environment(settings)
    shared = {k: env[k] for k in sorted(shared) if k in env}
    return ServingPlan(
        settings=settings,
        layout=layout_of(settings),
        memory=memory,
        unit=render_unit(settings, settings.serving.conflicts_with, unit_environment(env, shared)),
        environment=env,
        shared_environment=shared,
        environment_text=render_environment(shared),
        warnings=list(memory.warnings),
    )


def build_plans(settings: StackSettings, project_environment: dict[str, str] | None = None,
                project_environment_dir: str | None = None,
                addresses: dict[str, str] | None = None) -> list[tuple[str, ServingPlan]]:
    """(host name, plan) for every host of the stack; ("", plan) for the one-host form; a
    multi-node stack's nodes in rank order. Every host's plan is checked before any is returned:
    one host that cannot run the strategy stops the whole stack before anything touches any host.
    `addresses`: rehearsal host name -> address, for rank 0's --dist-init-addr."""
    plans, errors = [], []
    per_host = settings.per_host(addresses)
    by_host: list[tuple[str, list[SettingError]]] = []
    for name, s in per_host:
        try:
            plans.append((name, build_plan(s, project_environment, project_environment_dir)))
        except ConfigError as exc:
            by_host.append((name, exc.errors))
    # A rule every node of a multi-node layout (or every server of a prefill/decode pair) breaks
    # alike is one error, named once; the rest name the host: its hardware (gpuCount,
    # gpuMemoryGb) may differ from the others'.
    together = settings.node_names or settings.disaggregation is not None
    everywhere = set.intersection(*(set(map(str, e)) for _, e in by_host)) if together and \
        len(by_host) == len(per_host) else set()
    seen: set[str] = set()
    for name, host_errors in by_host:
        for e in host_errors:
            if str(e) in everywhere:
                if str(e) not in seen:
                    errors.append(e)
                    seen.add(str(e))
            else:
                errors.append(SettingError(_server_setting(settings, name, e.setting), e.rule, e.fix))
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")
    return plans


def _server_setting(settings: StackSettings, name: str, setting: str) -> str:
    """A host's refusal names the host; on a prefill/decode stack its role too, and a layout key
    where that role's value is written (its own key, or gpu-serving:strategy's)."""
    d = settings.disaggregation
    if not name or d is None:
        return setting + (f" (host {name})" if name else "")
    role = d.role_of(name)
    prefix = f"{NAMESPACE}:strategy."
    if setting.startswith(prefix) and role is not None:  # every host of a PD stack has a role
        setting = d.layout_setting(role, setting[len(prefix):])
    return f"{setting} ({role} on {name})"


def plan_hosts(project_dir: Path, stack: str) -> list[tuple[str, ServingPlan]]:
    """The plan of every host of the stack (see `build_plans`), from the project's files."""
    return check_stack(stack, from_files(project_dir, stack), project_dir).plans


def merge_serving(project: Any, stack: Any) -> Any:
    """`gpu-serving:serving` as a stack sees it: the project's block with the stack's keys on top,
    and the stack's `environment` variables added to the project's (Pulumi alone would let a stack's
    block replace the project's whole, dropping what the stack does not repeat)."""
    if not isinstance(project, dict) or not isinstance(stack, dict):
        return stack if stack is not None else project
    merged = {**project, **stack}
    if isinstance(project.get("environment"), dict) and isinstance(stack.get("environment"), dict):
        merged["environment"] = {**project["environment"], **stack["environment"]}
    return merged


def project_environment(project: dict[str, Any]) -> dict[str, str]:
    """The variables Pulumi.yaml's `serving.environment` sets, as the settings read them (a bad
    value there is reported by the stack's own validation, which sees the same value)."""
    from pydantic import ValidationError
    serving = project.get("serving")
    raw = serving.get("environment") if isinstance(serving, dict) else None
    try:
        return dict(ServingSettings.model_validate({"environment": raw or {}}).environment)
    except ValidationError:
        return {}


def project_environment_dir(project: dict[str, Any]) -> str:
    """Pulumi.yaml's `serving.environmentDir`, or the default."""
    serving = project.get("serving")
    value = serving.get("environmentDir") if isinstance(serving, dict) else None
    return value if isinstance(value, str) else ServingSettings.model_fields["environment_dir"].default


def plan_stack(project_dir: Path, stack: str) -> ServingPlan:
    """The plan of the stack's (first) host; every host is checked."""
    return plan_hosts(project_dir, stack)[0][1]


def load_stack_config(project_dir: Path, stack: str) -> dict[str, Any]:
    """The stack's gpu-serving settings by name (what `parse_settings` takes), read from the files;
    a `ConfigError` for what cannot even be read as settings."""
    config, _, errors = namespace_settings(from_files(project_dir, stack), stack)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return with_project_serving(config, project_settings(project_dir))


def with_project_serving(config: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
    """The stack's settings with its `serving` merged over the project's (`merge_serving`)."""
    if "serving" in config or "serving" in project:
        config = {**config, "serving": merge_serving(project.get("serving"), config.get("serving"))}
    return config


@dataclass(frozen=True)
class CheckedStack:
    settings: StackSettings
    plans: list[tuple[str, ServingPlan]]
    # Secret settings the stack gives (gpu-serving:hfToken, ...): named, never shown.
    secrets: list[str]
    warnings: list[str]
    # A prefill/decode stack's pair plan (pd_plan.PdPlan), None for the others.
    pd: Optional[pd_plan.PdPlan] = None


def check_stack(stack: str, raw: RawConfig, project_dir: Path, addresses: dict[str, str] | None = None) -> CheckedStack:
    """THE check of a stack, for `python -m components plan` and for the program under `pulumi
    preview` and `up` alike (issue 13.6): the config keys and secrets, every setting, SGLang's rules
    and the memory plan of every host, the CUDA source, and what ties this stack to the project's
    other stacks. Nothing here talks to a host. Raises `ConfigError` with every problem found."""
    config, secrets, errors = namespace_settings(raw, stack)
    project = project_settings(project_dir)
    config = with_project_serving(config, project)
    try:
        settings = parse_settings(stack, config)
    except ConfigError as exc:
        raise ConfigError(errors + exc.errors, f"stack {stack}") from None
    plans: list[tuple[str, ServingPlan]] = []
    try:
        plans = build_plans(settings, project_environment(project), project_environment_dir(project), addresses)
    except ConfigError as exc:
        errors += exc.errors
    errors += settings_problems(settings.cuda)
    errors += strategy_owned_elsewhere(project_dir, stack, settings.strategy_name)
    errors += candidates_unknown(project_dir, config.get(AUTOSWITCH_KEY))
    pd = None
    if settings.disaggregation is not None:
        if raw.source == "engine" and not errors:
            # Only a stack plan accepts: a refused one gets plan's refusal, word for word.
            errors.append(SettingError(PD_SETTING, PD_NOT_DEPLOYED, f"python -m components plan --stack {stack}"))
        if plans and not errors:
            pd = pd_plan.build(settings, plans, addresses)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    warnings = [w for _, plan in plans for w in plan.warnings] + same_machine_as_default(settings)
    return CheckedStack(settings, plans, secrets, list(dict.fromkeys(warnings + (pd.warnings if pd else []))), pd)


# Until the deploy of a prefill/decode stack lands (issue 41: its units and router under the
# providers issue 37 restructures), `pulumi preview` and `up` refuse one rather than deploy its
# hosts as an ordinary fleet; `plan` shows the plan and says the same.
PD_NOT_DEPLOYED = ("prefill/decode disaggregation is planned but not deployed by this version: `pulumi preview` and "
                   "`up` refuse the stack rather than run its hosts as an ordinary fleet")


def candidates_unknown(project_dir: Path, raw: Any) -> list[SettingError]:
    """gpu-serving:autoswitch.candidates names stacks of this project: a name without its
    Pulumi.<stack>.yaml would never be followed (parse_settings checked the form already)."""
    names = autoswitch.parse(raw).candidates
    known = stack_names(project_dir)
    return [SettingError(f"{NAMESPACE}:{AUTOSWITCH_KEY}.candidates", f"{name!r} has no Pulumi.{name}.yaml in the project",
                         f"one of: {', '.join(known)}") for name in names if name not in known]


def strategy_owned_elsewhere(project_dir: Path, stack: str, strategy: str) -> list[SettingError]:
    """A strategy names its unit: two stacks of one project with one strategy would both own that
    unit, each `up` undoing the other's (issue 13.5). Another stack's file that cannot be read is
    its own plan's problem, not this one's."""
    errors = []
    for other in stack_names(project_dir):
        if other == stack:
            continue
        try:
            config, _, _ = namespace_settings(from_files(project_dir, other), other)
        except ConfigError:
            continue
        section = config.get("strategy")
        named = section.get("name") if isinstance(section, dict) else None
        if (named if isinstance(named, str) else other) == strategy:
            errors.append(SettingError(
                f"{NAMESPACE}:strategy.name",
                f"stack {stack} and stack {other} (Pulumi.{other}.yaml) both deploy strategy {strategy!r}: "
                "two stacks would own one unit, and each `up` would undo the other",
                "give each stack its own strategy.name (unset, it is the stack's name)"))
    return errors


def same_machine_as_default(settings: StackSettings) -> list[str]:
    """A fleet entry that reaches the machine gpu-serving:host names, where this project's one-host
    stacks deploy: allowed (it may be meant), but said (issue 12.8)."""
    if not settings.hosts:
        return []
    return [f"{NAMESPACE}:hosts[{i}] ({h.name}) reaches the same machine as {NAMESPACE}:host ({settings.host.target}), "
            "where the project's one-host stacks deploy"
            for i, h in enumerate(settings.hosts) if h.machine == settings.host.machine]


def declared_layout(plan: ServingPlan) -> dict[str, Any]:
    """What readiness compares with the server's /server_info."""
    s = plan.settings
    return {"tp_size": plan.layout.tp_size, "pp_size": plan.layout.pp_size, "ep_size": plan.layout.ep_size,
            "dp_size": plan.layout.dp_size, "enable_dp_attention": plan.layout.enable_dp_attention,
            "model_path": s.model.path, "served_model_name": s.model.served_name, "port": s.serving.port}
