"""The stack outputs as stored and printed after every `up` (components/core/outputs.py, issue
36.18), as data: the host facts, the memory plan and the layout in, the output out
(tests/data/outputs/*.json); and what `advise --facts` reads of the host output still reads."""
import pytest

from components.core import outputs as O

from .casedata import cases

HOSTS = [(n, c) for n, c in cases("outputs") if n.startswith("host-")]
MEMORY = [(n, c) for n, c in cases("outputs") if n.startswith("memory-")]
STRATEGY = [(n, c) for n, c in cases("outputs") if n.startswith("strategy-")]


def test_every_case_file_is_run():
    assert len(HOSTS) + len(MEMORY) + len(STRATEGY) == len(cases("outputs"))


@pytest.mark.parametrize("name,case", HOSTS, ids=[n for n, _ in HOSTS])
def test_host_output(name, case):
    out = O.host_output(case["host"])
    assert out == case["expect"]
    # One value a field, no list of per-GPU objects: the engine prints it on one line.
    assert not any(isinstance(v, list) and v and isinstance(v[0], dict) for v in out.values())


@pytest.mark.parametrize("name,case", MEMORY, ids=[n for n, _ in MEMORY])
def test_memory_output(name, case):
    assert O.memory_output(case["memory"]) == case["expect"]


@pytest.mark.parametrize("name,case", STRATEGY, ids=[n for n, _ in STRATEGY])
def test_strategy_output(name, case):
    assert O.strategy_output(case["name"], case["world_size"], case["layout"]) == case["expect"]


def test_advise_reads_the_host_output_as_it_read_the_facts():
    from components.core.advise import host_from_facts
    from components.core.config import parse_settings
    from components.core.plan import load_stack_config
    from tests.pulumi_env import REPO

    settings = parse_settings("ep8", load_stack_config(REPO, "ep8"))
    facts = dict(cases("outputs")[[n for n, _ in cases("outputs")].index("host-a-gpu-unlike-the-first")][1]["host"])
    assert host_from_facts(settings, O.host_output(facts)) == host_from_facts(settings, facts)
