"""The Pulumi program: settings -> plan -> host, CUDA, venv, unit, readiness."""
from __future__ import annotations

import os
from pathlib import Path

import pulumi

from .config import SECTIONS, parse_settings
from .cuda import CudaToolkit
from .venv import PythonVenv
from .errors import ConfigError
from .gpu_host import GpuHost, GpuHostArgs
from .plan import build_plan, stack_names
from .readiness_check import ReadinessCheck
from .serving_unit import ServingUnit


def read_config() -> dict:
    cfg = pulumi.Config("gpu-serving")
    return {key: cfg.get_object(key) for key in SECTIONS if cfg.get_object(key) is not None}


def run() -> None:
    stack = pulumi.get_stack()
    cfg = pulumi.Config("gpu-serving")
    try:
        settings = parse_settings(stack, read_config())
        plan = build_plan(settings, stack_names(Path(os.getcwd())))
    except ConfigError as exc:
        # RunError: the message, without a Python traceback.
        raise pulumi.RunError(str(exc)) from None
    for warning in plan.warnings:
        pulumi.log.warn(warning)

    host = GpuHost("host", GpuHostArgs(settings, private_key=cfg.get_secret("sshPrivateKey")), needed_gpus=plan.world_size)
    after_host = pulumi.ResourceOptions(depends_on=[host])
    # Shared by every strategy stack of the host; a stack's destroy leaves them in place.
    installs = [CudaToolkit("cuda", host, settings, after_host), PythonVenv("venv", host, settings, after_host)]

    hf_token = cfg.get_secret("hfToken")
    secret_env = hf_token.apply(lambda t: {"HF_TOKEN": t}) if hf_token is not None else None
    unit = ServingUnit(settings.strategy_name, plan, host, secret_env,
                       pulumi.ResourceOptions(depends_on=[host, *installs]))
    ready = ReadinessCheck("readiness", plan, host, unit)

    pulumi.export("strategy", {"name": settings.strategy_name, "world_size": plan.world_size,
                               "layout": plan.as_dict()["layout"]})
    pulumi.export("unit", plan.unit.name)
    pulumi.export("endpoint", f"http://{host.address}:{settings.serving.port}")
    pulumi.export("memory", plan.memory.as_dict())
    pulumi.export("host", host.facts)
    pulumi.export("readiness", ready.report)
