"""Where the failure ledger is kept: beside the stacks' state, so the whole team sees it.

- State in PostgreSQL (`PULUMI_BACKEND_URL=postgres://USER@HOST:PORT/DB?sslmode=...`,
  docs/teams-and-watch.md): a table of the project's own, `gpu_serving_failures`, in the same database, created on
  first use (the engine's backend creates `pulumi_state` the same way). The password comes from
  where libpq looks (`PGPASSWORD`, `~/.pgpass`, `PGPASSFILE`), never from the URL.
- State in files (`file://DIR`, the default): `DIR/gpu-serving-failures.jsonl`, one entry a line,
  appended under an exclusive lock (two runs at once each add their line whole).
Any other backend is refused by name: a ledger nobody else sees would be no memory at all.
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Sequence
from urllib.parse import unquote, urlparse

from ..core.ledger import Failure, warnings_for

if TYPE_CHECKING:
    from ..core.plan import CheckedStack

TABLE = "gpu_serving_failures"
LEDGER_FILE = "gpu-serving-failures.jsonl"
# Statements of the table, run on every connection (idempotent). One advisory lock makes two
# checkouts' first use at the same moment one CREATE, not a duplicate-type error.
SCHEMA = (
    f"SELECT pg_advisory_xact_lock(hashtext('{TABLE}'))",
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id BIGSERIAL PRIMARY KEY,
        recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        stack TEXT NOT NULL,
        host TEXT NOT NULL,
        model_path TEXT NOT NULL,
        flags_hash TEXT NOT NULL,
        gpu_model TEXT NOT NULL,
        entry JSONB NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_start ON {TABLE} (model_path, flags_hash, gpu_model)",
)
CONNECT_TIMEOUT = 10  # seconds: a plan or a preview waits no longer for the team's database


class LedgerError(Exception):
    """The ledger cannot be read or written: what, where, and what to do (never a password)."""


class FileLedger:
    def __init__(self, path: Path):
        self.path = path
        self.where = str(path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[Failure]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(Failure.from_dict(json.loads(line)))
                except (ValueError, TypeError) as exc:
                    raise LedgerError(f"{self.path}:{n}: not a ledger entry ({exc}); remove the line or the file") from None
        return out

    def add(self, f: Failure) -> Failure:
        with self._locked():
            entries = self._read()
            stored = Failure.from_dict({**f.as_dict(), "id": str(max((int(e.id) for e in entries if e.id.isdigit()), default=0) + 1)})
            with open(self.path, "a") as out:
                out.write(json.dumps(stored.as_dict(), sort_keys=True) + "\n")
        return stored

    def list(self, stack: Optional[str] = None) -> list[Failure]:
        return [f for f in self._read() if stack is None or f.stack == stack]

    def clear(self, ids: Optional[Sequence[str]] = None, stack: Optional[str] = None) -> int:
        """Remove the entries named by id, or a stack's, or (neither) all; returns how many."""
        with self._locked():
            entries = self._read()
            gone = [e for e in entries if (ids is None or e.id in ids) and (stack is None or e.stack == stack)]
            kept = [e for e in entries if e not in gone]
            tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
            tmp.write_text("".join(json.dumps(e.as_dict(), sort_keys=True) + "\n" for e in kept))
            os.replace(tmp, self.path)
        return len(gone)


class PostgresLedger:
    def __init__(self, url: str):
        self.url = url
        parsed = urlparse(url)
        # Shown in messages: no user, no password (the URL has none; env.sh refuses one anyway).
        self.where = f"table {TABLE} in postgres://{parsed.hostname}:{parsed.port or 5432}{parsed.path}"

    @contextmanager
    def _connection(self):
        import psycopg  # here: only the PostgreSQL backend needs the driver loaded
        try:
            with psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT, application_name="gpu-serving ledger") as conn:
                with conn.transaction():
                    for statement in SCHEMA:
                        conn.execute(statement)
                yield conn
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LedgerError(f"the failure ledger ({self.where}): {first}; check PULUMI_BACKEND_URL and the password "
                              "in ~/.pgpass or PGPASSWORD (docs/teams-and-watch.md: Teams)") from None

    def add(self, f: Failure) -> Failure:
        from psycopg.types.json import Jsonb
        with self._connection() as conn:
            row = conn.execute(f"INSERT INTO {TABLE} (stack, host, model_path, flags_hash, gpu_model, entry) "
                               "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                               (f.stack, f.host, f.model_path, f.flags_hash, f.gpu_model, Jsonb({**f.as_dict(), "id": ""}))
                               ).fetchone()
        return Failure.from_dict({**f.as_dict(), "id": str(row[0])})

    def list(self, stack: Optional[str] = None) -> list[Failure]:
        with self._connection() as conn:
            rows = conn.execute(f"SELECT id, entry FROM {TABLE} WHERE %s::text IS NULL OR stack = %s ORDER BY id",
                                (stack, stack)).fetchall()
        return [Failure.from_dict({**entry, "id": str(i)}) for i, entry in rows]

    def clear(self, ids: Optional[Sequence[str]] = None, stack: Optional[str] = None) -> int:
        numbers = None if ids is None else [int(i) for i in ids if str(i).isdigit()]
        with self._connection() as conn:
            cur = conn.execute(f"DELETE FROM {TABLE} WHERE (%s::bigint[] IS NULL OR id = ANY(%s::bigint[])) "
                               "AND (%s::text IS NULL OR stack = %s)", (numbers, numbers, stack, stack))
            return cur.rowcount


def store_for(backend_url: Optional[str]):
    """The ledger beside the state `backend_url` (PULUMI_BACKEND_URL) names."""
    url = (backend_url or "").strip()
    if url.startswith(("postgres://", "postgresql://")):
        return PostgresLedger(url)
    if url.startswith("file://"):
        return FileLedger(Path(unquote(urlparse(url).path)) / LEDGER_FILE)
    scheme = url.split("://", 1)[0] if "://" in url else "(not set)"
    raise LedgerError(f"PULUMI_BACKEND_URL is {scheme}: the failure ledger lives beside the state in PostgreSQL "
                      "(postgres://) or a file backend (file://); `source scripts/env.sh` sets the default file backend")


def backend_url() -> Optional[str]:
    """The state's backend as this process was given it (scripts/env.sh, the engine's environment)."""
    return os.environ.get("PULUMI_BACKEND_URL") or None


# The entries read once a process (a fleet's preview asks once per host): backend URL -> entries.
_READ: dict[str, list[Failure]] = {}


def recorded(url: Optional[str] = None, *, once: bool = False) -> tuple[list[Failure], Optional[str]]:
    """(the recorded failures, why they could not be read). No backend named (`pulumi login` with
    no PULUMI_BACKEND_URL): nothing, silently, since there is no place to have recorded any.
    `once`: the entries this process already read, if it did."""
    url = url or backend_url()
    if not url:
        return [], None
    if once and url in _READ:
        return _READ[url], None
    try:
        _READ[url] = store_for(url).list()
    except LedgerError as exc:
        return [], str(exc)
    return _READ[url], None


def warnings_before_start(argv: list[str], *, gpu_model: str = "", url: Optional[str] = None,
                          once: bool = False) -> list[str]:
    """The warnings `plan`, `preview` and `advise` print before a start of `argv` (core/ledger.py
    `warnings_for`: the same words from each), or the one line saying the ledger was not read."""
    failures, problem = recorded(url, once=once)
    if problem:
        return [f"the failure ledger was not read, so a start that failed before is not named: {problem}"]
    return warnings_for(failures, argv=argv, gpu_model=gpu_model)


def warnings_before_stack(checked: "CheckedStack") -> list[str]:
    """`warnings_before_start` for a checked stack (`plan`, `advise`): its start on each host,
    each warning once however many hosts would start it."""
    out: list[str] = []
    for _, plan in checked.plans:
        out += [w for w in warnings_before_start(plan.unit.exec_start, once=True) if w not in out]
    return out
