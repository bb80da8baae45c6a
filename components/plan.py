"""A strategy's serving plan: validated settings, resolved layout, memory plan, rendered unit.

`check_stack` is the one check of a stack, run by ``python -m components plan`` on the files
(stack_config.from_files) and by the program on the engine's config (stack_config.from_engine),
so ``plan`` shows offline exactly what ``pulumi preview`` will deploy, or refuses what it refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import NAMESPACE, StackSettings, parse_settings
from .errors import ConfigError, SettingError
from .memory import MemoryPlan, plan_memory
from .stack_config import RawConfig, from_files, namespace_settings, stack_names
from .strategy import Layout, check_strategy, check_visible_gpus, layout_of
from .unit import RenderedUnit, environment, render_environment, render_unit


@dataclass(frozen=True)
class ServingPlan:
    settings: StackSettings
    layout: Layout
    memory: MemoryPlan
    unit: RenderedUnit
    environment: dict[str, str]
    environment_text: str
    siblings: list[str]
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


def build_plan(settings: StackSettings, siblings: list[str]) -> ServingPlan:
    """Check every rule and render; raises `ConfigError` with all problems found."""
    errors: list[SettingError] = check_strategy(settings) + check_visible_gpus(settings)
    memory, memory_errors = plan_memory(settings)
    errors += memory_errors
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")
    configured = settings.serving.conflicts_with
    siblings = sorted(set(configured if configured is not None else siblings) - {settings.strategy_name})
    env = environment(settings)
    return ServingPlan(
        settings=settings,
        layout=layout_of(settings),
        memory=memory,
        unit=render_unit(settings, siblings),
        environment=env,
        environment_text=render_environment(env),
        siblings=siblings,
        warnings=list(memory.warnings),
    )


def build_plans(settings: StackSettings, siblings: list[str]) -> list[tuple[str, ServingPlan]]:
    """(host name, plan) for every host of the stack; ("", plan) for the one-host form. Every
    host's plan is checked before any is returned: one host that cannot run the strategy stops
    the whole stack before anything touches any host."""
    plans, errors = [], []
    for name, s in settings.per_host():
        try:
            plans.append((name, build_plan(s, siblings)))
        except ConfigError as exc:
            # Name the host: its hardware (gpuCount, gpuMemoryGb) may differ from the others'.
            errors += [SettingError(e.setting + (f" (host {name})" if name else ""), e.rule, e.fix) for e in exc.errors]
    if errors:
        raise ConfigError(errors, f"stack {settings.stack}")
    return plans


def plan_hosts(project_dir: Path, stack: str) -> list[tuple[str, ServingPlan]]:
    """The plan of every host of the stack (see `build_plans`), from the project's files."""
    return check_stack(stack, from_files(project_dir, stack), project_dir).plans


def plan_stack(project_dir: Path, stack: str) -> ServingPlan:
    """The plan of the stack's (first) host; every host is checked."""
    return plan_hosts(project_dir, stack)[0][1]


def load_stack_config(project_dir: Path, stack: str) -> dict[str, Any]:
    """The stack's gpu-serving settings by name (what `parse_settings` takes), read from the files;
    a `ConfigError` for what cannot even be read as settings."""
    config, _, errors = namespace_settings(from_files(project_dir, stack), stack)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    return config


@dataclass(frozen=True)
class CheckedStack:
    settings: StackSettings
    plans: list[tuple[str, ServingPlan]]
    # Secret settings the stack gives (gpu-serving:hfToken, ...): named, never shown.
    secrets: list[str]
    warnings: list[str]


def check_stack(stack: str, raw: RawConfig, project_dir: Path) -> CheckedStack:
    """THE check of a stack, for `python -m components plan` and for the program under `pulumi
    preview` and `up` alike (issue 13.6): the config keys and secrets, every setting, SGLang's rules
    and the memory plan of every host, the CUDA source, and what ties this stack to the project's
    other stacks. Nothing here talks to a host. Raises `ConfigError` with every problem found."""
    from .cuda import settings_problems  # imports pulumi: not needed to read the settings

    config, secrets, errors = namespace_settings(raw, stack)
    try:
        settings = parse_settings(stack, config)
    except ConfigError as exc:
        raise ConfigError(errors + exc.errors, f"stack {stack}") from None
    plans: list[tuple[str, ServingPlan]] = []
    try:
        plans = build_plans(settings, stack_names(project_dir))
    except ConfigError as exc:
        errors += exc.errors
    errors += settings_problems(settings.cuda)
    errors += strategy_owned_elsewhere(project_dir, stack, settings.strategy_name)
    if errors:
        raise ConfigError(errors, f"stack {stack}")
    warnings = [w for _, plan in plans for w in plan.warnings] + same_machine_as_default(settings)
    return CheckedStack(settings, plans, secrets, list(dict.fromkeys(warnings)))


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


# At most this much of a refusal is printed: every problem is named, but a file of a thousand bad
# entries must not print a thousand lines (issue 13.8).
MAX_PROBLEMS_SHOWN = 20
MAX_MESSAGE_CHARS = 8000
MAX_PROBLEM_CHARS = 300


def refusal(exc: ConfigError) -> str:
    """The text `plan` prints and the program raises for a refused configuration: the same for
    both, bounded in problems, in characters a problem and in all."""
    def line(e: SettingError) -> str:
        text = str(e)
        return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS] + "... (cut)"

    head = "invalid configuration" + (f" for {exc.context}" if exc.context else "")
    if len(exc.errors) == 1:
        text = f"{head}: {line(exc.errors[0])}"
    else:
        text = "\n".join([f"{head} ({len(exc.errors)} problems):"] + [f"  - {line(e)}" for e in exc.errors[:MAX_PROBLEMS_SHOWN]])
        if len(exc.errors) > MAX_PROBLEMS_SHOWN:
            text += f"\n  ... and {len(exc.errors) - MAX_PROBLEMS_SHOWN} more (fix these first)"
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + f"\n  ... (cut at {MAX_MESSAGE_CHARS} characters)"
    return text
