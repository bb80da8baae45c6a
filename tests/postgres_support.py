"""A real PostgreSQL server (Debian's postgresql-15, installed by scripts/install-host-deps) for
the team-state tests: its own cluster in its own temporary directory, run as the `postgres` user
(initdb and the server refuse root), listening on 127.0.0.1 at a free port and on a socket in that
directory. Stopped by its postmaster's PID; never the system's own cluster.

    server = PostgresServer.start()
    env["PULUMI_BACKEND_URL"] = server.url; env["PGPASSWORD"] = server.password
    ...
    server.stop()
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")
OS_USER = "postgres"
ROLE = "gpu_serving"
DATABASE = "pulumi_state"


class PostgresMissing(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", OS_USER, "--", *argv], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 120), **kw)


class PostgresServer:
    def __init__(self, root: Path, port: int, password: str):
        self.root, self.port, self.password = root, port, password
        self.data, self.sockets, self.log = root / "data", root / "sockets", root / "server.log"

    @property
    def url(self) -> str:
        """The backend URL a team member sets: no password in it (that comes from PGPASSWORD).
        The test server has no TLS; a real one should (sslmode=verify-full)."""
        return f"postgres://{ROLE}@127.0.0.1:{self.port}/{DATABASE}?sslmode=disable"

    @classmethod
    def start(cls) -> PostgresServer:
        if not (PG_BIN / "initdb").exists():
            raise PostgresMissing(f"no PostgreSQL 15 at {PG_BIN}: run scripts/install-host-deps (installs postgresql-15)")
        # Not under pytest's tmp dir: that is root's, mode 0700, and the server runs as postgres.
        root = Path(tempfile.mkdtemp(prefix="gpu-serving-pg-"))
        shutil.chown(root, OS_USER)
        server = cls(root, free_port(), "pw-" + secrets.token_hex(12))
        server.sockets.mkdir()
        shutil.chown(server.sockets, OS_USER)
        # Socket connections (only the postgres OS user can reach the 0700 directory) are trusted,
        # for setup; TCP needs the role's password (scram-sha-256), as a team's server would.
        out = _as_postgres([str(PG_BIN / "initdb"), "-D", str(server.data), "-U", "postgres", "-E", "UTF8",
                            "--auth-local=trust", "--auth-host=scram-sha-256"])
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr[-2000:]}")
        server.run_server()
        # docs/teams-and-watch.md's (Teams) commands for the database server, as its superuser; createuser
        # prompts for the password twice (from stdin here: no controlling terminal).
        conn = ["-h", str(server.sockets), "-p", str(server.port), "-U", "postgres"]
        for argv, stdin in (([str(PG_BIN / "createuser"), *conn, "--pwprompt", ROLE], f"{server.password}\n" * 2),
                            ([str(PG_BIN / "createdb"), *conn, "--owner", ROLE, DATABASE], None)):
            out = _as_postgres(argv, input=stdin, cwd="/", start_new_session=True)
            if out.returncode:
                raise RuntimeError(f"{Path(argv[0]).name} failed: {out.stderr[-2000:]}")
        return server

    def run_server(self) -> None:
        out = _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                            "-o", f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1", "start"])
        if out.returncode:
            raise RuntimeError(f"PostgreSQL did not start: {out.stdout[-1000:]} {self.log.read_text()[-2000:]}")

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def halt(self, timeout: float = 60) -> None:
        """Fast shutdown of this server by its PID (SIGINT: clients cut off, data kept)."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def restart(self) -> None:
        self.halt()
        self.run_server()

    def psql(self, *statements: str, database: str = "postgres") -> str:
        argv = [str(PG_BIN / "psql"), "-h", str(self.sockets), "-p", str(self.port), "-U", "postgres", "-d", database,
                "-v", "ON_ERROR_STOP=1", "-At"]
        for s in statements:
            argv += ["-c", s]
        out = _as_postgres(argv, cwd="/")
        if out.returncode:
            raise RuntimeError(f"psql failed: {out.stderr[-2000:]}")
        return out.stdout

    def state_keys(self) -> list[str]:
        """The keys of Pulumi's state table (the backend creates it on first use)."""
        return self.psql("SELECT key FROM pulumi_state ORDER BY key", database=DATABASE).split()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)
