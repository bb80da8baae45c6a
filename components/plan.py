"""A strategy's serving plan: validated settings, resolved layout, memory plan, rendered unit.

`load_stack_config` reads Pulumi.yaml and Pulumi.<stack>.yaml the way Pulumi does (project
values first, a stack value replaces the project value of the same key), so
``python -m components plan`` shows offline exactly what ``pulumi preview`` will deploy. One
exception, on both paths (`merge_serving`): a stack's `gpu-serving:serving` is merged over the
project's, key by key and `environment` variable by variable, so a stack file states only what
differs and never drops the project's NCCL settings by setting its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import NAMESPACE, StackSettings, parse_settings
from .errors import ConfigError, SettingError
from .memory import MemoryPlan, plan_memory
from .strategy import Layout, check_strategy, layout_of
from .unit import RenderedUnit, environment, render_environment, render_unit, unit_environment

# Keys of the long form of a project-level config value in Pulumi.yaml.
_SCHEMA_KEYS = {"type", "description", "default", "value", "secret", "items"}


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

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "stack": s.stack,
            "strategy": s.strategy_name,
            "model": {"name": s.model.name, "path": s.model.path, "served_name": s.model.served_name},
            "host": {"address": s.host.address or f"rehearsal:{s.host.rehearsal}", "gpu_count": s.host.gpu_count,
                     "gpu_memory_gb": s.host.gpu_memory_gb, "interconnect": s.host.interconnect},
            "layout": {"tp_size": self.layout.tp_size, "pp_size": self.layout.pp_size, "ep_size": self.layout.ep_size,
                       "dp_size": self.layout.dp_size, "enable_dp_attention": self.layout.enable_dp_attention,
                       "moe_a2a_backend": self.layout.moe_a2a_backend, "moe_tp_size": self.layout.moe_tp_size,
                       "attn_tp_size": self.layout.attn_tp_size},
            "world_size": self.world_size,
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
    errors: list[SettingError] = check_strategy(settings)
    if project_environment_dir in (None, settings.serving.environment_dir):
        errors += shared_variable_errors(settings, shared)
    memory, memory_errors = plan_memory(settings)
    errors += memory_errors
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
                project_environment_dir: str | None = None) -> list[tuple[str, ServingPlan]]:
    """(host name, plan) for every host of the stack; ("", plan) for the one-host form. Every
    host's plan is checked before any is returned: one host that cannot run the strategy stops
    the whole stack before anything touches any host."""
    plans, errors = [], []
    for name, s in settings.per_host():
        try:
            plans.append((name, build_plan(s, project_environment, project_environment_dir)))
        except ConfigError as exc:
            # Name the host: its hardware (gpuCount, gpuMemoryGb) may differ from the others'.
            errors += [SettingError(e.setting + (f" (host {name})" if name else ""), e.rule, e.fix) for e in exc.errors]
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")
    return plans


def _strip_namespace(config: dict[str, Any], source: str) -> dict[str, Any]:
    out = {}
    for key, value in (config or {}).items():
        ns, _, name = key.rpartition(":")
        if ns and ns != NAMESPACE:
            continue  # another package's setting (e.g. pulumi:...)
        out[name] = value
    return out


def _project_values(config: dict[str, Any]) -> dict[str, Any]:
    values = {}
    for key, spec in (config or {}).items():
        if isinstance(spec, dict) and set(spec) <= _SCHEMA_KEYS:
            if "value" in spec:
                values[key] = spec["value"]
            elif "default" in spec:
                values[key] = spec["default"]
        else:
            values[key] = spec
    return values


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([SettingError(path.name, f"is not valid YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([SettingError(path.name, "must be a YAML mapping")])
    return data


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


def project_config(project_dir: Path) -> dict[str, Any]:
    """Pulumi.yaml's config values, namespace stripped ({} without a Pulumi.yaml)."""
    project_file = Path(project_dir) / "Pulumi.yaml"
    if not project_file.exists():
        return {}
    return _strip_namespace(_project_values(_read_yaml(project_file).get("config") or {}), "Pulumi.yaml")


def project_environment(project: dict[str, Any]) -> dict[str, str]:
    """The variables Pulumi.yaml's `serving.environment` sets, as the settings read them (a bad
    value there is reported by the stack's own validation, which sees the same value)."""
    from pydantic import ValidationError
    from .config import ServingSettings
    serving = project.get("serving")
    raw = serving.get("environment") if isinstance(serving, dict) else None
    try:
        return dict(ServingSettings.model_validate({"environment": raw or {}}).environment)
    except ValidationError:
        return {}


def project_environment_dir(project: dict[str, Any]) -> str:
    """Pulumi.yaml's `serving.environmentDir`, or the default."""
    from .config import ServingSettings
    serving = project.get("serving")
    value = serving.get("environmentDir") if isinstance(serving, dict) else None
    return value if isinstance(value, str) else ServingSettings.model_fields["environment_dir"].default


def stack_names(project_dir: Path) -> list[str]:
    """Strategies of this project: one per Pulumi.<stack>.yaml file."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in Path(project_dir).glob("Pulumi.*.yaml"))


def load_stack_config(project_dir: Path, stack: str) -> dict[str, Any]:
    project_dir = Path(project_dir)
    project_file = project_dir / "Pulumi.yaml"
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    if not project_file.exists():
        raise ConfigError([SettingError("Pulumi.yaml", f"not found in {project_dir}")])
    if not stack_file.exists():
        known = ", ".join(stack_names(project_dir)) or "none"
        raise ConfigError([SettingError(f"--stack {stack}", f"no Pulumi.{stack}.yaml in {project_dir}", f"known stacks: {known}")])
    project = project_config(project_dir)
    stack_values = _strip_namespace(_read_yaml(stack_file).get("config") or {}, stack_file.name)
    merged = {**project, **stack_values}
    if "serving" in project or "serving" in stack_values:
        merged["serving"] = merge_serving(project.get("serving"), stack_values.get("serving"))
    return merged


def plan_hosts(project_dir: Path, stack: str) -> list[tuple[str, ServingPlan]]:
    """The plan of every host of the stack (see `build_plans`)."""
    raw = load_stack_config(project_dir, stack)
    # Secrets are not needed for a plan (and are encrypted in stack files).
    settings = parse_settings(stack, raw)
    project = project_config(project_dir)
    return build_plans(settings, project_environment(project), project_environment_dir(project))


def plan_stack(project_dir: Path, stack: str) -> ServingPlan:
    """The plan of the stack's (first) host; every host is checked."""
    return plan_hosts(project_dir, stack)[0][1]
