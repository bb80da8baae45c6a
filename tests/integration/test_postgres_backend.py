"""Team state on PostgreSQL (README: Teams), without a host: the engine this project builds opens a
`postgres://` backend (its DIY backend's PostgreSQL driver is compiled in), takes the password
from PGPASSWORD, and never prints that password when the connection fails. A real PostgreSQL 15
(tests/postgres_support.py), one per module. Marked `engine`."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.postgres_support import PostgresServer, free_port
from tests.pulumi_env import EngineMissing, engine_env, require_engine

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

