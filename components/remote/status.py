"""The hosts' truth for ``python -m components status`` (components/cli/status.py prints it) and
the drift watch, read over SSH the way the providers read it (no Pulumi engine, no state): what
serves on each host of the project's stacks, its readiness now (a /health_generate and
/server_info read from the host side), and whether each stack's unit and environment files are
the ones `plan` renders. The words come from components/core/status.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

from ..core import dropins
from ..core import readiness as R
from ..core import reads
from ..core import status as S
from ..core.errors import ConfigError
from ..core.facts import parse_systemctl_show, split_sections
from ..core import fitness_read
from ..core.plan import CheckedStack, ServingPlan, check_stack, declared_layout
from ..core.stack_config import from_files, stack_names
from ..core.status_verdict import summarize
from ..core.unit import UNIT_DIR
from . import probe, rehearsal_adapter, ssh
from .status_router import add_memberships


class StatusError(Exception):
    """What keeps `status` from reaching a host; the message says what to do."""


class RehearsalHostDown(StatusError):
    """A rehearsal host that is not booted: nothing can serve on it, so there is nothing to read
    and nothing wrong (unlike a real host that does not answer)."""


# Secret settings that land in the environment file, by the variable they become.
SECRET_VARIABLES = {"hfToken": "HF_TOKEN"}


def _private_key(settings, stack: str, project_dir: Path, checked: CheckedStack) -> str:
    h = settings.host
    if h.private_key_path:
        return Path(h.private_key_path).expanduser().read_text()
    if "sshPrivateKey" not in checked.secrets:
        raise StatusError("no SSH key: set gpu-serving:host.privateKeyPath, or the secret gpu-serving:sshPrivateKey")
    # The key is a Pulumi secret: only the engine can decrypt it, with the stack's passphrase.
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise StatusError(f"the SSH key of stack {stack} is the Pulumi secret gpu-serving:sshPrivateKey and `pulumi` is "
                          "not on PATH to decrypt it: `source scripts/env.sh` (and export PULUMI_CONFIG_PASSPHRASE), "
                          "or set gpu-serving:host.privateKeyPath")
    done = subprocess.run([pulumi, "config", "get", "gpu-serving:sshPrivateKey", "--stack", stack], cwd=project_dir,
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    if done.returncode != 0 or not done.stdout.strip():
        # Never the output itself: it may hold part of the key.
        raise StatusError(f"`pulumi config get gpu-serving:sshPrivateKey --stack {stack}` failed (exit {done.returncode}): "
                          "select the stack's backend and export PULUMI_CONFIG_PASSPHRASE, or set "
                          "gpu-serving:host.privateKeyPath")
    return done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"


def connection(settings, stack: str, project_dir: Path, checked: CheckedStack) -> dict[str, Any]:
    """The providers' connection object for one host of a stack (see gpu_host.connection_of)."""
    h = settings.host
    timeouts = {"connectTimeout": h.connect_timeout_seconds, "commandTimeout": h.command_timeout_seconds}
    if h.is_rehearsal:
        reach = rehearsal_adapter.connection(h.rehearsal)
        if reach is None:
            raise RehearsalHostDown(f"the rehearsal host {h.rehearsal!r} is not running, so nothing serves there"
                                    f" (boot it: `{rehearsal_adapter.boot_it(h.rehearsal)}`)")
        return {**reach, **timeouts}
    if not h.host_key:
        raise StatusError(f"gpu-serving:host.hostKey is required for a real host ({h.address}): "
                          f"pin it (ssh-keyscan -t ed25519 {h.address})")
    return {"host": h.address, "port": h.port, "user": h.user, "privateKey": _private_key(settings, stack, project_dir, checked),
            "hostKey": h.host_key, **timeouts}


def _rank_readiness(t: ssh.Target, unit: S.HostUnit, rank: int, nnodes: int) -> dict:
    """A rank >= 1 of a multi-node layout: its unit runs (the caller saw it serve) and its journal
    says whether it joined rank 0, as a switch judges it (readiness.rank_now); its HTTP answer is
    a dummy server's and proves nothing."""
    _, joined = probe.rank_look(t, unit.name)
    status, reason = R.rank_now(rank, nnodes, joined)
    return {"status": status, "reason": reason, "unit": unit.name, "rank": rank, "checked_at": probe.now_iso(),
            "probe": f"its unit and journal: rank {rank} of {nnodes}, rank 0 answers for the world"}


def _readiness(t: ssh.Target, unit: S.HostUnit, declared: dict) -> dict:
    """One look at the serving unit, as a refresh takes it (the same read and report builder)."""
    rank, nnodes = unit.node_rank
    if rank:
        return _rank_readiness(t, unit, rank, nnodes)
    layout = unit.layout
    bind = str(layout.get("host", "0.0.0.0"))
    port = int(layout.get("port", 30000)) if str(layout.get("port", "")).isdigit() else 30000
    request, = reads.readiness({"unit": unit.name, "bind": bind, "port": port})
    obs, info_read = probe.read_snapshot(ssh.fetch(t, request).stdout, 0.0)
    verdict = R.judge_now(obs)
    if verdict.outcome == R.READY and info_read is None:
        info_read = probe.server_info(t, reads.probe_address(bind), port)
    report = R.build_report(verdict, unit=unit.name, declared=declared, checked_at=probe.now_iso(),
                            url=f"http://{reads.probe_address(bind)}:{port}", info_read=info_read)
    return report.as_dict()


def _stack_files(t: ssh.Target, plan: ServingPlan, secrets: list[str]) -> list[str]:
    """Each way the host's files of this stack differ from what `plan` renders (no secret value)."""
    drift = []
    unit_text = ssh.read_file(t, f"{UNIT_DIR}/{plan.unit.name}")
    if unit_text is None:
        return []  # never deployed here (or destroyed): nothing to drift
    problem = S.file_drift(plan.unit.text, unit_text.decode(errors="replace"))
    if problem:
        drift.append(f"unit file {problem}")
    env = ssh.read_file(t, plan.unit.environment_path)
    secret_keys = [SECRET_VARIABLES[s] for s in secrets if s in SECRET_VARIABLES]
    # Values never shown: a line added on the host may hold a token.
    problem = S.file_drift(plan.environment_text, None if env is None else
                           S.strip_secret_lines(env.decode(errors="replace"), secret_keys), hide_values=True)
    if problem:
        drift.append(f"environment file {plan.unit.environment_path} {problem}")
    if t.user == "root":
        for what, path in (("unit file", f"{UNIT_DIR}/{plan.unit.name}"), ("environment file", plan.unit.environment_path)):
            owner = ssh.stat_owner(t, path)
            if owner not in (None, "0:0"):
                drift.append(f"{what} {path} belongs to {owner} (uid:gid), not root")
    return drift


def _systemd_changes(t: ssh.Target, plan: ServingPlan, secrets: list[str]) -> list[str]:
    """What systemd applies to the unit beyond its file, from the drift check's own read and
    words (core/dropins.py): other drop-ins, and the environment they make."""
    request, = reads.service({"unit": plan.unit.name})
    head, _, rest = ssh.fetch(t, request).stdout.partition("\n@@cmdline\n")
    state = next(iter(parse_systemctl_show(head).values()), {})
    hidden = frozenset(SECRET_VARIABLES[s] for s in secrets if s in SECRET_VARIABLES)
    foreign, environment = dropins.read_changes(plan.unit.name, state.get("DropInPaths", ""), split_sections("@@cmdline\n" + rest),
                                                declared=plan.environment, hidden=hidden)
    return [f"drop-in {line}" for line in foreign] + [f"environment: {line}" for line in environment]


def host_status(conn: dict, entry: str, target: str, stacks: list[tuple[str, ServingPlan, list[str]]]) -> dict:
    """One host: what serves, its readiness now, each stack's files. `stacks`: (stack, its plan for
    this host, its secret settings)."""
    t = ssh.Target.from_props({"connection": conn})
    out = ssh.fetch(t, reads.serving())
    host = S.parse_serving(out.stdout)
    serving = host.serving
    doc: dict[str, Any] = {"host": target, "entry": entry, "serving": None, "readiness": None, "also_running": [],
                           "stacks": []}
    plans = {plan.unit.name: (stack, plan) for stack, plan, _ in stacks}
    boot = S.boot_disagreement(host)
    # The GPUs against the host's benchmark baseline, and what is degraded now (shown, not a
    # verdict: the drift check and readiness.fitness decide on it).
    doc["fitness"] = fitness_read.parse(ssh.fetch(t, reads.fitness(always=True)).stdout).as_dict(entry or target)
    if serving:
        u = serving[0]
        doc["serving"] = u.as_dict()
        owner = plans.get(u.name)
        doc["readiness"] = _readiness(t, u, declared_layout(owner[1]) if owner else {})
        doc["also_running"] = [o.as_dict() for o in serving[1:]]
        doc["boot"] = boot
    for stack, plan, secrets in stacks:
        on_host = host.unit(plan.unit.name)
        drift = _stack_files(t, plan, secrets)
        if on_host is not None and on_host.drop_ins:
            drift.append("drop-ins (hand edits of the unit; an up removes them): " + ", ".join(on_host.drop_ins))
        if on_host is not None:
            drift += _systemd_changes(t, plan, secrets)
        if on_host is not None and on_host.serving and on_host.argv:
            running = R.compare_running(plan.unit.exec_start, {}, {}, on_host.argv, {}, {})
            if running:
                drift.append("running server: " + "; ".join(running))
        if boot and serving and serving[0].name == plan.unit.name:
            drift.append(boot)
        state = "not on this host" if on_host is None else (
            f"{on_host.active_state}" + (", enabled" if on_host.enabled else ", disabled"))
        doc["stacks"].append({"stack": stack, "unit": plan.unit.name, "state": state, "drift": drift,
                              "serving": bool(serving) and serving[0].name == plan.unit.name})
    return doc


def project_status(project_dir: Path, only: Optional[str] = None, stacks: Optional[list[str]] = None) -> dict:
    """Every host of the project's stacks (or of `only`, or of `stacks`: the drift watch's): see
    `host_status`. Settings errors raise ConfigError; a host that cannot be reached is reported in its entry."""
    names = [only] if only else list(stacks) if stacks else stack_names(project_dir)
    hosts: dict[str, dict] = {}
    # A multi-node layout names rank 0's address: a running rehearsal host's, as the program
    # renders it (without it, every rank's unit would read as drift).
    addresses = rehearsal_adapter.addresses()
    routers: dict[tuple, dict] = {}
    for stack in names:
        try:
            checked = check_stack(stack, from_files(project_dir, stack), project_dir, addresses)
        except ConfigError:
            if only:
                raise
            continue  # another stack's own problem: `plan --stack` names it
        for (entry, plan), (_, settings) in zip(checked.plans, checked.settings.per_host()):
            key = settings.host.machine
            slot = hosts.setdefault(key, {"entry": entry, "target": settings.host.target, "stacks": [], "conn": None,
                                          "error": None, "down": None})
            slot["stacks"].append((stack, plan, checked.secrets))
            if slot["conn"] is None and slot["error"] is None and slot["down"] is None:
                try:
                    slot["conn"] = connection(settings, stack, project_dir, checked)
                except RehearsalHostDown as exc:
                    slot["down"] = str(exc)
                except (StatusError, OSError) as exc:
                    slot["error"] = str(exc)
        if checked.settings.router is not None:
            _declare_router(routers, checked, stack, project_dir)
    docs = []
    by_machine: dict[str, dict] = {}
    for key, slot in hosts.items():
        if slot["down"] is not None:
            # Not booted: the stacks that name it are simply not deployed there (not "not read").
            docs.append({"host": slot["target"], "entry": slot["entry"], "down": slot["down"], "serving": None,
                         "stacks": [{"stack": stack, "unit": plan.unit.name, "state": "not on this host", "drift": [],
                                     "serving": False} for stack, plan, _ in slot["stacks"]]})
            continue
        if slot["conn"] is None:
            docs.append({"host": slot["target"], "entry": slot["entry"], "error": slot["error"], "stacks": []})
            continue
        try:
            docs.append(host_status(slot["conn"], slot["entry"], slot["target"], slot["stacks"]))
        except ssh.RemoteError as exc:
            docs.append({"host": slot["target"], "entry": slot["entry"], "error": str(exc), "stacks": []})
        by_machine[key] = docs[-1]
    add_memberships(routers, lambda machine: (hosts.get(machine) or {}).get("conn"), by_machine)
    return summarize(docs, asked_for_a_stack=bool(only))


def _declare_router(routers: dict[tuple, dict], checked: CheckedStack, stack: str, project_dir: Path) -> None:
    """The fleet's router, once however many strategy stacks declare it, with the hosts behind it."""
    settings = checked.settings
    r = settings.declared_router
    places = dict(settings.per_host())
    runs_on = places[r.runs_on].host.machine if r.runs_on and r.runs_on in places else None
    key = (runs_on or (r.host.machine if r.host else ""), r.port)
    router = routers.setdefault(key, {"settings": settings, "conn": None, "runs_on": runs_on, "members": []})
    if runs_on is None and router["conn"] is None and r.host is not None:
        try:
            router["conn"] = connection(settings.model_copy(update={"host": r.host, "hosts": ()}), stack, project_dir, checked)
        except (StatusError, OSError):
            return  # a router machine of its own that cannot be reached: no membership is said
    for (_, plan), (_, s) in zip(checked.plans, settings.per_host()):
        member = (s.host.machine, plan.settings.serving.port)
        if member not in router["members"]:
            router["members"].append(member)
