"""The Pulumi program under `pulumi.runtime.set_mocks`: for each shipped stack it registers the
components, and the unit resource carries exactly the rendered unit. (Mocks replace the
providers, so no host is touched; the providers are tested against a real host elsewhere.)"""
import json
from pathlib import Path

import pulumi
import pytest
import yaml

from components.plan import plan_stack

ROOT = Path(__file__).resolve().parent.parent


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
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, project="gpu-serving", stack=stack, preview=False)
    pulumi.runtime.set_all_config(stack_config(stack))
    from components.program import run

    @pulumi.runtime.test
    def check():
        run()
        return pulumi.Output.from_input(True).apply(lambda _: None)

    check()
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
    assert sorted(service["siblings"]) == sorted(plan.unit.conflicts)
