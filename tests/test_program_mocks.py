"""The Pulumi program under `pulumi.runtime.set_mocks`: for each shipped stack it registers the
components, and the unit resource carries exactly the rendered unit. (Mocks replace the
providers, so no host is touched; the providers are tested against a real host elsewhere.)"""
import asyncio
import contextlib
import json
from pathlib import Path
from unittest import mock

import pulumi
import pytest
import yaml

from components.core import router as R
from components.core.config import ROUTER_VERSIONS
from components.core.plan import plan_stack

ROOT = Path(__file__).resolve().parent.parent
# The dynamic resources' type tokens (issue 14): each its own, under one module.
DYNAMIC = "pulumi-python:dynamic/gpu-serving:"
TOKENS = {"host-facts": "HostFacts", "cuda-toolkit": "CudaToolkitInstall", "venv-packages": "PythonVenvInstall",
          "environment-file": "RemoteFile", "unit-file": "RemoteFile", "service": "SystemdService",
          "readiness": "Readiness"}
# The one token all of them had before: deployed stacks know their resources by it.
PREVIOUS_TYPE = "pulumi-python:dynamic:Resource"


class Recorder(pulumi.runtime.Mocks):
    def __init__(self):
        self.resources = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append((args.typ, args.name, args.inputs))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args):
        return {}


def stack_config(stack: str) -> dict:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    values = {k: v["value"] for k, v in project.items()}
    values.update(yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"])
    return {k: json.dumps(v) for k, v in values.items()}


@pytest.mark.parametrize("stack", ["tp8", "pp8", "ep8"])
def test_program_registers_components_with_rendered_unit(stack, monkeypatch):
    monkeypatch.chdir(ROOT)
    rec = run_program(stack, stack_config(stack))
    types = [t for t, _, _ in rec.resources]
    for component in ("GpuHost", "ServingUnit", "ReadinessCheck"):
        assert f"gpu-serving:index:{component}" in types, types
    plan = plan_stack(ROOT, stack)
    files = {inputs["path"]: inputs for t, n, inputs in rec.resources if n in ("unit-file", "environment-file")}
    unit = files[f"/etc/systemd/system/sglang-kimi-k2.6-{stack}.service"]
    assert unit["content"] == plan.unit.text
    env = files["/etc/gpu-serving/kimi-k2.6.env"]
    assert env["content"] == plan.environment_text and env["mode"] == "0600"
    service = next(inputs for t, n, inputs in rec.resources if n == "service")
    assert service["unit"] == plan.unit.name
    assert service["declared"]["tp_size"] == plan.layout.tp_size
    # The other strategies are found on the host when switching, never listed from the stack files.
    assert "siblings" not in service and service["configHash"]


def test_an_up_rewrites_the_stacks_prometheus_target_file_and_a_preview_does_not(monkeypatch, tmp_path):
    """Issue 42: `up` (not only the watch) rewrites the stack's target file in
    gpu-serving:metrics.targetsDir when that directory exists; a preview writes nothing, and a
    directory that does not exist is not made (Prometheus was not set up there)."""
    monkeypatch.chdir(ROOT)
    from components.remote import rehearsal_adapter
    monkeypatch.setattr(rehearsal_adapter, "addresses", lambda: {"default": "10.213.9.2"})  # the stack's host, booted
    targets = tmp_path / "targets"
    targets.mkdir()
    config = {**stack_config("pp8"), "gpu-serving:metrics": json.dumps({"targetsDir": str(targets)})}
    run_program("pp8", config, preview=True)
    assert list(targets.iterdir()) == []
    run_program("pp8", config)
    written = json.loads((targets / "pp8.json").read_text())
    assert written == [{"labels": {"host": "rehearsal:default", "role": "server"}, "targets": ["10.213.9.2:30001"]}]
    missing = tmp_path / "not-set-up"
    run_program("pp8", {**config, "gpu-serving:metrics": json.dumps({"targetsDir": str(missing)})})
    assert not missing.exists()


@contextlib.contextmanager
def booted(yes: bool = True):
    """The fleets' rehearsal hosts here are never booted: taken as running (their address is then
    the stand-in name), unless a test is about a host that is not (fleet_check.unresolved)."""
    from components import fleet_check
    with mock.patch.object(fleet_check, "host_record", lambda name: {"address": f"rehearsal-{name}"} if yes else None):
        yield


def run_program(stack: str, config: dict, secret_keys: list[str] | None = None, hosts_booted: bool = True,
                preview: bool = False) -> Recorder:
    """The program under mocks with `config` (`secret_keys` of it set as secrets); the recorder of
    what it registered."""
    rec = Recorder()
    # The SDK's mocks run on the thread's current event loop (and keep futures on it from one run
    # to the next): a test before this one in the same process may have left none (asyncio.run
    # does), and then one is made, once.
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
        usable = not loop.is_closed()
    except RuntimeError:
        usable = False
    if not usable:
        asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack=stack, preview=preview)
    pulumi.runtime.set_all_config(config, secret_keys)
    from components.program import run

    @pulumi.runtime.test
    def check():
        with booted(hosts_booted):
            run()
        return pulumi.Output.from_input(True).apply(lambda _: None)

    check()
    return rec


FLEET = [{"name": "gpu1", "rehearsal": "fleet-a"},
         {"name": "gpu2", "rehearsal": "fleet-b", "gpuMemoryGb": 141, "gpuModel": "NVIDIA H200"}]


def test_fleet_registers_every_resource_once_per_host_with_that_hosts_plan(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = stack_config("ep8")
    config["gpu-serving:hosts"] = json.dumps(FLEET)
    rec = run_program("ep8", config)
    names = [(t, n) for t, n, _ in rec.resources]
    # A URN holds the parent's type, not its name: every child needs a name of its own.
    assert len(names) == len(set(names)), sorted(names)
    by_name = {n: inputs for _, n, inputs in rec.resources}
    for host in ("gpu1", "gpu2"):
        for child in ("facts", "cuda-toolkit", "venv-packages", "environment-file", "unit-file", "service", "readiness"):
            assert f"{host}-{child}" in by_name, (host, child, sorted(by_name))
    assert {t for t, n, _ in rec.resources if n == "gpu1"} == {"gpu-serving:index:GpuHost"}
    # Each host gets the plan for its own hardware: the KV pool differs with the GPU memory.
    assert by_name["gpu1-facts"]["expect"]["gpuMemoryGb"] == 96
    assert by_name["gpu2-facts"]["expect"]["gpuMemoryGb"] == 141
    assert by_name["gpu1-service"]["unit"] == by_name["gpu2-service"]["unit"] == "sglang-kimi-k2.6-ep8.service"
    # The one-host names are not used in a fleet (they would collide with a second host).
    assert not {"host-facts", "service", "unit-file"} & set(by_name)


def test_one_host_form_keeps_its_resource_names(monkeypatch):
    # Stacks deployed before fleets existed must see no rename (a rename is a delete + create).
    monkeypatch.chdir(ROOT)
    rec = run_program("ep8", stack_config("ep8"))
    names = {n for _, n, _ in rec.resources}
    assert {"host", "host-facts", "cuda", "cuda-toolkit", "venv", "venv-packages", "ep8", "environment-file",
            "unit-file", "service", "readiness"} <= names, sorted(names)


def test_fleet_with_one_unfit_host_registers_nothing(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = stack_config("ep8")
    config["gpu-serving:hosts"] = json.dumps([FLEET[0], {"name": "small", "rehearsal": "fleet-c", "gpuCount": 4}])
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack="ep8", preview=False)
    pulumi.runtime.set_all_config(config)
    from components.program import run
    with pytest.raises(pulumi.RunError, match=r"host small"):
        run()
    assert not [t for t, _, _ in rec.resources if t.startswith(("gpu-serving:", "pulumi-python:"))]


def record_registrations(monkeypatch, field: str) -> list[tuple]:
    """(type, name, list of the request's `field`) for every resource the program registers
    with the mock monitor, in order (field: "aliases", "dependencies", ...)."""
    registered: list[tuple] = []
    original = pulumi.runtime.mocks.MockMonitor.RegisterResource

    def recording(self, request):
        registered.append((request.type, request.name, list(getattr(request, field))))
        return original(self, request)

    monkeypatch.setattr(pulumi.runtime.mocks.MockMonitor, "RegisterResource", recording)
    return registered


def test_each_dynamic_resource_has_its_own_type_token_and_an_alias_to_the_previous_one(monkeypatch):
    """A preview names the kind of thing that changes (`...:SystemdService  service`), and a
    stack deployed with the previous token is taken over in place: the alias names only the
    old type, so the engine keeps the resource's name and parent (the parent's type is part of
    the URN) when it looks up the old URN."""
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "aliases")
    run_program("ep8", stack_config("ep8"))
    dynamic = {name: typ for typ, name, _ in registered if typ.startswith("pulumi-python:")}
    assert dynamic == {name: DYNAMIC + token for name, token in TOKENS.items()}
    for typ, name, aliases in registered:
        if not typ.startswith("pulumi-python:"):
            continue
        assert len(aliases) == 1, (name, aliases)
        spec = aliases[0].spec
        assert spec.type == PREVIOUS_TYPE, (name, spec)
        # Unset name and parent mean "this resource's own": only the type differs.
        assert (spec.name, spec.parentUrn, spec.noParent) == ("", "", False), (name, spec)
        assert not aliases[0].urn, (name, aliases[0])


def test_every_dynamic_resource_class_names_its_token():
    """A dynamic resource added without `module=`/`name=` would be one more
    pulumi-python:dynamic:Resource: every subclass in components/ has a token of its own."""
    import components.program  # noqa: F401  (imports every component and its resources)
    from pulumi.dynamic import Resource

    classes = [c for c in Resource.__subclasses__() if c.__module__.startswith("components.")]
    tokens = {f"pulumi-python:{c._resource_type_name}": c.__qualname__ for c in classes}
    assert len(classes) == 13, classes
    assert len(tokens) == 13 and PREVIOUS_TYPE not in tokens, tokens
    assert all(t.startswith(DYNAMIC) for t in tokens), tokens


def test_benchmark_on_deploy_registers_one_benchmark_after_readiness(monkeypatch):
    """benchmark.onDeploy: one Benchmark resource (its own token), after the readiness resource,
    given the stack's benchmark spec, the unit's hash and the readiness verdict; the stack
    output `benchmark` is its summary. Off (the default): none, and no output."""
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "dependencies")
    config = stack_config("pp8")
    bench = {**json.loads(config["gpu-serving:benchmark"]), "onDeploy": True, "concurrency": [1, 4]}
    config["gpu-serving:benchmark"] = json.dumps(bench)
    rec = run_program("pp8", config)
    by_name = {n: (t, inputs) for t, n, inputs in rec.resources}
    typ, props = by_name["benchmark"]
    assert typ == DYNAMIC + "Benchmark"
    plan = plan_stack(ROOT, "pp8")
    assert props["unit"] == plan.unit.name and props["stack"] == "pp8" and props["declared"]["pp_size"] == 8
    assert props["benchmark"]["concurrency"] == [1, 4] and props["benchmark"]["onDeploy"] is True
    assert props["python"].endswith("/bin/python") and props["model"]["path"] == plan.settings.model.path
    assert props["rehearsalHost"] is True and props["projectDir"] == str(ROOT) and props["resultsDir"] == "results/bench"
    assert len(props["unitConfig"]) == 64
    # After the readiness check: its verdict gates the run.
    deps = next(d for t, n, d in registered if n == "benchmark")
    assert ("urn:pulumi:pp8::gpu-serving::gpu-serving:index:ReadinessCheck$pulumi-python:dynamic/gpu-serving:Readiness"
            "::readiness") in deps, deps

    off = run_program("pp8", stack_config("pp8"))
    assert "benchmark" not in {n for _, n, _ in off.resources}


def test_benchmark_on_deploy_in_a_fleet_measures_the_first_host(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = stack_config("ep8")
    config["gpu-serving:hosts"] = json.dumps(FLEET)
    config["gpu-serving:benchmark"] = json.dumps({**json.loads(config["gpu-serving:benchmark"]), "onDeploy": True})
    rec = run_program("ep8", config)
    benches = {n: inputs for t, n, inputs in rec.resources if t == DYNAMIC + "Benchmark"}
    assert list(benches) == ["gpu1-benchmark"] and benches["gpu1-benchmark"]["hostEntry"] == "gpu1"


def test_multi_node_registers_files_per_node_one_service_for_all_after_the_rendezvous_check(monkeypatch):
    """Pulumi.tp16x2.yaml: each node's facts and files; one MultiNodeService over both ranks,
    after every file; the files after the check that node1 reaches rank 0; readiness on rank 0."""
    monkeypatch.chdir(ROOT)
    deps = record_registrations(monkeypatch, "dependencies")
    rec = run_program("tp16x2", stack_config("tp16x2"))
    names = {n: inputs for t, n, inputs in rec.resources}
    for node in ("node0", "node1"):
        assert f"{node}-facts" in names and f"{node}-unit-file" in names and f"{node}-environment-file" in names
    assert names["node1-facts"]["expect"]["neededGpus"] == 8
    units = [names[f"node{k}-unit-file"]["content"] for k in (0, 1)]
    assert "--node-rank 0" in units[0] and "--node-rank 1" in units[1]
    service = names["tp16x2-service"]
    ranks = service["ranks"]["value"] if isinstance(service["ranks"], dict) else service["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and service["declared"]["tp_size"] == 16
    assert "service" not in names and "node1-readiness" not in names and "node0-readiness" in names
    urns = {n: d for t, n, d in deps}
    assert any(d.endswith("tp16x2-rendezvous") for d in urns["node1-unit-file"])
    assert _names(urns["tp16x2-service"]) >= {"node0-unit-file", "node1-unit-file"}


def _names(urns) -> set:
    return {u.rsplit("::", 1)[1] for u in urns}


@pytest.mark.parametrize("fleet", [False, True])
def test_components_register_at_once_and_their_resources_wait_in_order(monkeypatch, fleet):
    """A component that waited for its dependencies would put its own engine step in the chain of
    every run (resources.wait_in_children): the components name no dependency, and each resource
    in them waits for what the component was declared after, so every change keeps its order:
    host facts, then CUDA and the venv, then both files, then the service, then readiness."""
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "dependencies")
    config = stack_config("ep8")
    if fleet:
        config["gpu-serving:hosts"] = json.dumps(FLEET)
    run_program("ep8", config)
    deps = {(t, n): _names(d) for t, n, d in registered}
    for p in (["gpu1-", "gpu2-"] if fleet else [""]):
        host = p[:-1] if fleet else "host"
        components = {(t, n) for t, n in deps if t.startswith("gpu-serving:index:") and (n.startswith(p) or n == host)}
        assert {t.rsplit(":", 1)[1] for t, _ in components} >= {"GpuHost", "CudaToolkit", "PythonVenv", "ServingUnit",
                                                                "ReadinessCheck"}, components
        assert all(not deps[c] for c in components), {c: deps[c] for c in components if deps[c]}
        facts, installs = f"{host}-facts", {f"{p}cuda-toolkit", f"{p}venv-packages"}
        assert deps[(DYNAMIC + "CudaToolkitInstall", f"{p}cuda-toolkit")] == {facts}
        assert deps[(DYNAMIC + "PythonVenvInstall", f"{p}venv-packages")] == {facts}
        files = {f"{p}environment-file", f"{p}unit-file"}
        for f in files:
            assert deps[(DYNAMIC + "RemoteFile", f)] >= {facts, *installs}, f
        assert deps[(DYNAMIC + "SystemdService", f"{p}service")] >= files
        assert deps[(DYNAMIC + "Readiness", f"{p}readiness")] >= {f"{p}service"}


def test_multi_node_components_register_at_once_and_the_check_waits_for_every_install(monkeypatch):
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "dependencies")
    run_program("tp16x2", stack_config("tp16x2"))
    deps = {(t, n): _names(d) for t, n, d in registered}
    assert not deps[("gpu-serving:index:MultiNodeServing", "tp16x2")]
    check = deps[(DYNAMIC + "RendezvousCheck", "tp16x2-rendezvous")]
    assert check >= {f"node{k}-{r}" for k in (0, 1) for r in ("facts", "cuda-toolkit", "venv-packages")}, check


class FailedRollbackRecorder(Recorder):
    """The service reports a switch whose rollback failed (what ServiceProvider records)."""
    MESSAGE = "readiness: crashed: exit 1\nrollback failed: nothing serves on rehearsal host: sglang-ep8.service did not come back"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        name, outs = super().new_resource(args)
        if args.typ in (DYNAMIC + "SystemdService", DYNAMIC + "MultiNodeService"):
            outs = {**outs, "switchFailure": self.MESSAGE}
        return name, outs


@pytest.mark.parametrize("stack,prefix", [("pp8", ""), ("tp16x2", "node0-")])
@pytest.mark.parametrize("preview", [False, True])
def test_a_failed_rollback_fails_the_run_after_the_readiness_resource(monkeypatch, preview, stack, prefix):
    """RollbackFailed: the service records the failure instead of failing, so the readiness
    resource and the stack outputs can say so; a FailedSwitch (its own token, never in a state)
    is registered after the readiness resource, carrying the message, and only in an update.
    A multi-node layout alike: its one service over every node, judged on rank 0 (node0)."""
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "dependencies")
    rec = FailedRollbackRecorder()
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack=stack, preview=preview)
    pulumi.runtime.set_all_config(stack_config(stack))
    from components.program import run

    @pulumi.runtime.test
    def check():
        with booted():
            run()
        return pulumi.Output.from_input(True).apply(lambda _: None)

    check()
    failed = [(t, n, deps) for t, n, deps in registered if t == DYNAMIC + "FailedSwitch"]
    if preview:
        assert failed == []
        return
    (typ, name, deps), = failed
    assert name == f"{prefix}switch-failed"
    readiness_urn = next(u for u in deps if u.endswith(f"::{prefix}readiness"))
    assert DYNAMIC + "Readiness" in readiness_urn
    inputs = next(i for t, n, i in rec.resources if t == typ)
    assert inputs["message"] == FailedRollbackRecorder.MESSAGE


@pytest.mark.parametrize("stack", ["ep8", "tp16x2"])
def test_a_host_not_booted_registers_the_refusal_first_and_everything_waits_for_it(monkeypatch, stack):
    """Issue 36.6: a fleet (or multi-node) host whose rehearsal host is not running has no address;
    the run must stop before anything changes. The refusal (RunRefused, whose check fails the
    preview and the up) is registered first, and every other resource, components included, names
    it among its dependencies, so the engine gets none of them before the refusal's answer; a
    destroy or refresh (no check there) goes on as ever. A one-host stack registers no refusal."""
    monkeypatch.chdir(ROOT)
    registered = record_registrations(monkeypatch, "dependencies")
    config = stack_config(stack)
    if stack == "ep8":
        config["gpu-serving:hosts"] = json.dumps(FLEET)
    rec = run_program(stack, config, hosts_booted=False)
    refusal = [inputs for t, n, inputs in rec.resources if t == DYNAMIC + "RunRefused"]
    assert len(refusal) == 1 and "nothing was changed: hosts[" in refusal[0]["message"], refusal
    assert "is not running: start it with `python -m rehearsal up" in refusal[0]["message"]
    others = [(t, n, _names(d)) for t, n, d in registered if t not in ("pulumi:pulumi:Stack", DYNAMIC + "RunRefused")]
    assert others and all("run-refused" in d for _, _, d in others), [o for o in others if "run-refused" not in o[2]]
    one = record_registrations(monkeypatch, "type")
    run_program("ep8", stack_config("ep8"), hosts_booted=False)
    assert not [r for r in one if r[0] == DYNAMIC + "RunRefused"]


THREE_BEHIND_ROUTER = [{"name": "gpu1", "rehearsal": "pd1"}, {"name": "gpu2", "rehearsal": "pd2"},
                       {"name": "gpu3", "rehearsal": "pd3"}]


@pytest.mark.parametrize("max_unavailable, batches", [(1, [["gpu1"], ["gpu2"], ["gpu3"]]),
                                                       (2, [["gpu1", "gpu2"], ["gpu3"]])])
def test_the_rolls_batches_each_wait_for_the_one_before(monkeypatch, tmp_path, max_unavailable, batches):
    """Behind the router the roll is a chain of depends_on: the first batch's services wait for
    the router's service, each later batch's for every service of the batch before, and no host
    for one of its own batch (they switch together). Without the chain the engine switches
    every host at once and the router has nothing left to route to. Under mocks the fleet
    cannot be read, so the roll is the declared order, `maxUnavailable` at a time (roll.unknown)."""
    monkeypatch.chdir(ROOT)
    # Router() checks its pinned wheels are at hand (offline install): empty files of those names.
    for spec in R.pins(ROUTER_VERSIONS[-1]):
        name, version = spec.split("==")
        (tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    registered = record_registrations(monkeypatch, "dependencies")
    config = stack_config("tp8x2")
    config["gpu-serving:hosts"] = json.dumps(THREE_BEHIND_ROUTER)
    config["gpu-serving:rollout"] = json.dumps({"maxUnavailable": max_unavailable})
    config["gpu-serving:router"] = json.dumps({**json.loads(config["gpu-serving:router"]), "wheelhouse": str(tmp_path)})
    config["gpu-serving:routerAdminKey"] = "k" * 32
    run_program("tp8x2", config, ["gpu-serving:routerAdminKey"])
    services = {n: _names(d) for t, n, d in registered if t == DYNAMIC + "SystemdService"}
    assert sorted(services) == [f"{h['name']}-service" for h in THREE_BEHIND_ROUTER], services
    before = {"router-service"}
    for batch in batches:
        for host in batch:
            waits = {d for d in services[f"{host}-service"] if d.endswith("-service")}
            assert waits == before, (host, waits, before)
        before = {f"{host}-service" for host in batch}
