"""Issue 19, part 1, for real: the stacks' state in a real PostgreSQL (docs/teams-and-watch.md), the engine
(`pulumi up`) deploying to a rehearsal host through it.

- a deploy through the `postgres://` backend: the checkpoint is a row of the state table, nothing
  is written to a state directory;
- two `pulumi up` of the same stack at once: the second is refused by the engine's stack lock (a
  row under .pulumi/locks/ in the same table: Pulumi's lock, not gpu-serving's, checked here as
  engine configuration the project relies on), naming the holder, and runs nothing on the host;
- two different stacks at once: both pass the engine's locks and meet at the host lock
  (gpu-serving's own, on the host), which serialises them as with a file backend;
- PostgreSQL stopped mid-run: the run fails saying the state database is unreachable; started
  again, the stale stack lock is reported, `pulumi cancel` clears it, and the next `up` converges,
  with no resource of any stack lost.

One PostgreSQL server and one rehearsal host for the module; the steps run in order."""
from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from pulumi import automation as auto

from tests import hardening_support as H
from tests.postgres_support import PostgresServer
from tests.pulumi_env import engine_env

from .conftest import make_deployment

pytestmark = [pytest.mark.engine, pytest.mark.rehearsal]

UNIT = "sglang-kimi-k2.6-{}.service"
STRATEGIES = ("tp8", "ep8", "pp8")
# Each switch loads for 6 s: long enough to act while a run is in the middle of one.
LOAD_SECONDS = "6"
PROJECT = "gpu-serving"


@pytest.fixture(scope="module")
def server():
    s = PostgresServer.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def d(tmp_path_factory, rehearsal_host_factory, server):
    host = rehearsal_host_factory()
    tmp = tmp_path_factory.mktemp("team-state")
    d = make_deployment(tmp, host)
    # What a team member does (docs/teams-and-watch.md): the URL without a password, the password from the
    # environment; scripts/env.sh keeps both.
    d.env = engine_env(pulumi_home=tmp / "pulumi-home", backend_url=server.url, passphrase="e2e-test")
    d.env["PGPASSWORD"] = server.password
    d.env.pop("PGPASSFILE", None)
    d.edit_project(lambda c: c["gpu-serving:serving"]["value"]["environment"].update(REHEARSAL_LOAD_SECONDS=LOAD_SECONDS))
    H.install_command_log(host)
    d.file_state = tmp / "state"
    return d


def states(d) -> dict[str, str]:
    return H.unit_states(d, STRATEGIES, UNIT)


def serving_one(d) -> str:
    return H.serving_one(d, STRATEGIES, UNIT)


def checkpoint_key(stack: str) -> str:
    return f"pulumi_state/.pulumi/stacks/{PROJECT}/{stack}.json"


def lock_keys(server, stack: str) -> list[str]:
    return [k for k in server.state_keys() if k.startswith(f"pulumi_state/.pulumi/locks/organization/{PROJECT}/{stack}/")]


def checkpoint(server, stack: str) -> dict:
    """The stack's checkpoint as the backend stored it (JSON of base64 of the blob)."""
    row = server.psql(f"SELECT data FROM pulumi_state WHERE key = '{checkpoint_key(stack)}'", database="pulumi_state")
    return json.loads(base64.b64decode(json.loads(row)["data"]))


def urns(stack: auto.Stack) -> set[str]:
    return {r["urn"] for r in stack.export_stack().deployment["resources"]}


def pulumi_up(d, stack: str, cold: bool = False) -> subprocess.Popen:
    """`pulumi up` as an operator types it. `cold` (GPU_SERVING_WARM_START=0): every process of the
    run descends from the CLI, so `freeze` finds them all; a warm run's program and provider are
    forks of the project's warm process (docs/performance-internals.md, "Warm start"), which freezing the CLI's tree
    would leave running."""
    env = {**d.env, "GPU_SERVING_WARM_START": "0"} if cold else d.env
    return subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview", "--non-interactive", "--stack", stack],
                            cwd=d.project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def process_tree(pid: int) -> list[int]:
    """pid and its descendants. The CLI starts each plugin in a process group of its own, so the
    run's processes are found by parentage, not by group."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def freeze(pid: int) -> list[int]:
    """SIGSTOP a run (its CLI first, so that it starts nothing new), every process by its PID."""
    stopped: list[int] = []
    while extra := [p for p in process_tree(pid) if p not in stopped]:
        H.signal_pids(extra, signal.SIGSTOP)
        stopped += extra
    return stopped


def test_a_deploy_through_postgres_keeps_the_state_in_the_database(d, server):
    result = d.stack("pp8").up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert serving_one(d) == "pp8"
    stored = checkpoint(server, "pp8")
    resources = stored["checkpoint"]["latest"]["resources"]
    assert len(resources) > 3 and {r["urn"] for r in resources} == urns(d.stack("pp8"))
    assert lock_keys(server, "pp8") == []  # released at the end of the run
    assert list(d.file_state.iterdir()) == []  # nothing went to a state directory
    # Drift check through the same backend: clean.
    d.stack("pp8").preview_refresh(expect_no_changes=True)


def test_the_engines_stack_lock_refuses_a_second_up_of_the_same_stack_before_it_reaches_the_host(d, server):
    """A check of the engine as this project builds and configures it, not of gpu-serving code: the
    stack lock is Pulumi's own (its DIY backend's lock row in the state table; gpu-serving takes no
    lock there). What the project relies on: with the `postgres://` backend scripts/env.sh keeps,
    the engine refuses a second `up` of a stack before its program or any provider runs, so the
    host sees nothing of it."""
    tp8 = d.stack("tp8")  # created in the database before either run
    history = len(tp8.history())
    record = H.HostRecord(d.host)
    first = pulumi_up(d, "tp8", cold=True)
    try:
        H.wait_for(lambda: lock_keys(server, "tp8"), 60, what="the first run's lock in the state table")
        # The first run switches tp8 in (6 s of load); freeze it, all of it, so that anything the
        # host sees from now on could only come from the second run.
        H.wait_for(lambda: states(d)["tp8"] in ("activating", "active"), 90, what="the first run to start tp8")
        frozen = freeze(first.pid)
        assert len(frozen) >= 3, frozen  # the CLI, the language host (with the program), the provider
        mark = record.mark()
        H.fault_injected("two pulumi up of one stack at once (shared state)")
        with pytest.raises(auto.CommandError) as refused:
            d.stack("tp8").up()
        commands, logins = record.since(mark)
        H.signal_pids(frozen, signal.SIGCONT)
        message = str(refused.value)
        assert "the stack is currently locked by 1 lock(s)" in message, message[-3000:]
        assert f"(pid {first.pid})" in message and "pulumi cancel" in message, message[-3000:]
        assert server.password not in message
        assert (commands, logins) == ([], 0)
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            H.signal_pids(process_tree(first.pid), signal.SIGCONT)
    assert first.returncode == 0, out[-3000:]
    assert serving_one(d) == "tp8"
    # One update recorded (the first); the refused one left no trace in the history or the lock table.
    runs = tp8.history()
    assert len(runs) == history + 1 and runs[0].result == "succeeded", runs
    assert lock_keys(server, "tp8") == []
    tp8.preview_refresh(expect_no_changes=True)
    H.fault_survived("two pulumi up of one stack at once (shared state)")


def test_two_stacks_at_once_pass_the_engine_locks_and_are_serialised_by_the_host_lock(d):
    assert serving_one(d) == "tp8"
    outputs: dict[str, list[str]] = {"ep8": [], "pp8": []}
    results = H.ups_at_once({name: d.stack(name) for name in outputs}, outputs)
    assert len(results) == 2, results
    for name, (kind, value, _) in results.items():
        assert "currently locked" not in str(value), (name, value)  # different stacks: different engine locks
        if kind == "error":
            assert "gpu-serving lock" in value, value[-3000:]
    finished = [name for name, r in sorted(results.items(), key=lambda kv: kv[1][2]) if r[0] == "ok"]
    assert finished, results
    assert serving_one(d) == finished[-1], (states(d), finished)
    waited = [name for name, lines in outputs.items() if any("waiting for the gpu-serving lock" in x for x in lines)]
    assert len(waited) == 1, waited


def test_postgres_stopped_mid_run_fails_clearly_and_the_next_run_converges_with_nothing_lost(d, server):
    serving = serving_one(d)
    target = next(s for s in STRATEGIES if s != serving)
    others = [s for s in STRATEGIES if s != target]
    before = {s: urns(d.stack(s)) for s in STRATEGIES}
    untouched = {s: checkpoint(server, s) for s in others}
    run = pulumi_up(d, target)
    try:
        H.wait_for(lambda: states(d)[target] in ("activating", "active"), 120, what=f"the run to start {target}")
        H.fault_injected("PostgreSQL stopped in the middle of a run")
        server.halt()
        out, _ = run.communicate(timeout=300)
    finally:
        if server.pid() is None:
            server.run_server()
    assert run.returncode != 0, out[-3000:]
    # What the operator reads: the state could not be saved, and the lock could not be removed.
    assert "failed to save snapshot" in out and "connection refused" in out, out[-3000:]
    assert "there was a problem deleting the lock" in out and "manual clean up may be required" in out, out[-3000:]
    assert server.password not in out
    # Back up: the dead run's lock is still there; the engine says so and how to clear it.
    with pytest.raises(auto.CommandError) as locked:
        d.stack(target).up()
    assert f"(pid {run.pid})" in str(locked.value) and "pulumi cancel" in str(locked.value), str(locked.value)[-3000:]
    d.stack(target).cancel()
    result = d.stack(target).up()
    assert result.outputs["readiness"].value["status_when_checked"] == "ready"
    assert serving_one(d) == target
    d.stack(target).preview_refresh(expect_no_changes=True)
    # Nothing lost: every stack has the resources it had, and the other stacks' state is as it was.
    assert {s: urns(d.stack(s)) for s in STRATEGIES} == before
    assert {s: checkpoint(server, s) for s in others} == untouched
    H.fault_survived("PostgreSQL stopped in the middle of a run")



def test_postgres_restarted_between_two_state_writes_the_run_carries_on(d, server):
    """A restart while the run waits on the host (the switch loading): the engine's connection
    pool reconnects at its next write, the run succeeds and its state is saved."""
    serving = serving_one(d)
    target = next(s for s in STRATEGIES if s != serving)
    before = {s: urns(d.stack(s)) for s in STRATEGIES}
    runs = len(d.stack(target).history())
    old_pid = server.pid()
    run = pulumi_up(d, target)
    try:
        H.wait_for(lambda: states(d)[target] in ("activating", "active"), 120, what=f"the run to start {target}")
        H.fault_injected("PostgreSQL restarted in the middle of a run")
        server.restart()
        assert server.pid() != old_pid
        out, _ = run.communicate(timeout=300)
    finally:
        if server.pid() is None:
            server.run_server()
    assert run.returncode == 0, out[-3000:]
    assert serving_one(d) == target
    history = d.stack(target).history()
    assert len(history) == runs + 1 and history[0].result == "succeeded"
    assert lock_keys(server, target) == []
    d.stack(target).preview_refresh(expect_no_changes=True)
    assert {s: urns(d.stack(s)) for s in STRATEGIES} == before
    H.fault_survived("PostgreSQL restarted in the middle of a run")


def test_a_failed_start_through_postgres_is_seen_by_a_second_checkout(d, server, tmp_path):
    """Issue 43 with the team's state in PostgreSQL: a start that runs out of CUDA memory while
    loading is rolled back and recorded in the project's own table beside the state
    (gpu_serving_failures); a second checkout, with only the team's settings (the backend URL and
    the password), lists it and its `plan` of the same start says the warning."""
    active = [s for s, state in states(d).items() if state == "active"]
    serving = active[0] if len(active) == 1 else "pp8"
    d.stack(serving).up()  # the state this test starts from: one strategy serving
    assert serving_one(d) == serving
    clear = d.components("ledger", "clear", "--stack", "oom")
    assert clear.returncode == 0, clear.stdout + clear.stderr
    d.write_fault_stack("oom", "oom_during_load")
    with pytest.raises(auto.CommandError) as info:
        d.stack("oom").up()
    text = str(info.value)
    assert "readiness: crashed_during_load" in text and "Rolled back: restarted" in text, text[-4000:]
    assert "Recorded in the failure ledger as entry " in text and server.password not in text, text[-4000:]
    assert serving_one(d) == serving
    rows = server.psql("SELECT stack || ' ' || (entry->>'error_class') FROM gpu_serving_failures WHERE stack = 'oom'",
                       database=server.url.rsplit("/", 1)[1].split("?")[0])
    assert rows.split() == ["oom", "out-of-memory"], rows

    # A teammate's checkout: its own copy of the project and no state of its own.
    other = make_deployment(tmp_path, d.host, name="teammate")
    other.env = engine_env(pulumi_home=tmp_path / "pulumi-home", backend_url=server.url, passphrase="e2e-test")
    other.env["PGPASSWORD"] = server.password
    shutil.copy(d.project / "Pulumi.oom.yaml", other.project / "Pulumi.oom.yaml")
    listed = other.components("ledger", "--stack", "oom", "--json")
    assert listed.returncode == 0, listed.stderr
    entry, = json.loads(listed.stdout)
    assert (entry["stack"], entry["error_class"], entry["host"]) == ("oom", "out-of-memory", d.host.name), entry
    planned = other.components("plan", "--stack", "oom")
    assert planned.returncode == 0, planned.stderr
    assert (f"warning        this layout with these flags crashed on {d.host.name} on {entry['time'][:10]}: CUDA out of "
            f"memory while loading the weights") in planned.stdout, planned.stdout[-3000:]
    assert server.password not in planned.stdout + planned.stderr + listed.stdout
    cleared = other.components("ledger", "clear", "--stack", "oom")
    assert cleared.returncode == 0 and "cleared 1 ledger entry" in cleared.stdout, cleared.stdout + cleared.stderr
