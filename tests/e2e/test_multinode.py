"""Issue 17 on two real rehearsal hosts and the real Pulumi engine: one SGLang server over two
nodes (TP16 = 2 x 8 GPUs), a rank that never joins, drift on rank 1's unit. One module, its two
hosts shared by the tests, in order."""
from __future__ import annotations

import json
import subprocess

import pytest
from pulumi import automation as auto

from .conftest import FAST_ENV, FAST_READINESS, make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
# Under /usr/lib, where packages put drop-ins: a switch removes the unit's own drop-ins under /etc
# and /run (hand edits, switch.own_drop_ins), which would take the injected fault away.
DROP_IN = "/usr/lib/systemd/system/" + UNIT.format("tp16x2") + ".d"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, rehearsal_host_factory):
    a, b = rehearsal_host_factory(), rehearsal_host_factory()
    d = make_deployment(tmp_path_factory.mktemp("multinode"), a)

    def two_hosts(config):
        config["gpu-serving:hosts"] = {"value": [{"name": "node0", "rehearsal": a.name}, {"name": "node1", "rehearsal": b.name}]}
    d.edit_project(two_hosts)
    d.write_stack_file("tp16x2", {"tpSize": 16, "nodes": ["node0", "node1"]}, {
        "gpu-serving:serving": {"environment": FAST_ENV},
        "gpu-serving:readiness": {**FAST_READINESS, "timeoutSeconds": 25},
    })
    d.hosts = {"node0": a, "node1": b}
    return d


def active(host, strategy: str) -> str:
    return host.run(f"systemctl is-active {UNIT.format(strategy)}").stdout.strip()


def main_pid(host, strategy: str) -> str:
    return host.run(f"systemctl show -p MainPID --value {UNIT.format(strategy)}").stdout.strip()


def test_a_node_that_cannot_reach_rank_0_stops_the_run_before_any_unit_file(nodes):
    """First in the module: the stack's rendezvous check runs when it is created. node1 has no
    route to node0 here (an `unreachable` route in node1's own network namespace, set from this
    machine: root on the host may not change routes): the run names node1 and rank 0's address,
    and no node has the layout's unit file."""
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]

    def route(verb: str):
        subprocess.run(["ip", "-n", node1.netns, "route", verb, "unreachable", f"{node0.address}/32"], check=True)
    route("add")
    try:
        with pytest.raises(auto.CommandError) as info:
            nodes.stack("tp16x2").up(on_output=print)
    finally:
        route("del")
    text = str(info.value)
    assert f"node1 (rank 1) cannot reach rank 0 (node0) at {node0.address}: no route" in text, text[-3000:]
    assert "nothing was changed on any node" in text, text[-3000:]
    for host in (node0, node1):
        assert host.run(f"test -e /etc/systemd/system/{UNIT.format('tp16x2')}").returncode != 0


def test_a_rank_that_never_joins_times_out_naming_it_and_both_nodes_serve_as_before(nodes):
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]
    nodes.stack("tp8").up(on_output=print)
    assert active(node0, "tp8") == active(node1, "tp8") == "active"
    # The fault on rank 1 only: a drop-in on node1 (serving.environment would reach both nodes).
    node1.run(f"mkdir -p {DROP_IN} && printf '[Service]\\nEnvironment=REHEARSAL_FAULT=never_join\\n' > {DROP_IN}/fault.conf",
              check=True)
    lines: list[str] = []
    try:
        with pytest.raises(auto.CommandError) as info:
            nodes.stack("tp16x2").up(on_output=lines.append)
    finally:
        node1.run(f"rm -rf {DROP_IN} && systemctl daemon-reload", check=True)
    text = str(info.value)
    assert "readiness: timed_out: rank 1 on node1" in text and "did not join" in text, text[-3000:]
    assert "journalctl -u " + UNIT.format("tp16x2") + " on node1" in text, text[-3000:]
    # Issue 36.9: named while rank 0 still loads (its progress line), not only at its deadline;
    # the failure is named by node1, the rank that explains it, not by rank 0's node0.
    said = "\n".join(lines) + text
    waiting = f"waiting for rank 1 on node1 (root@{node1.address}:{node1.port}) to join"
    assert waiting in said, said[-3000:]
    assert said.index(waiting) < said.index("did not join"), said[-3000:]
    assert "hosts[node1]: readiness: timed_out" in text and "hosts[node0]: readiness" not in text, text[-3000:]
    for host in (node0, node1):
        assert active(host, "tp8") == "active" and active(host, "tp16x2") != "active"


def test_tp16_across_two_nodes_is_ready_with_the_world_confirmed_on_rank_0(nodes):
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]
    result = nodes.stack("tp16x2").up(on_output=print)
    readiness = result.outputs["readiness"].value
    assert readiness["status_when_checked"] == "ready", readiness
    # Judged on rank 0's host (its probe asks the server there); the endpoint is rank 0's address.
    assert readiness["layout"]["tp_size"] == 16 and readiness["url"] == "http://127.0.0.1:30001", readiness
    assert result.outputs["endpoint"].value == f"http://{node0.address}:30001"
    assert result.outputs["nodes"].value == {"node0": {"rank": 0, "address": node0.address},
                                             "node1": {"rank": 1, "address": node1.address}}
    # Rank 0 really holds the whole world: its server, asked on node0, says tp 16 over 2 nodes.
    info = json.loads(node0.run("curl -sf http://127.0.0.1:30001/server_info", check=True).stdout)
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (16, 2, 0), info
    for host in (node0, node1):
        assert active(host, "tp16x2") == "active" and active(host, "tp8") == "inactive"


def test_status_right_after_the_multi_node_deploy_sees_no_drift_and_judges_rank_1_by_its_journal(nodes):
    """Issue 36.9: `status` renders each rank's unit with rank 0's address as the program does
    (no false drift), and judges rank 1 as the switch does, by its unit and journal: its HTTP
    answer is a dummy server's (before: layout_mismatch)."""
    done = nodes.components("status", "--stack", "tp16x2", "--json", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    hosts = {h["entry"]: h for h in doc["hosts"]}
    assert set(hosts) == {"node0", "node1"}, doc
    for name, h in hosts.items():
        assert h["serving"]["unit"] == UNIT.format("tp16x2") and h["stacks"][0]["drift"] == [], h
        assert h["readiness"]["status"] == "ready", h
    assert hosts["node0"]["readiness"]["layout"]["tp_size"] == 16
    assert hosts["node1"]["readiness"]["probe"].startswith("its unit and journal: rank 1 of 2"), hosts["node1"]
    text = nodes.components("status", "--stack", "tp16x2", timeout=300).stdout
    assert "layout_mismatch" not in text and "DRIFT" not in text, text


def test_drift_on_rank_1s_unit_is_repaired_there_only(nodes):
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]
    pids = {n: main_pid(h, "tp16x2") for n, h in nodes.hosts.items()}
    path = "/etc/systemd/system/" + UNIT.format("tp16x2")
    node1.run(f"sed -i 's/--context-length 32768/--context-length 16384/' {path}", check=True)
    stack = nodes.stack("tp16x2")
    planned: dict[str, str] = {}
    contents: dict[str, str] = {}

    def record(event):
        pre = event.resource_pre_event
        if pre is not None and pre.metadata.op.value not in ("same", "refresh", "read"):
            name = pre.metadata.urn.rsplit("::", 1)[-1]
            planned[name] = pre.metadata.op.value
            for side in ("old", "new"):
                state = getattr(pre.metadata, side)
                contents[side] = ((state.inputs if state else None) or {}).get("content") or ""
    preview = stack.preview(refresh=True, diff=True, on_output=print, on_event=record)
    # Exactly one change: node1's unit file, from the hand edit back to its declared content;
    # nothing on node0, and neither rank's service is restarted.
    assert planned == {"node1-unit-file": "update"}, (planned, preview.stdout[-3000:])
    assert "--context-length 16384" in contents["old"] and "--context-length 32768" in contents["new"], contents
    assert "--node-rank 1" in contents["new"]
    stack.up(on_output=print)
    assert "--context-length 32768" in node1.run(f"cat {path}").stdout
    assert {n: main_pid(h, "tp16x2") for n, h in nodes.hosts.items()} == pids
    assert active(node0, "tp16x2") == active(node1, "tp16x2") == "active"


def test_a_drop_in_on_rank_1_is_drift_and_removed_there_without_restarting_the_world(nodes):
    # `systemctl edit` of node1's rank (not applied: no restart): drift on the multi-node service
    # naming the node; the up removes it on node1 only, and neither rank restarts.
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]
    pids = {n: main_pid(h, "tp16x2") for n, h in nodes.hosts.items()}
    own = f"/etc/systemd/system/{UNIT.format('tp16x2')}.d"
    node1.run(f"mkdir -p {own} && printf '[Service]\\nLimitNOFILE=4096\\n' > {own}/override.conf && systemctl daemon-reload",
              check=True)
    lines: list[str] = []
    with pytest.raises(auto.CommandError):
        nodes.stack("tp16x2").preview(refresh=True, expect_no_changes=True, diff=True, on_output=lines.append)
    assert f"node1:{own}/override.conf" in "\n".join(lines), "\n".join(lines)[-3000:]
    nodes.stack("tp16x2").up(on_output=print)
    assert node1.run(f"test -e {own}").returncode != 0
    assert {n: main_pid(h, "tp16x2") for n, h in nodes.hosts.items()} == pids
    assert active(node0, "tp16x2") == active(node1, "tp16x2") == "active"
    nodes.stack("tp16x2").preview(refresh=True, expect_no_changes=True)


def enabled(host, strategy: str) -> str:
    return host.run(f"systemctl is-enabled {UNIT.format(strategy)}").stdout.strip()


def test_switching_out_of_the_multi_node_layout_serves_single_node_on_every_node(nodes):
    """Last: back from TP16 over two nodes to TP8 on each host (a fleet of two): every node stops
    its rank, serves TP8, and only TP8 is enabled; the multi-node stack's preview then sees its
    layout superseded, not silently running."""
    node0, node1 = nodes.hosts["node0"], nodes.hosts["node1"]
    result = nodes.stack("tp8").up(on_output=print)
    readiness = result.outputs["readiness"].value  # a fleet: one report per host entry
    assert {n: r["status_when_checked"] for n, r in readiness.items()} == {"node0": "ready", "node1": "ready"}, readiness
    for host in (node0, node1):
        assert active(host, "tp8") == "active" and active(host, "tp16x2") != "active"
        assert enabled(host, "tp8") == "enabled" and enabled(host, "tp16x2") != "enabled"
        info = json.loads(host.run("curl -sf http://127.0.0.1:30001/server_info", check=True).stdout)
        assert (info["tp_size"], info.get("nnodes", 1)) == (8, 1), info
    # And back again: the multi-node layout comes up on both nodes from the single-node one.
    again = nodes.stack("tp16x2").up(on_output=print).outputs["readiness"].value
    assert again["status_when_checked"] == "ready" and again["layout"]["tp_size"] == 16, again
    for host in (node0, node1):
        assert active(host, "tp16x2") == "active" and active(host, "tp8") == "inactive"
        assert enabled(host, "tp16x2") == "enabled" and enabled(host, "tp8") != "enabled"
