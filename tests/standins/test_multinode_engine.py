"""The rehearsal engine's multi-node world, for real on loopback: two engine processes (node 0
and node 1, each with its own simulated GPUs) meet at node 0's --dist-init-addr port, load in
step, and fail together when one goes away (issue 17, point 4)."""
from __future__ import annotations

import sys
import time

import pytest

from tests.standins.helpers import ENGINE_SRC, free_port, port_open, run_engine

sys.path.insert(0, str(ENGINE_SRC))
from sglang._rehearsal import rules  # noqa: E402
from sglang._rehearsal.args import parse  # noqa: E402
from sglang._rehearsal.performance import Layout, PerformanceModel  # noqa: E402

KIMI_LAYERS = 61
TP16 = ["--tp-size", "16"]


@pytest.fixture
def world(launch, engine_env, tmp_path):
    """start(node_rank, *layout, profile=..., **env) -> Engine: one node of a 2-node world
    meeting at this test's rendezvous port, each node with its own GPU state directory."""
    dist_port = free_port()

    def start(node_rank: int, *layout, profile="rtx-pro-6000-8", nnodes=2, **env):
        state = tmp_path / f"gpu-node{node_rank}-{time.monotonic_ns()}"
        state.mkdir()
        flags = [*(layout or TP16), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
                 "--dist-init-addr", f"127.0.0.1:{dist_port}", "--host", "127.0.0.1"]
        return launch(*flags, env=engine_env(profile, REHEARSAL_GPU_STATE_DIR=state, **env))

    start.dist_port = dist_port
    return start


# --------------------------------------------------------------------------- pure rules

@pytest.mark.parametrize("flags, node_rank, tp, pp", [
    (["--tp-size", "16", "--nnodes", "2"], 0, range(0, 8), range(0, 1)),
    (["--tp-size", "16", "--nnodes", "2"], 1, range(8, 16), range(0, 1)),
    (["--tp-size", "8", "--pp-size", "2", "--nnodes", "2"], 1, range(0, 8), range(1, 2)),
    (["--tp-size", "4", "--pp-size", "4", "--nnodes", "2"], 1, range(0, 4), range(2, 4)),
    (["--tp-size", "8"], 0, range(0, 8), range(0, 1)),
])
def test_each_node_runs_the_ranks_sglang_gives_it(flags, node_rank, tp, pp):
    args = parse(["--model-path", "x", *flags, "--node-rank", str(node_rank)])
    assert rules.node_ranks(args) == (tp, pp)
    assert len(rules.gpu_ids_for_node(args)) == len(tp) * len(pp)


def test_spanning_nodes_is_slower_than_one_node_and_tcp_slower_than_infiniband():
    model = PerformanceModel.load()
    one = model.output_tok_s(Layout(tp=8), KIMI_LAYERS, 1)
    ib = model.output_tok_s(Layout(tp=16, nnodes=2), KIMI_LAYERS, 1)
    tcp = model.output_tok_s(Layout(tp=16, nnodes=2, cross_node="tcp"), KIMI_LAYERS, 1)
    assert tcp < ib < one
    # PP over nodes keeps TP inside a node: only the stage hop crosses (a little slower).
    pp_one, pp_two = (model.output_tok_s(Layout(tp=8, pp=2, nnodes=n), KIMI_LAYERS, 1) for n in (1, 2))
    assert pp_two < pp_one and pp_two > 0.95 * pp_one
    with pytest.raises(ValueError, match="cross-node link 'roce'"):
        model.round_ms(Layout(tp=16, nnodes=2, cross_node="roce"), KIMI_LAYERS, 1)


def test_multi_node_faults_need_a_multi_node_world(engine_env):
    res = run_engine(engine_env(REHEARSAL_FAULT="never_join"), "--tp-size", "8", "--port", str(free_port()))
    assert res.returncode == 1 and "needs a multi-node world" in res.stderr


# --------------------------------------------------------------------------- a world that comes up

@pytest.mark.parametrize("layout, tp, pp, node1_prefix", [
    (TP16, 16, 1, " TP8]"),
    (["--tp-size", "8", "--pp-size", "2"], 8, 2, " PP1 TP0]"),
])
def test_two_nodes_become_ready_on_node0_and_node1_runs_the_dummy_health_server(world, layout, tp, pp, node1_prefix):
    node1 = world(1, *layout)  # started first: it retries until node 0 listens
    assert node1.wait_log("TCP client failed to connect/validate")
    assert not port_open(node1.port)
    node0 = world(0, *layout)
    node0.wait_ready()
    assert node1.wait_log("Starting dummy health check server at 127.0.0.1:")
    info = node0.get("/server_info")[1]
    assert (info["tp_size"], info["pp_size"], info["nnodes"], info["node_rank"]) == (tp, pp, 2, 0)
    r = info["rehearsal"]
    assert r["world_size"] == 16 and r["gpus_per_node"] == 8 and len(r["gpus"]) == 8
    assert [(n["node_rank"], n["gpu_ranks"]) for n in r["nodes"]] == [(0, [0, 7]), (1, [8, 15])]
    assert r["performance"]["cross_node"] == "infiniband"
    assert node0.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})[0] == 200
    assert node1_prefix + " Load weight begin" in node1.log
    # Node 1 serves SGLang's dummy health server and nothing else.
    for path in ("/health", "/health_generate", "/ping"):
        assert node1.get(path)[0] == 200, path
    assert node1.get("/server_info")[0] == 404 and node1.get("/v1/models")[0] == 404
    assert node1.post("/generate", {"text": "hi"})[0] == 404
    # Stopping a node fails the world: node 0 loses node 1 the way NCCL loses a peer.
    assert node1.terminate() == 0
    assert node0.wait_exit() == 1
    assert "NCCL error: remote process exited or there was a network error" in node0.log
    assert "node rank 1 (127.0.0.1) is gone" in node0.log


def test_node1_health_is_200_whatever_node0_says(world):
    node0 = world(0, REHEARSAL_FAULT="health_fail_after_ready")
    node1 = world(1)
    node0.wait_ready()
    assert node1.wait_log("Starting dummy health check server")
    assert node0.get("/health")[0] == 503 and node0.get("/health_generate")[0] == 503
    assert node1.get("/health")[0] == 200 and node1.get("/health_generate")[0] == 200


def test_node1_exits_when_node0_goes_away(world):
    node0, node1 = world(0), world(1)
    node0.wait_ready()
    assert node1.wait_log("Starting dummy health check server")
    node0.proc.kill()
    assert node1.wait_exit() == 1
    assert "node 0 (127.0.0.1:" in node1.log and "is gone" in node1.log
    assert not port_open(node1.port)


# --------------------------------------------------------------------------- a world that does not

def test_a_node_that_never_joins_times_node0_out_naming_it(world):
    node0 = world(0, REHEARSAL_RENDEZVOUS_SECONDS="2")
    node1 = world(1, REHEARSAL_FAULT="never_join", REHEARSAL_RENDEZVOUS_SECONDS="2")
    t0 = time.monotonic()
    assert node0.wait_exit(timeout=20) == 1
    # The bound is the promise (node 0 gives up at its rendezvous deadline, ~3 s, not at the 20 s
    # wait above): kept, with room for a loaded machine.
    assert time.monotonic() - t0 < 15
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 8/16 clients joined." in node0.log
    assert "node rank(s) 1 did not join the rendezvous" in node0.log
    assert not port_open(node0.port) and "ready to roll" not in node0.log
    assert node1.wait_exit(timeout=20) == 1
    assert "The client socket has timed out after 2000ms" in node1.log


def test_node1_alone_gives_up_when_the_window_closes(world):
    node1 = world(1, REHEARSAL_RENDEZVOUS_SECONDS="1.5")
    assert node1.wait_exit(timeout=20) == 1
    assert f"The client socket has timed out after 1500ms while trying to connect to (127.0.0.1, {world.dist_port})." in node1.log


def test_a_node_that_crashes_after_joining_fails_node0(world):
    node0 = world(0, REHEARSAL_LOAD_SECONDS="1")
    node1 = world(1, REHEARSAL_FAULT="crash_after_join", REHEARSAL_LOAD_SECONDS="1")
    assert node1.wait_exit() == 1 and "rehearsal fault crash_after_join" in node1.log
    assert node0.wait_exit() == 1
    assert "node rank 1 (127.0.0.1) is gone" in node0.log and "ready to roll" not in node0.log


def test_a_node_with_another_layout_is_refused_at_the_rendezvous(world):
    node0 = world(0, *TP16)
    node1 = world(1, "--tp-size", "8", "--pp-size", "2")
    assert node0.wait_exit() == 1 and node1.wait_exit() == 1
    assert "node rank 1 (127.0.0.1) joined with tp_size=8; node 0 has tp_size=16" in node0.log
    assert "joined with tp_size=8" in node1.log


def test_nodes_with_different_gpus_fail_unbalanced_like_sglang(world):
    # SGLang sizes memory by the world's smallest GPU: the H200 node (141 GB) next to RTX PRO
    # 6000s (96 GB) fails "unbalanced", and node 0 then loses it.
    node0 = world(0)
    node1 = world(1, profile="h200-8")
    assert node1.wait_exit() == 1 and "The memory capacity is unbalanced" in node1.log
    assert node0.wait_exit() == 1 and "ready to roll" not in node0.log


def test_the_rendezvous_port_in_use(world):
    import socket
    with socket.socket() as busy:
        busy.bind(("", world.dist_port))
        busy.listen(1)
        node0 = world(0)
        assert node0.wait_exit() == 1
    assert "torch.distributed.DistNetworkError: The server socket has failed to listen" in node0.log
    assert "EADDRINUSE" in node0.log
