"""Team state on PostgreSQL (docs/teams-and-watch.md, "Teams"), without a host: the engine this project builds opens a
`postgres://` backend (its DIY backend's PostgreSQL driver is compiled in), takes the password
from PGPASSWORD, and never prints that password when the connection fails. A real PostgreSQL 15
(tests/postgres_support.py), one per module. Marked `engine`."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.postgres_support import PostgresServer, free_port
from tests.pulumi_env import REPO, EngineMissing, committed_stack_files, engine_env, require_engine

pytestmark = pytest.mark.engine

PROJECT = "name: team-state-check\nruntime: python\n"


@pytest.fixture(scope="module")
def server():
    s = PostgresServer.start()
    yield s
    s.stop()


def pulumi(tmp: Path, url: str, password: str | None, *args: str) -> subprocess.CompletedProcess:
    env = engine_env(pulumi_home=tmp / "home", backend_url=url, passphrase="team-test")
    try:
        require_engine(env)
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    env.pop("PGPASSWORD", None)
    env.pop("PGPASSFILE", None)
    if password is not None:
        env["PGPASSWORD"] = password
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    (project / "Pulumi.yaml").write_text(PROJECT)
    return subprocess.run(["pulumi", *args], cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_stacks_live_in_the_database(server, tmp_path):
    out = pulumi(tmp_path, server.url, server.password, "stack", "init", "alpha")
    assert out.returncode == 0, out.stderr
    listed = pulumi(tmp_path, server.url, server.password, "stack", "ls", "--json")
    assert listed.returncode == 0 and '"name": "alpha"' in listed.stdout, listed
    assert "pulumi_state/.pulumi/stacks/team-state-check/alpha.json" in server.state_keys()


@pytest.mark.parametrize("case", ["wrong password", "server down"])
def test_a_failed_connection_says_why_and_never_prints_the_password(server, tmp_path, case):
    password = "pw-must-not-be-printed-" + case.replace(" ", "-")
    url = server.url if case == "wrong password" else server.url.replace(f":{server.port}/", f":{free_port()}/")
    out = pulumi(tmp_path, url, password, "stack", "ls")
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "unable to open state database" in text, text
    assert ("password authentication failed" if case == "wrong password" else "connection refused") in text, text
    assert password not in text



def documented_teams() -> str:
    """The "Teams" section of docs/teams-and-watch.md, up to the next section."""
    text = (REPO / "docs" / "teams-and-watch.md").read_text()
    return text[text.index("\n## Teams"):][1:].split("\n## ", 1)[0]


def test_the_documented_team_setup_runs_as_written_on_a_clone_with_a_team_passphrase(server, tmp_path):
    """The operator's block of docs/teams-and-watch.md ("Teams"), in a copy of the checkout with its
    stack files as a clone gets them (committed: an `encryptionsalt` committed with them is what a
    team member meets), against the test server (its address for db.example.internal:5432; it has
    no TLS, so sslmode=disable), with the password in ~/.pgpass and a team passphrase that is not
    scripts/env.sh's default, as the page describes it. The database side of the page
    (createuser --pwprompt, createdb --owner) is how tests/postgres_support.py made this server's
    role. Issue 36.11: the committed Pulumi.ep8.yaml and Pulumi.tp8.yaml carried salts made with
    the default passphrase, so this flow stopped at `incorrect passphrase` (the test stripped them)."""
    section = documented_teams()
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[1]
    passfile_line = re.search(r"one line\s+`([^`]+)`", section).group(1)
    here = f"127.0.0.1:{server.port}"
    block = block.replace("db.example.internal:5432", here).replace("sslmode=verify-full", "sslmode=disable")
    home = tmp_path / "home"
    (home / ".config" / "gpu-serving").mkdir(parents=True)
    (home / ".config" / "gpu-serving" / "passphrase").write_text("team-passphrase\n")
    pgpass = home / ".pgpass"
    pgpass.write_text(passfile_line.replace("db.example.internal:5432", here).replace("PASSWORD", server.password) + "\n")
    pgpass.chmod(0o600)
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", ".pulumi-state", "__pycache__", ".pytest_cache", "tests"))
    (checkout / ".venv").symlink_to(REPO / ".venv")
    stacks = committed_stack_files(checkout)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PULUMI_HOME": str(tmp_path / "pulumi-home")}
    if "GPU_SERVING_CACHE" in os.environ:
        env["GPU_SERVING_CACHE"] = os.environ["GPU_SERVING_CACHE"]
    out = subprocess.run(["bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", block], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^ep8\*\s", out.stdout, re.M), out.stdout
    assert server.password not in out.stdout + out.stderr
    assert "pulumi_state/.pulumi/stacks/gpu-serving/ep8.json" in server.state_keys()
    assert "encryptionsalt:" in (checkout / "Pulumi.ep8.yaml").read_text()  # the line the page says to commit
    # Every other committed stack file too: a team member creates each stack with the team's
    # passphrase (a salt committed with another passphrase would stop it the same way).
    for stack in [s for s in stacks if s != "ep8"]:
        created = subprocess.run(["bash", "--noprofile", "--norc", "-euo", "pipefail", "-c",
                                  block.split("source scripts/env.sh")[0] + f"source scripts/env.sh\npulumi stack init {stack}\n"],
                                 cwd=checkout, env=env, capture_output=True, text=True, timeout=180)
        assert created.returncode == 0, (stack, created.stdout + created.stderr)
