"""Multi-node readiness (issue 17): rank 0's verdict and every other rank judged by its unit and
journal only (readiness.judge_ranks), one JSON case a file (tests/data/ranks/); and no code path
of the multi-node switch, its rollback or `status` asks a rank >= 1 over HTTP (a recording fake
transport, `ssh._run`, answering as two nodes would)."""
import contextlib
import json
import shlex
import time

import pytest

from components.core import fitness_read, ledger
from components.core import readiness as R
from components.core import reads, switch
from components.core import status as S
from components.remote import host_lock, multinode, probe, providers, ssh
from components.remote import status as remote_status

from .casedata import cases


@pytest.mark.parametrize("name,case", cases("ranks"), ids=lambda x: x if isinstance(x, str) else "")
def test_rank_case(name, case):
    baseline = R.UnitState(**case["baseline"])
    ranks = [R.RankState(r["rank"], r["host"], R.rank_problem(baseline, R.UnitState(**r["now"])), r["joined"])
             for r in case["ranks"]]
    status, reason, culprit = R.judge_ranks(case["rank0"]["status"], case["rank0"]["reason"], ranks)
    assert (status, reason, culprit) == (case["expect"]["status"], case["expect"]["reason"], case["expect"]["culprit"])


def test_a_rank_that_has_not_joined_is_named_while_rank_0_loads():
    # Issue 36.9: named at the first look, not after rank 0's deadline; one that stopped before
    # joining ends the wait (rank 0 can never be ready without it).
    note, pointless = R.ranks_waited_for(["rank 1 on node1 (10.213.1.2)"], [])
    assert note.startswith("waiting for rank 1 on node1 (10.213.1.2) to join") and R.JOINED_LINE in note
    assert pointless is None
    note, pointless = R.ranks_waited_for(["rank 1 on node1 (a)"], ["rank 2 on node2 (b): its unit is failed (exit-code, exit status 1)"])
    assert "rank 2 on node2 (b)" in note and "rank 1" not in note
    assert pointless == "rank 2 on node2 (b): its unit is failed (exit-code, exit status 1), before it joined rank 0"
    assert R.ranks_waited_for([], []) == ("every rank joined", None)


def test_status_judges_a_running_rank_by_its_journal_not_its_http_answer():
    assert R.rank_now(1, 2, joined=True) == (R.READY, "")
    status, reason = R.rank_now(1, 2, joined=False)
    assert status == R.LOADING and "rank 1 of 2 has not joined rank 0" in reason and R.JOINED_LINE in reason


# --- no HTTP probe of a rank >= 1 ------------------------------------------------------------------

UNIT, PREVIOUS = "sglang-kimi-k2.6-tp16x2.service", "sglang-kimi-k2.6-pp16x2.service"
NODES = {"10.213.1.1": 0, "10.213.1.2": 1}  # address -> rank


def _show(unit: str, state: str = "active", sub: str = "running") -> str:
    return (f"Id={unit}\nActiveState={state}\nSubState={sub}\nMainPID=77\nNRestarts=0\nResult=success\n"
            "ExecMainStatus=0\nUnitFileState=enabled\nLoadState=loaded\n")


class TwoNodes:
    """Both nodes' answers to every command a multi-node switch, its rollback and `status` send,
    each command recorded with the rank of the node it ran on. An HTTP request is a command that
    runs curl or names a URL: any of them on rank 1 (or naming rank 1's address) is the bug, and
    is answered 200, as the dummy server a rank >= 1 runs would answer (it proves nothing).
    `crash`: rank 0's new unit fails at once, and the previous layout (PREVIOUS, a multi-node one
    too) is started again on both."""

    def __init__(self, crash: bool = False, loading: int = 1):
        self.crash = crash
        self.ran: list[tuple[int, list[str]]] = []
        self.loading = loading  # rank 0's first polls find its port closed: a switch's wait looks at rank 1 then

    def http(self, rank: int) -> list[str]:
        said = [(k, " ".join(argv)) for k, argv in self.ran]
        return [c for k, c in said if ("curl" in c or "http://" in c) and (k == rank or (rank and "10.213.1.2" in c))]

    def scripts(self, rank: int) -> list[str]:
        """The read-only scripts (reads.py) and commands that ran on `rank`, by name."""
        names = {reads.RANK_SCRIPT: "RANK_SCRIPT", reads.SNAPSHOT_SCRIPT: "SNAPSHOT_SCRIPT", probe.START_SCRIPT: "START_SCRIPT"}
        return [names.get(argv[2], "sh") if argv[:2] == ["sh", "-c"] else argv[0] for k, argv in self.ran if k == rank]

    def run(self, t, command, input, timeout, purpose):
        rank = NODES[t.host]
        argv = shlex.split(command)
        self.ran.append((rank, argv))
        script = argv[2] if argv[:2] == ["sh", "-c"] else ""
        if script == switch.MANAGED_UNITS_SCRIPT:
            return 0, (f"@@listeners\n\n@@units\n{PREVIOUS}\n@@show\n{_show(PREVIOUS)}\n").encode(), b""
        if script == probe.START_SCRIPT:
            return 0, f"1700000000\n@@start\n@@rc=0\n@@unit\n{_show(argv[5], 'activating', 'start')}".encode(), b""
        if script == reads.SNAPSHOT_SCRIPT or script == reads.INFO_SCRIPT:
            unit = argv[4] if script == reads.SNAPSHOT_SCRIPT else UNIT
            if self.crash and unit == UNIT:
                return 0, f"{_show(unit, 'failed', 'failed')}@@health\n000 7\n@@ready\n0\n".encode(), b""
            if self.loading and rank == 0 and unit == UNIT:
                self.loading -= 1
                return 0, f"{_show(unit)}@@health\n000 7\n@@ready\n0\n".encode(), b""
            info = {"tp_size": 16, "nnodes": 2, "node_rank": rank}
            return 0, (f"{_show(unit)}@@health\n200 0\n@@ready\n1\n@@server_info\n{json.dumps(info)}\n200\n"
                       "@@get_server_info\n\n404\n@@models\n{}\n200\n").encode(), b""
        if script == reads.RANK_SCRIPT:
            return 0, f"{_show(argv[4])}@@joined\n1\n".encode(), b""
        if script == reads.SERVICE_SCRIPT:
            return 0, f"{_show(argv[4])}@@cmdline\n\n@@environ\n\n@@manager\n".encode(), b""
        if script == fitness_read.FITNESS_SCRIPT:
            return 0, b"@@baseline\n@@end\n", b""  # never benchmarked: nothing to decide
        if script == ledger.FAILED_START_SCRIPT:
            return 0, b"NVIDIA H200, 580.95.05\n@@sglang\n", b""
        if argv[0] == "journalctl":
            return 0, f"node python3[77]: {R.JOINED_LINE}\n".encode(), b""
        if argv[:2] == ["systemctl", "show"] and "ExecStart" in argv:
            return 0, (f"{{ path=/opt/venv/bin/python ; argv[]=python -m sglang.launch_server --host 0.0.0.0 "
                       f"--port 30000 --nnodes 2 --node-rank {rank} }}\n").encode(), b""
        if argv[:2] == ["systemctl", "show"]:
            return 0, _show(argv[-1]).encode(), b""
        if argv[0] == "systemctl":
            return 0, b"", b""
        raise AssertionError(f"a command a multi-node switch does not run: {command}")


def _node(address: str, rank: int) -> dict:
    return {"name": f"node{rank}", "rank": rank, "execStart": f"python -m sglang.launch_server --node-rank {rank}",
            "environment": {}, "connection": {"host": address, "port": 22, "user": "root", "privateKey": "k", "hostKey": "h"}}


@pytest.fixture
def two_nodes(monkeypatch):
    def make(crash: bool = False, loading: int = 1, nodes: TwoNodes | None = None) -> TwoNodes:
        nodes = nodes or TwoNodes(crash, loading)
        monkeypatch.setattr(ssh, "_run", nodes.run)
        # The host lock and the pinned connection are a real host's (tests/e2e); a rollback's rank
        # waits settleSeconds + 2 s before it looks at the unit again: no wait here.
        monkeypatch.setattr(ssh, "one_connection", lambda t, during: contextlib.nullcontext())
        monkeypatch.setattr(host_lock, "acquire", lambda t, wait=0: None)
        monkeypatch.setattr(time, "sleep", lambda seconds: None)
        return nodes
    return make


def _props() -> dict:
    ranks = [_node(a, k) for a, k in NODES.items()]
    return {"connection": ranks[0]["connection"], "unit": UNIT, "port": 30000, "bind": "0.0.0.0", "declared": {"tp_size": 16},
            "readiness": {"settleSeconds": 0}, "active": True, "enabled": True, "configHash": "h",
            "execStart": ranks[0]["execStart"], "environment": {}, "secretEnvironment": {}, "ranks": ranks}


def _switch(two_nodes) -> TwoNodes:
    nodes = two_nodes()
    outs = multinode.MultiNodeServiceProvider().create(_props()).outs
    assert outs["readinessReport"]["status"] == R.READY, outs["readinessReport"]
    # Looked at while rank 0 loaded, then judged by its unit and journal.
    assert {"RANK_SCRIPT", "journalctl"} <= set(nodes.scripts(1)), nodes.scripts(1)
    return nodes


def _rollback(two_nodes) -> TwoNodes:
    """Rank 0 fails: the previous layout starts again on both; rank 1's own by its unit only."""
    nodes = two_nodes(crash=True)
    with pytest.raises(providers.DeployError) as exc:
        multinode.MultiNodeServiceProvider().create(_props())
    nodes.said = str(exc.value)
    return nodes


def _status(two_nodes) -> TwoNodes:
    nodes = two_nodes(loading=0)
    argv = ["python", "-m", "sglang.launch_server", "--nnodes", "2", "--node-rank"]
    for address, rank in NODES.items():
        t = ssh.Target(host=address, port=22, user="root", private_key="k", host_key="h")
        unit = S.HostUnit(name=UNIT, stack="tp16x2", active_state="active", sub_state="running", enabled=True, main_pid=77,
                          since="", uptime_seconds=60.0, argv=[*argv, str(rank)])
        report = remote_status._readiness(t, unit, {})
        assert report["status"] == R.READY, report
    return nodes


@pytest.mark.parametrize("path", [_switch, _rollback, _status], ids=["switch", "rollback", "status"])
def test_a_rank_is_never_judged_by_http(two_nodes, path):
    """Every code path that judges the ranks of a multi-node layout (a switch's wait, a failed
    switch's rollback of the previous multi-node layout, `status`): no HTTP request on rank 1's
    node or to its address, while rank 0 is asked (the recording is not blind)."""
    nodes = path(two_nodes)
    assert nodes.http(1) == []
    assert nodes.http(0), "rank 0 gives the verdict over HTTP: the recording must see it"
    if path is _rollback:
        assert f"rolled back: {PREVIOUS} (rank 1) runs again" in nodes.said, nodes.said


# --- the token never in a failed multi-node switch's message --------------------------------------

# An HF token's shape (hf_ and 34 letters and digits), made up.
TOKEN = "hf_Mn4TqW8rLz2XcV6bKp9YdH3sJf7GuE5aRo"


class LeakyTwoNodes(TwoNodes):
    """Rank 0's new unit fails at once, and every journal read holds the HF token, as the journal of
    a server that prints its environment when it fails does (the rehearsal engine's
    crash_printing_environment). `rollback_fails`: the previous layout does not come back on
    rank 0 either (nothing serves: RollbackFailed, its outputs recorded)."""

    def __init__(self, rollback_fails: bool):
        super().__init__(crash=True)
        self.rollback_fails = rollback_fails

    def run(self, t, command, input, timeout, purpose):
        argv = shlex.split(command)
        if argv[0] == "journalctl":
            self.ran.append((NODES[t.host], argv))
            return 0, (f"node python3[77]: {R.JOINED_LINE}\nnode python3[77]: OSError: could not load the checkpoint's "
                       f"weights; environment of the failed process: HF_TOKEN={TOKEN} NCCL_ALGO=Ring\n").encode(), b""
        if self.rollback_fails and argv[:2] == ["sh", "-c"] and argv[2] == reads.SNAPSHOT_SCRIPT and argv[4] == PREVIOUS \
                and NODES[t.host] == 0:
            self.ran.append((0, argv))
            return 0, f"{_show(PREVIOUS, 'failed', 'failed')}@@health\n000 7\n@@ready\n0\n".encode(), b""
        return super().run(t, command, input, timeout, purpose)


@pytest.mark.parametrize("rollback_fails", [False, True], ids=["rolled back", "rollback failed"])
def test_a_failed_multi_node_switch_never_carries_the_token(two_nodes, capsys, rollback_fails):
    """The multi-node provider's own path (MultiNodeServiceProvider.create to the error the engine
    shows, through the switch executor's `fail`): the failed rank's journal tail holds the HF
    token; the token (secretEnvironment) is in none of the error, the outputs a failed rollback
    records (`switchFailure`, the readiness report with its `rollback`), or the lines the
    provider printed. Asserted on the value itself; not blind: the journal's line is in the
    message."""
    nodes = two_nodes(nodes=LeakyTwoNodes(rollback_fails))
    props = {**_props(), "secretEnvironment": {"HF_TOKEN": TOKEN}}
    try:
        outs = multinode.MultiNodeServiceProvider().create(props).outs
        assert rollback_fails, "a failed start that rolled back must fail the create"
        shown = outs["switchFailure"] + json.dumps(outs["readinessReport"])
        assert f"node0: {providers.ROLLBACK_FAILED}" in outs["readinessReport"]["rollback"], outs["readinessReport"]
    except providers.DeployError as exc:
        assert not rollback_fails, exc
        shown = str(exc)
    printed = capsys.readouterr()
    assert TOKEN not in shown and TOKEN not in printed.out + printed.err
    assert "python3[77]: OSError: could not load the checkpoint's weights; environment of the failed process: HF_TOKEN=" \
        in shown and "NCCL_ALGO=Ring" in shown, shown
    assert any(argv[0] == "journalctl" for _, argv in nodes.ran)  # the tail was read from the host
