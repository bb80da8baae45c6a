"""The provider process's work ahead of the engine's first call about a resource.

The engine sends the dynamic provider its first Read only once the Python program's body has run
(the SDK sends the program's requests after it) and the engine has taken the first resource's
step: ~0.5 s after the provider process is up, on this project's machines. Until then the process
sat idle, and its first read then paid, in a row, the import of the providers and paramiko, the
SSH connection and the host-facts command, before the reads it prefetches could even start
(docs/benchmarks.md, issue 18).

Two calls from the program (components/provider_start.py) fill that gap; the provider answers
both at once and works in daemon threads:

- START (first thing in the program, which makes the engine launch this process early): load the
  providers' modules and paramiko. Touches no host.
- READ_AHEAD (the program's last step, once its settings are checked and every resource is
  declared without an error): for each machine the program declared, with the very props it gives
  that machine's host-facts resource, open the connection and start the host-facts read and every
  read `reads.refresh_reads` lists (`ssh.prefetch`). The engine's reads then find the connection
  open and take those results under readcache.py's rules (the same request, read after no change
  of the host, no older than its max_age); a result nobody takes is dropped with the process.
  A bad setting never gets here: the program stops before it sends anything.

A third call, READ_FLEET, is one the program waits for: a fleet behind the router is read before
its roll is planned (remote/fleet_read.py; the program's side: components/fleet_check.py).

Served by gpu-serving-pyrun.py's `--invokes` (the provider launcher names this module): the
runner gives `handle` every Invoke the SDK's provider server would refuse as not implemented.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Optional

# The tokens: in the dynamic provider's package, so the engine sends them to this process.
START = "pulumi-python:dynamic:startProvider"
READ_AHEAD = "pulumi-python:dynamic:readAhead"
# A fleet behind the router, read before its roll is planned (remote/fleet_read.py). Unlike the
# two above, the program waits for this answer: the roll's order and its refusal are made of it.
READ_FLEET = "pulumi-python:dynamic:readFleet"


def handle(token: str, args: dict) -> Optional[dict]:
    """The answer to an Invoke of `token` (None: not ours, the SDK's server answers it)."""
    if token == START:
        _spawn(warm_up)
        return {}
    if token == READ_FLEET:
        from .fleet_read import read_fleet
        doc = secret_json(args.get("fleet"))
        try:
            return {"value": json.dumps(read_fleet(doc) if isinstance(doc, dict) else {"error": "no fleet sent"})}
        except Exception as exc:  # noqa: BLE001 - the program refuses the roll with this, rather than a gRPC error
            return {"value": json.dumps({"error": f"{type(exc).__name__}: {exc}"[:400]})}
    if token == READ_AHEAD:
        hosts = hosts_of(args)
        run = _handoff_run(hosts) if hosts else None
        for props in hosts:
            if run is not None:
                hand_over(props, bool(args.get("dryRun")), *run)  # before any Read: at once
            _spawn(read_ahead, props)
        return {}
    return None


def secret_json(value: Any) -> Any:
    """A value the program sent as a JSON text (exact numbers, which a protobuf Struct would turn
    into floats), kept a secret on its way through the engine; None when it is not one."""
    if isinstance(value, dict) and "value" in value:  # still wrapped as a secret
        value = value["value"]
    try:
        return json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None


def hosts_of(args: dict) -> list[dict]:
    """The host-facts props the program sent (a JSON list, a secret: secret_json)."""
    hosts = secret_json(args.get("hosts"))
    return [h for h in hosts if isinstance(h, dict)] if isinstance(hosts, list) else []


def warm_up() -> None:
    from . import providers, ssh  # noqa: F401 - what the first Read would load
    ssh.load()


def read_ahead(props: dict) -> int:
    """Connect to the machine `props` name and start its reads; the number started. Reads the
    preview handed over (handoff.py) are not made again, and when that is all of them the
    machine is not even connected to."""
    from ..core import reads
    from ..core.specs import HostFactsSpec
    from . import ssh
    from .common import reachable

    if not reachable(props):
        return 0
    t = ssh.Target.from_props(props)
    requests = [r for r in reads.host_facts(props) + reads.expand(HostFactsSpec.from_props(props).prefetch) if not ssh.held(t, r)]
    if not requests or not ssh.connect_ahead(t):
        return 0
    return ssh.prefetch(t, requests)


def _handoff_run(hosts: list[dict]) -> Optional[tuple[tuple, str]]:
    """(the CLI run, the handoff directory) when this process serves a `pulumi` CLI's run and
    handoffs can be kept safely; None otherwise (every read is then made here, as before)."""
    from . import handoff
    try:
        run = handoff.cli_run()
        base = handoff.directory() if run is not None else None
        if run is None or base is None:
            return None
        handoff.sweep(base)
        return run, base
    except Exception:  # noqa: BLE001 - no handoff: only a missed one
        return None


def hand_over(props: dict, dry_run: bool, run: tuple, base: str) -> int:
    """The preview of an `up` keeps what its reads of this machine are served for the update;
    the update holds what the preview kept (the number held). Never raises, never connects."""
    from . import handoff, ssh
    from .common import reachable
    try:
        if not reachable(props):
            return 0
        t = ssh.Target.from_props(props)
        cli, started, is_up = run
        if dry_run:
            if is_up:
                handoff.recorder.start(t.key, t.private_key, (cli, started), base)
            return 0
        entries = handoff.take(t.key, t.private_key, (cli, started), base, time.monotonic(), ssh.Result)
        return ssh.seed(t, entries, handoff.MAX_AGE)
    except Exception:  # noqa: BLE001 - a handoff is never a reason to fail: the reads are made here
        return 0


def _spawn(fn: Callable, *args: Any) -> None:
    def run() -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - work ahead is never a reason to fail: the engine's calls redo it
            pass

    threading.Thread(target=run, name="gpu-serving-ahead", daemon=True).start()
