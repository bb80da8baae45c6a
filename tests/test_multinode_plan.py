"""Multi-node layouts (issue 17), the pure part: one unit per node with its rank, the shipped
Pulumi.tp16x2.yaml's units as golden files, the NCCL defaults per network between the nodes."""
from pathlib import Path

from components.core.config import parse_settings
from components.core.plan import build_plans, check_stack
from components.core.stack_config import from_files
from components.core.unit import node_networks

from .casedata import case_config, update_golden

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "units"
# Rank 0's address as the program reads it from the running rehearsal host (a documentation address here).
ADDRESSES = {"node0": "192.0.2.10", "node1": "192.0.2.11"}


def shipped():
    return check_stack("tp16x2", from_files(ROOT, "tp16x2"), ROOT, ADDRESSES).plans


def _golden(name: str, text: str):
    path = GOLDEN / name
    if update_golden():
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_each_node_renders_its_golden_unit():
    plans = shipped()
    assert [name for name, _ in plans] == ["node0", "node1"]
    for rank, (name, plan) in enumerate(plans):
        _golden(f"tp16x2-rank{rank}.service", plan.unit.text)


def test_every_node_runs_the_same_command_but_its_rank():
    (_, zero), (_, one) = shipped()
    assert zero.unit.name == one.unit.name == "sglang-kimi-k2.6-tp16x2.service"
    a, b = zero.unit.exec_start, one.unit.exec_start
    assert len(a) == len(b) and [i for i, (x, y) in enumerate(zip(a, b)) if x != y] == [a.index("--node-rank") + 1]
    assert a[a.index("--node-rank") + 1] == "0" and b[b.index("--node-rank") + 1] == "1"
    # Both point at rank 0 (node0), whose address the program read from the running host.
    for argv in (a, b):
        assert argv[argv.index("--dist-init-addr") + 1] == "192.0.2.10:20000"
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--tp-size") + 1] == "16"
    assert zero.world_size == 16 and zero.node_gpus == 8


def test_rank_zero_is_the_first_node_listed_not_the_first_host():
    config = case_config({"config": {"hosts": [{"name": "a", "rehearsal": "a"}, {"name": "b", "address": "10.0.0.12",
                                                                                      "hostKey": None}],
                                     "strategy": {"tpSize": 16, "nodes": ["b", "a"]}}})
    config["hosts"][1].pop("hostKey")
    plans = build_plans(parse_settings("x", config))
    assert [(n, p.settings.node.rank) for n, p in plans] == [("b", 0), ("a", 1)]
    assert all(p.settings.node.dist_init_addr == "10.0.0.12:20000" for _, p in plans)


def test_an_ipv6_rank_zero_is_bracketed():
    config = case_config({"config": {"hosts": [{"name": "a", "address": "fd00::1"}, {"name": "b", "address": "fd00::2"}],
                                     "strategy": {"tpSize": 16, "nnodes": 2}}})
    plans = build_plans(parse_settings("x", config))
    assert plans[1][1].settings.node.dist_init_addr == "[fd00::1]:20000"


def test_node_network_defaults_reach_each_unit_and_a_setting_wins():
    (_, zero), _ = shipped()
    tcp = node_networks()["tcp"]["environment"]
    # NCCL_IB_DISABLE is Pulumi.yaml's (the shared file); the rest are the unit's own lines.
    assert all(zero.environment[k] == v for k, v in tcp.items())
    assert 'Environment=NCCL_SOCKET_NTHREADS=4' in zero.unit.text
    config = case_config({"config": {"hosts": [{"name": "a", "rehearsal": "a"}, {"name": "b", "rehearsal": "b"}],
                                     "strategy": {"tpSize": 16, "nnodes": 2, "socketInterface": "eth1"},
                                     "serving": {"environment": {"NCCL_SOCKET_NTHREADS": "2"}}}})
    plan = build_plans(parse_settings("x", config))[0][1]
    assert plan.environment["NCCL_SOCKET_IFNAME"] == plan.environment["GLOO_SOCKET_IFNAME"] == "eth1"
    assert plan.environment["NCCL_SOCKET_NTHREADS"] == "2"


def test_one_node_stacks_write_no_multi_node_flag():
    plans = check_stack("tp8", from_files(ROOT, "tp8"), ROOT).plans
    argv = plans[0][1].unit.exec_start
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(argv)
    assert "NCCL_SOCKET_NTHREADS" not in plans[0][1].environment
