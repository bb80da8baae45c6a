"""components/core/specs.py (and specs_router.py): each resource's contract.

- What the program hands the engine (tests/data/program-inputs/, frozen) opens as its spec and
  comes back from `to_props` unchanged: the spec owns every key and default the program writes.
- States written by earlier versions (tests/data/specs/: keys missing, execStart as a list) open
  with the defaults the providers always used.
"""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from components.core import specs, specs_install, specs_router
from tests.casedata import DATA, cases

# The spec of each dynamic resource type (the token's last word), and the keys of its state that
# are outputs its provider adds, never inputs the program gives.
SPECS = {
    "SystemdService": (specs.ServiceSpec, ("active", "enabled", "runningServer")),
    "MultiNodeService": (specs.ServiceSpec, ("active", "enabled", "runningServer")),
    "RemoteFile": (specs.RemoteFileSpec, ()),
    "HostFacts": (specs.HostFactsSpec, ()),
    "Readiness": (specs.ReadinessSpec, ()),
    "RendezvousCheck": (specs.RendezvousSpec, ()),
    "RouterService": (specs_router.RouterServiceSpec, ()),
    "RouterReadiness": (specs_router.RouterReadinessSpec, ()),
    "CudaToolkitInstall": (specs_install.CudaSpec, ("nvccRelease", "sourceLine")),
    "PythonVenvInstall": (specs_install.VenvSpec, ("installed", "pythonPath")),
}
# What the installers' props carry beside their spec: the connection, which the caller adds.
BESIDE = {"CudaToolkitInstall": ("connection",), "PythonVenvInstall": ("connection",)}


def _unwrapped(value):
    """The golden files mark a secret input {"secret": value}: the provider sees the value."""
    if isinstance(value, dict) and set(value) == {"secret"}:
        return _unwrapped(value["secret"])
    if isinstance(value, dict):
        return {k: _unwrapped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrapped(v) for v in value]
    return value


def _registered() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted((DATA / "program-inputs").glob("*.json")):
        for r in json.loads(path.read_text()):
            kind = r["type"].rpartition(":")[2]
            if r["type"].startswith("pulumi-python:dynamic/") and kind in SPECS:
                out.append((f"{path.stem}:{r['name']}", kind, _unwrapped(r["inputs"])))
    return out


REGISTERED = _registered()


def test_every_kind_of_resource_the_program_registers_has_a_spec():
    kinds = set()
    for path in (DATA / "program-inputs").glob("*.json"):
        kinds |= {r["type"].rpartition(":")[2] for r in json.loads(path.read_text()) if r["type"].startswith("pulumi-python:dynamic/")}
    assert kinds <= set(SPECS), kinds - set(SPECS)


@pytest.mark.parametrize("where,kind,inputs", REGISTERED, ids=[w for w, _, _ in REGISTERED])
def test_what_the_program_registers_opens_as_its_spec_and_comes_back_unchanged(where, kind, inputs):
    spec_class, outputs = SPECS[kind]
    given = {k: v for k, v in inputs.items() if k != "__provider" and k not in outputs}
    beside = {k: given.pop(k) for k in BESIDE.get(kind, ())}
    assert spec_class.from_props({**given, **beside}).to_props() == given


CASES = cases("specs")


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_a_state_written_before_opens_with_the_defaults_the_providers_used(name, case):
    assert case["why"]
    spec = getattr(specs, case["spec"]).from_props(case["props"])
    e = case["expect"]
    assert spec.unit == e["unit"] and spec.port == e["port"] and spec.host_entry == e["host_entry"]
    assert spec.active == e["active"] and spec.enabled == e["enabled"]
    assert spec.compares_process == e["compares_process"] and spec.argv == e["argv"]
    assert spec.readiness.to_props() == e["readiness"]
    assert spec.who == e["who"] and spec.secrets == e["secrets"]
    assert [asdict(r) for r in spec.ranks] == e["ranks"]
    if e["router"] is None:
        assert spec.router is None and not spec.behind_router
    else:
        place = spec.router
        assert place is not None and spec.behind_router == spec.active
        assert (place.worker_url, place.drain_timeout, place.ready_timeout, place.rejoin, place.routed_by) == (
            e["router"]["worker_url"], e["router"]["drain_timeout"], e["router"]["ready_timeout"], e["router"]["rejoin"],
            e["router"]["routed_by"])
        assert place.admin() == e["router"]["admin"]


def test_a_multi_node_layouts_node_is_the_spec_a_one_host_service_would_have():
    rank = {"name": "node1", "rank": 1.0, "connection": {"host": "10.213.7.2"}, "execStart": "python -m sglang.launch_server --node-rank 1",
            "environment": {"NCCL_SOCKET_IFNAME": "host0"}}
    spec = specs.ServiceSpec.from_props({"connection": {"host": "10.213.6.2"}, "unit": "u.service", "execStart": "x", "environment": {},
                                         "hostEntry": "node0", "ranks": [{**rank, "name": "node0", "rank": 0}, rank]})
    node = spec.node(1)
    assert node.connection == {"host": "10.213.7.2"} and node.host_entry == "node1" and node.ranks == ()
    assert node.argv[-2:] == ["--node-rank", "1"] and dict(node.environment) == {"NCCL_SOCKET_IFNAME": "host0"}
    assert node.unit == spec.unit and node.readiness == spec.readiness
    assert spec.ranks[1].rank == 1  # the engine hands numbers back as floats


def test_the_readiness_settings_take_their_defaults_from_the_spec():
    """One home for the deadlines' defaults: the settings' defaults are the spec's."""
    from components.core.config import ReadinessSettings
    assert specs.ReadinessDeadlines.from_settings(ReadinessSettings()) == specs.ReadinessDeadlines()
