"""The Pulumi program: settings -> plan -> per host: host, CUDA, venv, unit, readiness."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pulumi
from pulumi.runtime import config as runtime_config

from .benchmark import benchmark_after_ready
from .core import outputs as O
from .core import roll as roll_plan
from .core import router as R
from .core.config import StackSettings
from .core.errors import ConfigError
from .core.plan import ServingPlan, check_stack
from .core.reads import refresh_reads
from .core.specs import RouterPlace
from .core.specs_router import RouterAdminAccess, RouterReadinessSpec
from .core.stack_config import RawConfig, from_engine
from .core.unit import routed_by
from .cuda import CudaToolkit
from .fleet_check import FleetCheck, check_fleet
from . import fleet_check, gpu_host, pulumi_sdk, serving_unit
from .gpu_host import GpuHost, GpuHostArgs
from .multinode import MultiNodeServing
from .provider_start import read_ahead
from .readiness_check import ReadinessCheck
from .remote import rehearsal_adapter
from .run_kind import says_preview_things
from .scrape_targets import rewrite_after_up
from .resources import RouterReadiness
from .router import Router
from .serving_unit import ServingUnit, SwitchNotice
from .venv import PythonVenv


def deploy_host(name: str, plan: ServingPlan, private_key: Optional[pulumi.Output],
                secret_env: Optional[pulumi.Output], benchmark: bool = False, host: Optional[GpuHost] = None,
                router: Optional[pulumi.Output] = None, after: Optional[list] = None,
                notice: Optional[SwitchNotice] = None) -> dict:
    """One machine: its facts, CUDA, venv, the strategy's unit and the readiness verdict, and
    with `benchmark` SGLang's benchmark after it. `name` is "" for the one-host form (the
    resource names stay what they always were) or the fleet entry's name, which prefixes every
    resource of that host. With a router: `host` made ahead (the router needs every address),
    `router` this host's place behind it, `after` the roll's previous batch. `notice`: the
    fleet's line for a planned switch (SwitchNotice)."""
    settings: StackSettings = plan.settings
    prefix = f"{name}-" if name else ""
    host = host or make_host(name, plan, private_key)
    after_host = pulumi.ResourceOptions(depends_on=[host])
    # Shared by every strategy stack of the host; a stack's destroy leaves them in place.
    installs = [CudaToolkit(f"{prefix}cuda", host, settings, after_host),
                PythonVenv(f"{prefix}venv", host, settings, after_host)]
    unit = ServingUnit(f"{prefix}{settings.strategy_name}", plan, host, secret_env,
                       pulumi.ResourceOptions(depends_on=[host, *installs]), prefix=prefix, router=router, after=after,
                       notice=notice)
    ready = ReadinessCheck(f"{prefix}readiness", plan, host, unit, prefix=prefix)
    out = {"endpoint": f"http://{host.address}:{settings.serving.port}", "memory": O.memory_output(plan.memory.as_dict()),
           "host": host.facts.apply(O.host_output), "readiness": ready.report, "service": unit.service}
    if benchmark:
        out["benchmark"] = benchmark_after_ready(name, plan, host, unit, ready, Path(os.getcwd())).summary
    return out


def make_host(name: str, plan: ServingPlan, private_key: Optional[pulumi.Output]) -> GpuHost:
    return GpuHost(name or "host", GpuHostArgs(plan.settings, private_key=private_key, prefetch=refresh_reads(plan), entry=name),
                   needed_gpus=plan.node_gpus)


def deploy_fleet_behind_router(settings: StackSettings, plans: list, private_key, secret_env, admin_key,
                               check: FleetCheck) -> dict:
    """The fleet with SGLang's router in front: the router on its machine, then each host's
    switch in the batches the roll was planned in (fleet_check: the hosts out of service first,
    then at most rollout.maxUnavailable at a time, never the last one serving), each batch after
    the previous one, each host taken out of the router and put back around its switch."""
    r = settings.declared_router
    hosts = {name: make_host(name, plan, private_key) for name, plan in plans}
    urls = {name: R.worker_url(hosts[name].address, plan.settings.serving.port) for name, plan in plans}
    if r.runs_on is not None:
        router_host = hosts[r.runs_on]
    else:
        # A machine of its own: no strategy runs there, so no GPU, CUDA or model is expected of it.
        router_host = GpuHost("router-host", GpuHostArgs(settings.model_copy(update={"host": r.host, "hosts": ()}),
                                                         private_key=private_key, setting="gpu-serving:router.host"),
                              needed_gpus=0)
    router = Router("router", router_host, settings, [urls[n] for n, _ in plans], admin_key)
    roll = check.roll or roll_plan.unknown([n for n, _ in plans], settings.rollout.max_unavailable)
    # Said only when a host's unit would start or restart (SwitchNotice), not in every run.
    notice = SwitchNotice(roll_plan.notice(roll, settings.strategy_name, router.url_text))
    rejoin = set(roll.rejoin)
    outputs: dict = {}
    previous: list = [router.service]
    for batch in roll.chain:
        services = []
        for name in batch:
            plan = dict(plans)[name]

            def member_props(a: list[Any], url: str = urls[name], name: str = name) -> dict[str, Any]:
                return RouterPlace(
                    connection=a[0], bind=r.bind, port=r.port, venv_path=r.venv_path, admin_key=a[1], worker_url=url,
                    drain_timeout=settings.rollout.drain_timeout_seconds, ready_timeout=r.ready_timeout_seconds,
                    routed_by=routed_by(settings),
                    # Serves as declared but out of the router: its update puts it back (no restart).
                    rejoin=name in rejoin).to_props()
            member = pulumi.Output.all(router_host.connection, admin_key).apply(member_props)
            outputs[name] = deploy_host(name, plan, private_key, secret_env,
                                        benchmark=settings.benchmark.on_deploy and name == plans[0][0], host=hosts[name],
                                        router=pulumi.Output.secret(member), after=list(previous), notice=notice)
            services.append(outputs[name]["service"])
        previous = services
    ready = RouterReadiness("router-readiness", RouterReadinessSpec(
        access=RouterAdminAccess(router_host.connection, r.bind, r.port, r.venv_path, admin_key),
        expected=tuple(urls[n] for n, _ in plans), names={urls[n]: n for n, _ in plans}, timeout_seconds=r.ready_timeout_seconds,
    ).to_props(), pulumi.ResourceOptions(depends_on=[router.service, *[o["service"] for o in outputs.values()]]))
    pulumi.export("router", {"url": router.url, "status": ready.status, "reason": ready.reason, "workers": ready.workers})
    return {name: outputs[name] for name, _ in plans}


def deploy_multinode(settings: StackSettings, plans: list, private_key, secret_env) -> dict:
    """One serving instance over several machines (strategy.nodes): per node its facts, CUDA and
    venv; the layout's units switched as one (MultiNodeServing); readiness judged on rank 0."""
    hosts = {name: make_host(name, plan, private_key) for name, plan in plans}
    installs = []
    for name, plan in plans:
        after_host = pulumi.ResourceOptions(depends_on=[hosts[name]])
        installs += [CudaToolkit(f"{name}-cuda", hosts[name], plan.settings, after_host),
                     PythonVenv(f"{name}-venv", hosts[name], plan.settings, after_host)]
    serving = MultiNodeServing(settings.strategy_name, [(n, p, hosts[n]) for n, p in plans], secret_env,
                               pulumi.ResourceOptions(depends_on=[*hosts.values(), *installs]))
    rank0, plan0 = plans[0]
    ready = ReadinessCheck(f"{rank0}-readiness", plan0, hosts[rank0], serving, prefix=f"{rank0}-")
    return {"endpoint": f"http://{hosts[rank0].address}:{plan0.settings.serving.port}", "readiness": ready.report,
            "memory": O.memory_output(plan0.memory.as_dict()), "host": {n: hosts[n].facts.apply(O.host_output) for n, _ in plans},
            "nodes": {n: {"rank": p.settings.node.rank, "address": hosts[n].address} for n, p in plans}}


def engine_config() -> RawConfig:
    """Every config key the engine passed to this program (not only the ones it knows, so a
    misspelled key is seen), and which are secrets."""
    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = set(runtime_config.get_config_secret_keys_env())
    return from_engine(values, {k for k in values if k in secret or runtime_config.is_config_secret(k)})


def run() -> None:
    pulumi_sdk.adjust(Path(os.getcwd()))
    gpu_host.DECLARED.clear()
    serving_unit.begin_run()
    fleet_check.begin_run()
    declare()
    # Last, once every setting is checked and every resource declared without an error: the
    # provider connects and starts the reads while the engine gets to its first Read.
    read_ahead([h.ahead for h in gpu_host.DECLARED if h.ahead])


def declare() -> None:
    stack = pulumi.get_stack()
    cfg = pulumi.Config("gpu-serving")
    try:
        # The same check as `python -m components plan`, on every config key the engine passed
        # (a misspelled one included), before any resource: a fleet with one unfit host changes
        # nothing, and no setting plan refuses reaches a host.
        # A multi-node layout's --dist-init-addr names rank 0's address: a rehearsal host's is
        # read from the running host.
        raw, addresses = engine_config(), rehearsal_adapter.addresses()
        checked = check_stack(stack, raw, Path(os.getcwd()), addresses)
    except ConfigError as exc:
        # RunError: the message, without a Python traceback.
        raise pulumi.RunError(str(exc)) from None
    settings, plans = checked.settings, checked.plans
    # Said once a command (in the preview of a `pulumi up`, not again in its update).
    if says_preview_things():
        for warning in checked.warnings:
            pulumi.log.warn(warning)
    if not pulumi.runtime.is_dry_run():
        # The stack's Prometheus target file follows its hosts (a preview writes nothing).
        rewrite_after_up(checked.settings, raw, addresses, pulumi.log.warn)

    hf_token = cfg.get_secret("hfToken")
    secret_env = hf_token.apply(lambda t: {"HF_TOKEN": t}) if hf_token is not None else None
    private_key = cfg.get_secret("sshPrivateKey")
    if settings.router is not None and cfg.get_secret("routerAdminKey") is None and not settings.node_names:
        raise pulumi.RunError("gpu-serving:router needs its admin key, the secret gpu-serving:routerAdminKey: "
                              "pulumi config set --secret gpu-serving:routerAdminKey \"$(openssl rand -hex 32)\"")
    # Before any resource: every host's address known; behind a router, the roll planned from the
    # hosts and the router as they are now (or the run refused, before anything changes).
    check = check_fleet(settings, plans, private_key, ["HF_TOKEN"] if hf_token is not None else [])
    if settings.node_names:
        multi = deploy_multinode(settings, plans, private_key, secret_env)
        first = plans[0][1]
        pulumi.export("strategy", O.strategy_output(settings.strategy_name, first.world_size, first.as_dict()["layout"],
                                                    nodes=list(settings.node_names)))
        pulumi.export("unit", first.unit.name)
        for key, value in multi.items():
            pulumi.export(key, value)
        return
    if settings.router is not None:
        outputs = deploy_fleet_behind_router(settings, plans, private_key, secret_env, cfg.get_secret("routerAdminKey"),
                                             check)
    else:
        notice = SwitchNotice(R.switch_notice([n for n, _ in plans], settings.strategy_name))
        # One program run for the whole fleet: the engine reads and changes the hosts in parallel.
        # The benchmark (benchmark.onDeploy) measures the first host, as `components bench` does.
        outputs = {name: deploy_host(name, plan, private_key, secret_env, benchmark=settings.benchmark.on_deploy and i == 0,
                                     notice=notice) for i, (name, plan) in enumerate(plans)}

    first = plans[0][1]
    pulumi.export("strategy", O.strategy_output(settings.strategy_name, first.world_size, first.as_dict()["layout"]))
    pulumi.export("unit", first.unit.name)
    if settings.benchmark.on_deploy:
        pulumi.export("benchmark", outputs[plans[0][0]]["benchmark"])
    if not settings.hosts:
        for key, value in outputs[""].items():
            if key not in ("benchmark", "service"):
                pulumi.export(key, value)
        return
    # A fleet: the same outputs, each a map by host name.
    for key in ("endpoint", "memory", "host", "readiness"):
        pulumi.export(key, {name: out[key] for name, out in outputs.items()})
