"""The Pulumi program: settings -> plan -> per host: host, CUDA, venv, unit, readiness."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pulumi
from pulumi.runtime import config as runtime_config

from .benchmark import benchmark_after_ready
from .core.config import StackSettings
from .core.errors import ConfigError
from .core.plan import ServingPlan, check_stack
from .core.reads import refresh_reads
from .core.stack_config import RawConfig, from_engine
from .cuda import CudaToolkit
from .gpu_host import GpuHost, GpuHostArgs
from .readiness_check import ReadinessCheck
from .serving_unit import ServingUnit
from .venv import PythonVenv


def deploy_host(name: str, plan: ServingPlan, private_key: Optional[pulumi.Output],
                secret_env: Optional[pulumi.Output], benchmark: bool = False) -> dict:
    """One machine: its facts, CUDA, venv, the strategy's unit and the readiness verdict, and
    with `benchmark` SGLang's benchmark after it. `name` is "" for the one-host form (the
    resource names stay what they always were) or the fleet entry's name, which prefixes every
    resource of that host."""
    settings: StackSettings = plan.settings
    prefix = f"{name}-" if name else ""
    host = GpuHost(name or "host", GpuHostArgs(settings, private_key=private_key, prefetch=refresh_reads(plan), entry=name),
                   needed_gpus=plan.world_size)
    after_host = pulumi.ResourceOptions(depends_on=[host])
    # Shared by every strategy stack of the host; a stack's destroy leaves them in place.
    installs = [CudaToolkit(f"{prefix}cuda", host, settings, after_host),
                PythonVenv(f"{prefix}venv", host, settings, after_host)]
    unit = ServingUnit(f"{prefix}{settings.strategy_name}", plan, host, secret_env,
                       pulumi.ResourceOptions(depends_on=[host, *installs]), prefix=prefix)
    ready = ReadinessCheck(f"{prefix}readiness", plan, host, unit, prefix=prefix)
    out = {"endpoint": f"http://{host.address}:{settings.serving.port}", "memory": plan.memory.as_dict(),
           "host": host.facts, "readiness": ready.report}
    if benchmark:
        out["benchmark"] = benchmark_after_ready(name, plan, host, unit, ready, Path(os.getcwd())).summary
    return out


def engine_config() -> RawConfig:
    """Every config key the engine passed to this program (not only the ones it knows, so a
    misspelled key is seen), and which are secrets."""
    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = set(runtime_config.get_config_secret_keys_env())
    return from_engine(values, {k for k in values if k in secret or runtime_config.is_config_secret(k)})


def run() -> None:
    stack = pulumi.get_stack()
    cfg = pulumi.Config("gpu-serving")
    try:
        # The same check as `python -m components plan`, on every config key the engine passed
        # (a misspelled one included), before any resource: a fleet with one unfit host changes
        # nothing, and no setting plan refuses reaches a host.
        checked = check_stack(stack, engine_config(), Path(os.getcwd()))
    except ConfigError as exc:
        # RunError: the message, without a Python traceback.
        raise pulumi.RunError(str(exc)) from None
    settings, plans = checked.settings, checked.plans
    for warning in checked.warnings:
        pulumi.log.warn(warning)

    hf_token = cfg.get_secret("hfToken")
    secret_env = hf_token.apply(lambda t: {"HF_TOKEN": t}) if hf_token is not None else None
    private_key = cfg.get_secret("sshPrivateKey")
    # One program run for the whole fleet: the engine reads and changes the hosts in parallel.
    # The benchmark (benchmark.onDeploy) measures the first host, as `components bench` does.
    outputs = {name: deploy_host(name, plan, private_key, secret_env,
                                 benchmark=settings.benchmark.on_deploy and i == 0) for i, (name, plan) in enumerate(plans)}

    first = plans[0][1]
    pulumi.export("strategy", {"name": settings.strategy_name, "world_size": first.world_size,
                               "layout": first.as_dict()["layout"]})
    pulumi.export("unit", first.unit.name)
    if settings.benchmark.on_deploy:
        pulumi.export("benchmark", outputs[plans[0][0]]["benchmark"])
    if not settings.hosts:
        for key, value in outputs[""].items():
            if key != "benchmark":
                pulumi.export(key, value)
        return
    # A fleet: the same outputs, each a map by host name.
    for key in ("endpoint", "memory", "host", "readiness"):
        pulumi.export(key, {name: out[key] for name, out in outputs.items()})
