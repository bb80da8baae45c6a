"""The failure ledger's store (components/remote/ledger_store.py) and `python -m components
ledger`: in a real PostgreSQL (tests/postgres_support.py: its own server, as a team's would be
reached, by the role's password) where another checkout sees each row, and in the file beside a
file backend."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from components.core import ledger as L
from components.remote import ledger_store as S
from tests.postgres_support import ROLE, PostgresServer

REPO = Path(__file__).resolve().parents[2]
ARGV = ["/root/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/kimi-k2.6", "--tp-size", "8",
        "--ep-size", "8", "--mem-fraction-static", "0.92", "--host", "0.0.0.0", "--port", "30001"]
JOURNAL = ("[2026-12-04 10:14:53 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=3.02 GB\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB.\n"
           "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.75 GiB.\n")


def failure(stack="ep8", host="gpu1") -> L.Failure:
    return L.signature(stack=stack, host=host, outcome="crashed_during_load", argv=ARGV, journal=JOURNAL,
                       model="kimi-k2.6", facts={"gpu_models": ["NVIDIA H200"], "driver_version": "580.159.04"},
                       sglang_version="0.5.23", when=datetime(2026, 12, 4, 10, 15, 9, tzinfo=timezone.utc))


def other_checkout(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """`python -m components ledger ...` as a teammate runs it: another process, in a directory of
    its own, sharing nothing with this one but the team's settings in its environment."""
    home = tmp_path / "teammate"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PULUMI_BACKEND"))}
    return subprocess.run([sys.executable, "-m", "components", "ledger", *args], cwd=home, capture_output=True, text=True,
                          timeout=120, env={**clean, "PYTHONPATH": str(REPO), "HOME": str(home), **env})


# ---------------------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="module")
def server():
    s = PostgresServer.start()
    yield s
    s.stop()


@pytest.fixture
def team(server, monkeypatch):
    """This checkout's settings for the team's database (the password as README says: PGPASSWORD)."""
    monkeypatch.setenv("PGPASSWORD", server.password)
    server.psql(f"DROP TABLE IF EXISTS {S.TABLE}", database="pulumi_state")
    return {"PULUMI_BACKEND_URL": server.url, "PGPASSWORD": server.password}


def test_a_failed_start_recorded_here_is_seen_by_another_checkout(server, team, tmp_path):
    store = S.store_for(server.url)
    stored = store.add(failure())
    assert stored.id == "1" and stored == L.Failure.from_dict({**failure().as_dict(), "id": "1"})
    # The project made its own table, in the state's database, owned by the team's role.
    assert server.psql(f"SELECT tableowner FROM pg_tables WHERE tablename = '{S.TABLE}'", database="pulumi_state").strip() == ROLE
    seen = other_checkout(tmp_path, team, "--json")
    assert seen.returncode == 0, seen.stderr
    assert [L.Failure.from_dict(e) for e in json.loads(seen.stdout)] == [stored]
    listed = other_checkout(tmp_path, team)
    assert "stack ep8 on gpu1: crashed: CUDA out of memory during CUDA graph capture" in listed.stdout
    # What the teammate's plan would be warned about, from the same row.
    assert [f.id for f in L.matches(store.list(), argv=ARGV, gpu_model="NVIDIA H200")] == ["1"]


def test_entries_are_cleared_by_id_by_stack_or_all(server, team, tmp_path):
    store = S.store_for(server.url)
    ids = [store.add(failure(stack=s)).id for s in ("ep8", "ep8", "tp8", "pp8")]
    cleared = other_checkout(tmp_path, team, "clear", "--id", ids[0])
    assert cleared.returncode == 0 and cleared.stdout.startswith("cleared 1 ledger entry (table gpu_serving_failures in ")
    assert [f.id for f in store.list()] == ids[1:]
    assert store.clear(stack="ep8") == 1 and [f.stack for f in store.list()] == ["tp8", "pp8"]
    assert other_checkout(tmp_path, team, "clear", "--all").stdout.startswith("cleared 2 ledger entries")
    assert store.list() == []


def test_two_checkouts_using_it_first_at_once_both_record(server, team):
    # Both create the table if it is missing: the advisory lock makes that one CREATE.
    with ThreadPoolExecutor(4) as pool:
        stored = list(pool.map(lambda i: S.store_for(server.url).add(failure(host=f"gpu{i}")), range(4)))
    assert sorted(int(f.id) for f in stored) == [1, 2, 3, 4]
    assert sorted(f.host for f in S.store_for(server.url).list()) == ["gpu0", "gpu1", "gpu2", "gpu3"]


def test_a_wrong_password_says_why_and_never_prints_it(server, team, tmp_path):
    wrong = other_checkout(tmp_path, {**team, "PGPASSWORD": "not-" + server.password})
    assert wrong.returncode == 2
    assert f'password authentication failed for user "{ROLE}"' in wrong.stderr and "docs/teams-and-watch.md: Teams" in wrong.stderr
    assert server.password not in wrong.stderr + wrong.stdout


# ---------------------------------------------------------------------------- file backend

def test_the_file_beside_a_file_backend(tmp_path):
    state = tmp_path / ".pulumi-state"
    store = S.store_for(f"file://{state}")
    assert store.path == state / S.LEDGER_FILE
    with ThreadPoolExecutor(4) as pool:  # runs at once each add a whole line, with its own id
        stored = list(pool.map(lambda i: store.add(failure(host=f"gpu{i}")), range(4)))
    assert sorted(int(f.id) for f in stored) == [1, 2, 3, 4]
    assert len(store.path.read_text().splitlines()) == 4
    env = {"PULUMI_BACKEND_URL": f"file://{state}"}
    seen = other_checkout(tmp_path, env, "--json", "--stack", "ep8")
    assert sorted(e["host"] for e in json.loads(seen.stdout)) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert other_checkout(tmp_path, env, "clear", "--id", "2").stdout.startswith("cleared 1 ledger entry")
    assert sorted(f.id for f in store.list()) == ["1", "3", "4"]
    assert store.clear() == 3 and store.list() == []


def test_the_command_line_refuses_what_it_cannot_do(tmp_path):
    env = {"PULUMI_BACKEND_URL": f"file://{tmp_path}"}
    for args, said in ((("clear",), "name what to clear: --id ID, --stack NAME or --all"),
                       (("clear", "--all", "--stack", "ep8"), "--all clears every entry"),
                       (("--all",), "--id and --all are for `ledger clear`")):
        res = other_checkout(tmp_path, env, *args)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr)
    res = other_checkout(tmp_path, {"PULUMI_BACKEND_URL": "s3://bucket/state"})
    assert res.returncode == 2 and "PULUMI_BACKEND_URL is s3: the failure ledger lives beside the state" in res.stderr
    (tmp_path / S.LEDGER_FILE).write_text("{not json\n")
    res = other_checkout(tmp_path, env)
    assert res.returncode == 2 and f"{tmp_path / S.LEDGER_FILE}:1: not a ledger entry" in res.stderr
