"""Pulumi dynamic providers for what must be READ back from a host, so drift is visible.

`pulumi_command` cannot read (its refresh never looks at the host), so the unit files, the
shared environment file, the service's state and readiness are dynamic resources here: each
`read` asks the host what is really there, and each `diff` compares that with the declaration,
naming the fields that differ. The providers hold no state of their own (the engine pickles
them into the stack): every call builds its SSH target from the props.

Each read is built by reads.py from the props (`read_requests`) and run by `ssh.fetch`. The
host-facts resource, the first remote work of a run, starts the reads of the later resources
(its `prefetch` prop, from components/core/reads.py) on the connection it opens, so a refresh does
not wait for them one resource after the other (readcache.py: what may be served, and when not).
"""
from __future__ import annotations

import hashlib
import posixpath
import sys
import threading
import time
from typing import Any, Optional

from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from ..core import readiness as R
from ..core import dropins, reads, switch
from ..core import status as S
from ..core.rules import breaks_secret_line
from ..core.facts import (
    FactError,
    HostFacts,
    check_facts,
    parse_facts,
    parse_systemctl_show,
    split_sections,
)
from . import cli, identity, preview, probe, ssh
from . import router as router_roll
from . import routed_guard, said
from .common import changed as _changed
from .common import moved as _moved
from .common import progress as _progress
from .common import require_target as _require_target
from .common import stop_and_disable as _stop_and_disable

LOCK_PATH = "/run/lock/gpu-serving.lock"
# How long a file write waits for the host lock when no readiness settings say otherwise.
LOCK_WAIT_SECONDS = 900

# The files this run replaced on each host, as they were before (bytes or None when new, mode):
# target key -> path -> (bytes, mode). The engine serves every dynamic resource of a run from one
# provider process (readcache.py relies on it too), so the switch that follows the file writes
# finds them here and puts them back, byte for byte, when it fails.
_REPLACED: dict[tuple, dict[str, tuple[Optional[bytes], Optional[int]]]] = {}
_REPLACED_LOCK = threading.Lock()


def _remember_replaced(t: ssh.Target, path: str, data: Optional[bytes], mode: Optional[int]) -> None:
    with _REPLACED_LOCK:
        # The first write of the run holds what was there before it.
        _REPLACED.setdefault(t.key, {}).setdefault(path, (data, mode))


def _foreign_owner(t: ssh.Target, owner: Optional[str]) -> bool:
    """A file of ours (written as root) that belongs to someone else now. Only over a root login:
    another login writes its files as itself."""
    return t.user == "root" and owner is not None and owner != "0:0"


# Outputs a read adds only when there is something to say (a state without them reads as before):
# each read says them anew.
READ_ONLY_WHEN_SO = ("dropIns", "othersEnabled", "owner", "foreignDropIns", "effectiveEnvironment")


def _without_last_reading(props: dict) -> dict:
    return {k: v for k, v in props.items() if k not in READ_ONLY_WHEN_SO}


def _take_replaced(t: ssh.Target) -> dict[str, tuple[Optional[bytes], Optional[int]]]:
    with _REPLACED_LOCK:
        return _REPLACED.pop(t.key, {})


# The report of a switch's own readiness check, by host and unit, in this provider process: the
# readiness resource is refreshed when the program registers it, which during `up` is right after
# the service it depends on, so a switch's `up` would otherwise look again (one more command on the
# host, after the server already answered twice) at what the switch checked a moment before.
_JUST_CHECKED: dict[tuple, tuple[float, dict]] = {}
_JUST_CHECKED_LOCK = threading.Lock()
# How long a switch's check stands in for a refresh's look; past it, the refresh looks again.
JUST_CHECKED_SECONDS = 10.0


def _remember_check(t: ssh.Target, unit: str, report: dict) -> None:
    with _JUST_CHECKED_LOCK:
        _JUST_CHECKED[(t.key, unit)] = (time.monotonic(), dict(report))


def _just_checked(t: ssh.Target, unit: str) -> Optional[dict]:
    """The report of a check this process made of `unit` in the last JUST_CHECKED_SECONDS, once."""
    with _JUST_CHECKED_LOCK:
        when, report = _JUST_CHECKED.pop((t.key, unit), (None, None))
    return report if when is not None and time.monotonic() - when <= JUST_CHECKED_SECONDS else None


def host_lock(t: ssh.Target, wait: int):
    """Host-wide switch lock: `flock` held by a remote process for as long as our channel is
    open; a dropped connection ends it, so a crashed run never leaves the host locked. Call it
    inside `ssh.one_connection`; release with `host_unlock`."""
    ssh.note_change(t)  # a switch begins: nothing read before it is served after it
    transport = ssh.client(t).get_transport()
    chan = transport.open_session(timeout=max(t.connect_timeout, 10.0))
    chan.exec_command(f"flock -w {wait} {LOCK_PATH} sh -c 'echo locked; cat >/dev/null'")
    buf = b""
    deadline = time.monotonic() + wait + 30
    chan.settimeout(5)
    while b"locked" not in buf:
        if not transport.is_active():
            chan.close()
            raise ssh.RemoteError(f"the SSH connection to {t.label} was lost while waiting for the gpu-serving lock; "
                                  "nothing was changed. Run `pulumi up` again.")
        if time.monotonic() > deadline or chan.exit_status_ready():
            chan.close()
            raise ssh.RemoteError(f"another switch holds the gpu-serving lock on {t.label} ({LOCK_PATH}); "
                                  f"waited {wait} s. Run the switches one after the other.")
        try:
            data = chan.recv(64)
            if not data and chan.exit_status_ready():
                continue
            buf += data
        except Exception:
            _progress(f"waiting for the gpu-serving lock on {t.label} (another switch is running)")
    return chan


def host_unlock(chan) -> None:
    try:
        chan.shutdown_write()
        chan.close()
    except Exception:
        pass


class DeployError(Exception):
    """A failure the user must act on; its message is complete (reason, journal, rollback)."""


# How a failed switch's message says that its rollback failed too (tests and README quote it).
ROLLBACK_FAILED = "rollback failed:"


class RollbackFailed(DeployError):
    """A switch failed and so did its rollback: nothing serves. The service does not fail with
    it: it records `outs` (its report says `rollback: failed ...`), so that the readiness
    resource and the stack outputs say so too (Pulumi keeps the old outputs of a resource that
    fails, and the old stack outputs when an exported value depends on it); FailedSwitch then
    fails the run with this message."""

    def __init__(self, message: str, outs: dict):
        super().__init__(message)
        self.outs = outs


def _clean_errors_in_provider_process() -> None:
    """Show our own errors without a Python traceback.

    Pulumi's dynamic-provider server reports any exception as `traceback.format_exc()`, which
    buries "readiness: timed_out ..." under frames of our code. In that process only (its
    __main__ is pulumi.dynamic's server), errors we raise on purpose are shown by their message;
    anything else keeps its full traceback, as a bug should. The traceback module's own function
    is replaced (the server looks it up at each error) and asks at each error which process it is
    in: with warm starts this module is imported in the warm process, before its fork runs the
    server as __main__, and the server's errors all came with their traceback (issue 36.12).
    """
    import traceback
    if getattr(traceback.format_exc, "gpu_serving", False):
        return
    original = traceback.format_exc

    def format_exc(*args, **kwargs):
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if isinstance(sys.exc_info()[1], (DeployError, ssh.RemoteError)) and getattr(spec, "name", "") == "pulumi.dynamic.__main__":
            return str(sys.exc_info()[1])
        return original(*args, **kwargs)

    format_exc.gpu_serving = True
    traceback.format_exc = format_exc


_clean_errors_in_provider_process()


def _who(props: dict) -> str:
    """The fleet entry a message is about (`hosts[gpu2]: `), so a fleet's lines and errors name their
    host; empty for the one-host form."""
    entry = props.get("hostEntry")
    return f"hosts[{entry}]: " if entry else ""


def _named(props: dict, exc: Exception) -> Exception:
    """`exc` with its message prefixed by the host entry (a fleet), same type."""
    who = _who(props)
    if not who or str(exc).startswith((who, "hosts[")):  # already names its host (a multi-node rank)
        return exc
    if isinstance(exc, RollbackFailed):  # it carries the outputs the service records
        return RollbackFailed(who + str(exc), exc.outs)
    return type(exc)(who + str(exc))


def _argv(exec_start: Any) -> Any:
    """The service's `execStart` as an argv: one shell-quoted line in the props (one line in a
    preview, not one per argument), a list in states written before."""
    import shlex
    return shlex.split(exec_start) if isinstance(exec_start, str) else exec_start


def _secrets(props: dict) -> list[str]:
    values = [props.get("connection", {}).get("privateKey", "")]
    values += list((props.get("secretEnvironment") or {}).values())
    return [v for v in values if v]


# ---------------------------------------------------------------------------------------
@identity.guarded
class HostFactsProvider(ResourceProvider):
    """Reads GPUs, driver, CUDA, interconnect and OS in one round trip, and refuses a host that
    cannot run the declared strategy (before any unit is written: units depend on this).

    props: connection, cudaHome, expect, prefetch (reads.py specs of the reads the later
    resources make: started at once on the connection this resource opens; never a change).
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.host_facts(props)

    def _read(self, props: dict, prefetch=None) -> dict:
        t = _require_target(props)
        request, = self.read_requests(props)
        later = reads.expand(prefetch) if prefetch else []
        if later:
            if not all(ssh.held(t, r) for r in [request, *later]):
                ssh.client(t)  # the connection every read of this run shares, opened here
            ssh.prefetch(t, later)  # never connects: with every read handed over, none is made
        out = ssh.fetch_first(t, request)
        try:
            return parse_facts(out.stdout).as_dict()
        except FactError as exc:  # cut short, or not what nvidia-smi prints: never read as "0 GPUs"
            raise ssh.RemoteError(f"reading host facts on {t.label} (exit {out.rc}): {exc}") from None

    @staticmethod
    def _prefetch_after_read(news: dict) -> None:
        """Under `PULUMI_RUN_PROGRAM` refresh the engine reads this resource with its stored
        state (the list of the last create/update: a changed list is never a change), then
        checks this run's inputs; the later resources' reads follow that check. So the check
        starts this run's list too (what the read started already is not read again; after
        changed settings the stored list may name reads nobody makes: one unused session),
        on the connection the read just opened, when it directly follows that read
        (ssh.prefetch_window_open); otherwise (a preview or an `up` without refresh) it does
        nothing, and never connects."""
        try:
            specs = news.get("prefetch")
            connection = news.get("connection")
            if not specs or not isinstance(connection, dict) or connection.get("unavailable"):
                return
            t = ssh.Target.from_props(news)
            if ssh.prefetch_window_open(t):
                ssh.prefetch(t, reads.expand(specs))
        except Exception:  # noqa: BLE001 - a prefetch is never a reason to fail a check
            pass

    def check(self, _olds, news):
        self._prefetch_after_read(news)
        return CheckResult(news, [])

    def _check(self, props: dict, facts_dict: dict) -> list[str]:
        facts = HostFacts.from_dict(facts_dict)
        e = props["expect"]
        # The router's machine declares only neededGpus 0 (check_facts then expects nothing).
        return check_facts(facts, gpu_count=int(e.get("gpuCount", 0)), gpu_memory_gb=float(e.get("gpuMemoryGb", 0)),
                           interconnect=e.get("interconnect", "pcie"), needed_gpus=int(e["neededGpus"]))

    def _apply(self, props: dict) -> dict:
        facts = self._read(props, props.get("prefetch"))
        problems = self._check(props, facts)
        if problems:
            where = f"its gpu-serving:hosts entry {props['hostEntry']!r}" if props.get("hostEntry") else "gpu-serving:host"
            raise DeployError(f"{_who(props)}the host does not match {where}, nothing was changed:\n  - "
                              + "\n  - ".join(problems))
        return {**props, "facts": facts}

    def create(self, props):
        outs = self._apply(props)
        return CreateResult(id_=f"{props['connection']['host']}:{props['connection']['port']}", outs=outs)

    def update(self, id, olds, news):
        return UpdateResult(outs=self._apply(news))

    def read(self, id, props):
        # The stored list: in a no-op, exactly this run's; `check` adds what changed since.
        facts = self._read(props, props.get("prefetch"))
        return ReadResult(id_=id, outs={**props, "facts": facts})

    def diff(self, id, olds, news):
        # Not `prefetch`: which reads are started ahead is never a change of the host.
        changed = _changed(olds, news, ["connection", "cudaHome", "expect"])
        if olds.get("facts") and self._check(news, olds["facts"]):
            changed.append("facts")
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def delete(self, id, props):
        pass


# ---------------------------------------------------------------------------------------
@identity.guarded
class RemoteFileProvider(ResourceProvider):
    """A file on the host: written atomically, read back on refresh.

    props: connection, path, content, mode ("0644"), secretEnvironment (KEY -> value, appended
    as KEY="value" lines and kept out of `content`, so the plain part stays readable in diffs),
    retainOnDelete (shared files), reloadSystemd (a unit file: daemon-reload after delete).
    """

    @staticmethod
    def _bad_secrets(props: dict) -> list[str]:
        """Secret values that would end or extend their KEY="value" line (never the values)."""
        return [key for key, value in sorted((props.get("secretEnvironment") or {}).items())
                if isinstance(value, str) and breaks_secret_line(value)]

    def check(self, olds, news):
        if not olds and news.get("showWhenNew") and isinstance(news.get("content"), str) \
                and cli.provider_says_preview_things():
            # A new file's text, whole (the engine's display shortens a new multi-line value); a
            # changed one shows as the engine's line diff of `content`, an unchanged one not at all;
            # once a command (in the preview of a `pulumi up`, not again in its update), and once a
            # fleet when its hosts' files read the same (said.py).
            _progress(said.new_file(_who(news), str(news.get("path")), news["content"]))
        return CheckResult(news, [
            CheckFailure("secretEnvironment", f"the secret for {key} (gpu-serving:hfToken) is empty or contains whitespace, "
                                              "a quote, a backslash, $ or a backtick; a token never does")
            for key in self._bad_secrets(news)])

    def _full(self, props: dict) -> bytes:
        bad = self._bad_secrets(props)
        if bad:
            raise ssh.RemoteError(f"the secret for {', '.join(bad)} (gpu-serving:hfToken) is empty or contains whitespace, "
                                  "a quote, a backslash, $ or a backtick; refusing to write it into the environment file")
        text = props["content"]
        for key, value in sorted((props.get("secretEnvironment") or {}).items()):
            text += f'{key}="{value}"\n'
        return text.encode()

    def _write(self, props: dict) -> dict:
        t = _require_target(props)
        data = self._full(props)
        path = props["path"]
        mode = int(props.get("mode", "0644"), 8)
        if ssh.read_file(t, path) != data or ssh.stat_mode(t, path) != mode or _foreign_owner(t, ssh.stat_owner(t, path)):
            # Under the host lock, like the switch it belongs to: never between another switch's
            # stop and start, nor under its rollback. What it replaces is kept for this run's
            # switch to put back if that fails (_REPLACED).
            with ssh.one_connection(t, f"{_who(props)}writing {path}"):
                lock = host_lock(t, LOCK_WAIT_SECONDS)
                try:
                    current, current_mode = ssh.read_file(t, path), ssh.stat_mode(t, path)
                    # A new file (written beside it, then renamed over it) is root's again.
                    if current != data or current_mode != mode or _foreign_owner(t, ssh.stat_owner(t, path)):
                        _remember_replaced(t, path, current, current_mode)
                        ssh.write_file(t, path, data, mode)
                        if props.get("reloadSystemd"):
                            # systemd must load the repaired file, and a new one too: a unit whose
                            # file was deleted by hand while it runs is still known to systemd, and
                            # loading the file back on demand fails (LoadState=error, EBUSY, seen on
                            # systemd 252) until the next daemon-reload; restarts then fail.
                            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)
                finally:
                    host_unlock(lock)
        return {**props, "sha256": hashlib.sha256(data).hexdigest()}

    def create(self, props):
        return CreateResult(id_=f"{props['connection']['host']}:{props['path']}", outs=self._write(props))

    def update(self, id, olds, news):
        return UpdateResult(outs=self._write(news))

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.remote_file(props)

    def read(self, id, props):
        t = _require_target(props)
        content_request, mode_request, owner_request = self.read_requests(props)
        data = ssh.fetch(t, content_request)
        if data is None:
            return ReadResult(id_=None, outs={})  # gone: the engine plans to create it again
        props = _without_last_reading(props)
        text = data.decode(errors="replace")
        secret_lines = "".join(f'{k}="{v}"\n' for k, v in sorted((props.get("secretEnvironment") or {}).items()))
        if secret_lines and text.endswith(secret_lines):
            text = text[: -len(secret_lines)]
        else:
            # The secret part was edited: keep the plain view and never store secret values.
            text = ssh.redact(text, _secrets(props))
        mode = ssh.fetch(t, mode_request)
        state = {**props, "content": text, "mode": f"{mode:04o}" if mode is not None else props.get("mode"),
                 "sha256": hashlib.sha256(data).hexdigest()}
        owner = ssh.fetch(t, owner_request)
        if _foreign_owner(t, owner):
            # Given to another user by hand: it may read a secret or edit what root runs. The key
            # only then, so a state of root's files reads as before.
            state["owner"] = owner
        if secret_lines and not data.decode(errors="replace").endswith(secret_lines):
            state["secretEnvironment"] = {k: "[edited on host]" for k in props.get("secretEnvironment") or {}}
        # sha256 is an output (the program declares it None): as an input it would show as a change
        # of the file (`[diff: -sha256]`) on every later refresh of a file nobody touched.
        return ReadResult(id_=id, outs=state,
                          inputs={k: state[k] for k in [*props, "owner"] if k in state and k != "sha256"})

    def diff(self, id, olds, news):
        replaces = ["path"] if olds.get("path") != news.get("path") else []
        changed = _changed(olds, news, ["path", "content", "mode", "secretEnvironment", "connection", "owner"])
        # Another path (a renamed unit) or another machine: the new file is written first and the
        # old one removed at the end, after the switch to the new unit (its delete stops a unit
        # before removing its file).
        return DiffResult(changes=bool(changed), replaces=replaces + _moved(olds, news), stables=[],
                          delete_before_replace=False)

    def delete(self, id, props):
        if props.get("retainOnDelete") or identity.left_behind(props):
            return  # shared, or on a machine this run moved off because it does not answer (said there)
        if identity.claimed_elsewhere(props, "path"):
            return  # the same file on the same machine, now under another resource name of this run
        t = _require_target(props, stored=True)
        unit = posixpath.basename(str(props["path"]))
        if props.get("reloadSystemd") and unit.endswith(".service"):
            # A unit's file goes only with the unit: stopped and disabled first, so it never runs
            # on without a file (then systemctl can no longer disable it). The service's own
            # delete does the same; Pulumi runs the two at once when a move replaces both.
            _stop_and_disable(t, unit)
        ssh.remove_file(t, props["path"])
        if props.get("reloadSystemd"):
            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)


# ---------------------------------------------------------------------------------------
@identity.guarded
class ServiceProvider(ResourceProvider):
    """The strategy unit's state: enabled and active, started under a host-wide lock, checked
    by readiness, rolled back to the strategy that served before when it fails.

    props: connection, unit, configHash (what the server runs with: argv and environment; a
    change restarts the unit), execStart and environment (what the main process must run,
    compared with /proc/<MainPID> by `read`), bind, port, declared (layout for readiness),
    readiness (deadlines), enabled, active. The other strategies are found on the host when
    switching (switch.py). Outputs: runningServer ("as declared", "not running", or what the
    process runs otherwise: then `update` restarts it), readinessReport.
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.service(props)

    def _show(self, t: ssh.Target, units: list[str]) -> dict[str, dict[str, str]]:
        return self._states(ssh.fetch(t, reads.unit_states(units)).stdout, units)

    @staticmethod
    def _states(stdout: str, units: list[str]) -> dict[str, dict[str, str]]:
        shown = parse_systemctl_show(stdout)
        # systemctl show prints blocks in argument order; Id may be empty for unknown units.
        blocks = list(shown.values())
        return {u: (shown.get(u) or (blocks[i] if i < len(blocks) else {})) for i, u in enumerate(units)}

    def _start(self, props: dict, restart: bool) -> dict:
        t = _require_target(props)
        unit = props["unit"]
        # One connection for the whole switch: the lock lives on it, and if it drops the switch
        # stops with a clear error rather than carrying on unlocked over a new connection.
        with ssh.one_connection(t, f"the switch to {unit}"):
            lock = self._lock(t, props)
            try:
                behind_router = props.get("router") and props.get("active", True)
                if behind_router and (restart or not self._serving(t, unit)):
                    return self._switch_behind_router(t, props, unit)
                outs = self._switch(t, props, unit, restart)
                if behind_router:
                    # Served without a switch (a host that joined the fleet already serving): the
                    # router does not know it yet.
                    router_roll.ensure_listed(props, _progress, _who(props))
                return outs
            finally:
                self._unlock(lock)

    def _serving(self, t: ssh.Target, unit: str) -> bool:
        """The unit runs now (not crash-looping): an update that need not restart it starts
        nothing. Otherwise (another strategy serves: a switch back to a stack deployed before)
        the update starts it and stops the others, a switch like any other, so it rolls."""
        state = self._show(t, [unit])[unit]
        return state.get("ActiveState") == "active" and state.get("SubState") != "auto-restart"

    def _switch_behind_router(self, t: ssh.Target, props: dict, unit: str) -> dict:
        """This host's turn in a rolling switch: out of the router and drained, the switch (which
        rolls itself back when the new strategy fails), back in the router and healthy. A
        failure stops the roll here: the hosts after it depend on this service."""
        who = _who(props)
        try:
            with router_roll.membership(t, props, _progress, who):
                return self._switch(t, props, unit, True)
        except (DeployError, ssh.RemoteError) as exc:
            raise DeployError(f"the roll stopped at {who.strip().rstrip(':') or t.label}: the hosts after it keep serving "
                              f"their strategy.\n{exc}") from None

    def _managed(self, t: ssh.Target, unit: str, port: int) -> tuple[dict[str, dict[str, str]], Optional[str]]:
        """The gpu-serving units the host has and their state, `unit` first, and a process that
        holds the serving port and is none of them (switch.py), in one round trip."""
        out = ssh.run(t, ["sh", "-c", switch.MANAGED_UNITS_SCRIPT, "sh", unit, str(port)], purpose="listing the gpu-serving units",
                      timeout=60, read=True)
        units = switch.parse_managed_units(out.stdout)
        units = units if unit in units else {unit: {}, **units}
        ss_out, cgroups = switch.parse_listeners(out.stdout)
        return units, switch.foreign_listener(ss_out, cgroups, list(units))

    def _switch(self, t: ssh.Target, props: dict, unit: str, restart: bool) -> dict:
        """Observe the host, plan (switch.py decides), then run the plan's steps in order."""
        units, holder = self._managed(t, unit, int(props["port"]))
        plan = switch.plan(unit, units, restart=restart, active=props.get("active", True),
                           enabled=props.get("enabled", True), port_holder=holder, port=int(props["port"]), host=t.label)
        if plan.refused:
            raise ssh.RemoteError(plan.refused)
        if plan.progress:
            _progress(f"{_who(props)}{unit}: {plan.progress}")
        # The unit's drop-ins go first (before the reload that follows them), while it still serves.
        steps = [s for s in plan.steps if s.action != "remove-drop-ins"]
        for step in plan.steps:
            if step.action == "remove-drop-ins":
                _progress(f"{_who(props)}{unit}: removing its drop-ins (hand edits of the unit): {', '.join(step.units)}")
                self._do(t, step, unit)
        report = None
        after = steps
        if plan.starts:
            # The steps before the start (daemon-reload, then the stop of what serves) and the start
            # in one round trip: the GPUs are idle only from the stop to the new server's start.
            at = steps.index(plan.starts)
            since, baseline = probe.start(t, unit, plan.starts.action, before=steps[:at])
            report = probe.wait_ready(t, unit, bind=props["bind"], port=int(props["port"]), declared=props["declared"],
                                      settings=props.get("readiness") or {}, since=since, baseline=baseline,
                                      progress=lambda m: _progress(_who(props) + m, ephemeral=True))
            if report.status != R.READY:
                self._fail(t, props, report, plan, since)
            _remember_check(t, unit, report.as_dict())
            after = steps[at + 1:]
        # The rest (enable it, disable the others) and the read of what it runs now: one round trip.
        live = probe.run_steps(t, unit, after)
        _take_replaced(t)  # kept: nothing to put back
        return self._outs(props, plan.previous, report.as_dict() if report else None, live)

    def _do(self, t: ssh.Target, step: switch.Step, unit: str, check: bool = True) -> None:
        """One systemctl step of a plan (switch.ACTIONS); start, restart and restore-files are the
        caller's (they wait, or write files)."""
        names = ", ".join(step.units)
        if step.action == "daemon-reload":
            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120, check=check)
        elif step.action == "stop":
            # Returns when the units are down; other strategies (maybe several) get longer than `unit`.
            ssh.run(t, ["systemctl", "stop", *step.units], purpose=f"stopping {names}",
                    timeout=180 if step.units == (unit,) else 240, check=check)
        elif step.action in ("enable", "disable"):
            ssh.run(t, ["systemctl", step.action, "--quiet", *step.units], purpose=f"{step.action[:-1]}ing {names}",
                    timeout=60, check=check)
        elif step.action == "remove-drop-ins":
            for path in step.units:
                # What was there goes back if the switch fails (restore-files), like a replaced file.
                _remember_replaced(t, path, ssh.read_file(t, path), ssh.stat_mode(t, path))
            ssh.run(t, ["sh", "-c", switch.REMOVE_DROP_INS_SCRIPT, "sh", *step.units], purpose=f"removing the drop-ins {names}",
                    timeout=60, check=check)
        else:
            raise ValueError(f"switch step {step} is not a systemctl step")

    def _fail(self, t, props, report: R.Report, plan: switch.SwitchPlan, since: int):
        """The start failed: the journal first (what the user needs), then the plan's on_failure."""
        unit = props["unit"]
        journal = probe.journal_tail(t, unit, since, 50, _secrets(props))
        restored: list[str] = []
        rollback, served = f"No strategy was serving before; {unit} was stopped.", True
        for step in plan.on_failure:
            if step.action == "restore-files":
                restored = self._restore(t)
            elif step.action == "start":
                served, rollback = self._roll_back(t, props, step.units[0])
            else:
                self._do(t, step, unit, check=False)  # undoing: each step is tried, whatever the one before did
        if restored:
            rollback += "\nPut back as they were: " + ", ".join(restored) + "."
        message = ssh.redact(f"readiness: {report.status}: {report.reason}\n{rollback}\nLast lines of journalctl -u {unit}:\n{journal}",
                             _secrets(props))
        if not served:
            summary = ssh.redact(rollback.splitlines()[0], _secrets(props))
            # The unit as it is now (stopped), read as a switch's last step reads it.
            raise RollbackFailed(message, self._outs(props, plan.previous, {**report.as_dict(), "rollback": summary},
                                                     probe.run_steps(t, unit, [])))
        raise DeployError(message)

    def _restore(self, t: ssh.Target) -> list[str]:
        """Write back, byte for byte, every file this run replaced on the host (a file it created,
        the failed strategy's own unit, stays: stopped and disabled, it runs nothing)."""
        restored = []
        for path, (data, mode) in sorted(_take_replaced(t).items()):
            if data is not None:
                ssh.write_file(t, path, data, mode if mode is not None else 0o644)
                restored.append(path)
        if restored:
            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120, check=False)
        return restored

    def _roll_back(self, t: ssh.Target, props: dict, previous: str) -> tuple[bool, str]:
        """Start `previous` again and wait for a real generation: whether it serves again, and the
        message that says so."""
        bind, port = self._address_of(t, previous, props)
        try:
            since, baseline = probe.start(t, previous, "start")
            report = probe.wait_ready(t, previous, bind=bind, port=port, declared={},
                                      settings=props.get("readiness") or {}, since=since, baseline=baseline,
                                      progress=lambda m: _progress(_who(props) + m, ephemeral=True))
        except ssh.RemoteError as exc:
            return False, f"{ROLLBACK_FAILED} nothing serves on {t.label}: {previous} could not be started again ({exc})."
        if report.status == R.READY:
            return True, f"Rolled back: restarted {previous}, the strategy that was serving before; it generates again."
        journal = probe.journal_tail(t, previous, since, 20, _secrets(props))
        return False, (f"{ROLLBACK_FAILED} nothing serves on {t.label}: {previous}, the strategy that was serving before, "
                       f"did not come back ({report.status}: {report.reason}).\nLast lines of journalctl -u {previous}:\n{journal}")

    @staticmethod
    def _address_of(t: ssh.Target, unit: str, props: dict) -> tuple[str, int]:
        """The bind address and port `unit` serves on (its ExecStart), for the rollback's probe."""
        import re
        out = ssh.run(t, ["systemctl", "show", "-p", "ExecStart", "--value", "--", unit], purpose=f"reading {unit}'s command",
                      timeout=30, check=False, read=True).stdout
        port = re.search(r"--port ([0-9]+)", out)
        host = re.search(r"--host ([^ ;]+)", out)
        return (host.group(1) if host else props["bind"]), (int(port.group(1)) if port else int(props["port"]))

    def _lock(self, t: ssh.Target, props: dict):
        wait = int(float((props.get("readiness") or {}).get("lockWaitSeconds", LOCK_WAIT_SECONDS)))
        return host_lock(t, wait)

    def _unlock(self, chan) -> None:
        host_unlock(chan)

    def _outs(self, props, previous, report, live: str) -> dict:
        """The outputs of a switch from `live` (SERVICE_SCRIPT's answer, read after its last step)."""
        head, sections = self._split_read(live)
        state = self._states(head, [props["unit"]])[props["unit"]]
        active = props.get("active", True)
        return {**props, "previous": previous, "readinessReport": report,
                "active": state.get("ActiveState") == "active" if active else False,
                "enabled": state.get("UnitFileState") == "enabled",
                "runningServer": self._running(props, state, sections) if active and state.get("LoadState") != "not-found"
                else R.NOT_RUNNING}

    def check(self, olds, news):
        # The restart line and the switch block (preview.py), said in the run the program says.
        preview.before_change(olds, news)
        routed_guard.refuse(olds, news)  # another fleet's router sends this host requests: refused
        return CheckResult(news, [])

    def create(self, props):
        # A unit that already runs exactly what is declared is taken over, not restarted: its
        # resource was renamed (a fleet entry renamed, a stack turned into a fleet of that machine,
        # whose old name's delete then leaves it serving), and a restart would reload the model for
        # a change of names. Anything else running, or nothing, is started as declared.
        restart = self._running_now(props) != R.AS_DECLARED
        if not restart:
            _progress(f"{_who(props)}{props['unit']} already runs as declared: taken over, not restarted")
        try:
            outs = self._start(props, restart=restart)
        except RollbackFailed as exc:
            outs = self._after_failed_rollback(props, exc)
        except (DeployError, ssh.RemoteError) as exc:
            raise _named(props, exc) from None
        return CreateResult(id_=self._id(props), outs={**outs, "readinessReport": self._last_check(outs)})

    @staticmethod
    def _id(props: dict) -> str:
        return f"{props['connection']['host']}:{props['unit']}"

    def update(self, id, olds, news):
        # Restart when the declaration changed, or when the running process was started from
        # other settings than the ones it declares (a hand edit + restart, since repaired on
        # disk): rewriting the files alone would leave it running the edit.
        restart = switch.why_restart(olds, news, lambda: self._running_now(news))
        if switch.runs_an_edit(olds):
            _progress(f"{_who(news)}{news['unit']}: restarting: {olds['runningServer']}")
        for line in olds.get("foreignDropIns") or []:
            _progress(f"{_who(news)}warning: {news['unit']}: {dropins.STAYS}{line}")
        try:
            outs = self._start(news, restart=restart is not None)
        except RollbackFailed as exc:
            outs = self._after_failed_rollback(news, exc)
        except (DeployError, ssh.RemoteError) as exc:
            raise _named(news, exc) from None
        return UpdateResult(outs={**outs, "readinessReport": self._last_check(outs, olds)})

    @staticmethod
    def _after_failed_rollback(props: dict, exc: RollbackFailed) -> dict:
        """The outputs of a switch that left nothing serving: the unit as it is (stopped), the
        failed start's report with `rollback`, and `switchFailure`, the message the run then
        fails with (FailedSwitch). The next `up` tries the switch again (diff)."""
        return {**exc.outs, "switchFailure": str(_named(props, exc))}

    @staticmethod
    def _last_check(outs: dict, olds: Optional[dict] = None) -> dict:
        """The report of the last start that checked readiness; one with no `checked_at` when there
        never was one (not an empty map, which the state may drop). Never None: an output left
        empty is *unknown* in every later preview, so the readiness check downstream would be "to
        update" in each preview and unchanged in each up, for ever (the drift that only two
        switches cured)."""
        return outs.get("readinessReport") or (olds or {}).get("readinessReport") or {"checked_at": ""}

    @staticmethod
    def _split_read(stdout: str) -> tuple[str, dict[str, str]]:
        """SERVICE_SCRIPT's answer: the `systemctl show` block, and the process sections."""
        head, marker, rest = stdout.partition("\n@@cmdline\n")
        return head, (split_sections("@@cmdline\n" + rest) if marker else {})

    @staticmethod
    def _running(props: dict, state: dict[str, str], sections: dict[str, str]) -> str:
        """`runningServer`: AS_DECLARED, NOT_RUNNING, or what the main process runs otherwise
        (R.running_reason). Secret values are compared here and never leave this function."""
        import base64
        if state.get("ActiveState") not in ("active", "reloading") or not sections.get("cmdline", "").strip():
            return R.NOT_RUNNING
        if "execStart" not in props or "environment" not in props:
            return R.AS_DECLARED  # a state written before the process was compared: nothing to compare with
        try:
            argv = R.split_nul(base64.b64decode(sections.get("cmdline", "").strip()))
            environ = R.split_nul(base64.b64decode(sections.get("environ", "").strip()))
        except ValueError:
            return R.NOT_RUNNING  # the process ended while it was read
        running_env = dict(item.partition("=")[::2] for item in environ)
        manager = dict(line.partition("=")[::2] for line in sections.get("manager", "").splitlines() if "=" in line)
        secrets = props.get("secretEnvironment") or {}
        same = {key: running_env.get(key) == value for key, value in secrets.items()}
        differences = R.compare_running(_argv(props["execStart"]), props["environment"] or {}, same, argv, running_env, manager)
        return R.running_reason(differences) if differences else R.AS_DECLARED

    def _read_live(self, t: ssh.Target, props: dict) -> Optional[dict]:
        request, = self.read_requests(props)
        head, sections = self._split_read(ssh.fetch(t, request).stdout)
        state = self._states(head, [props["unit"]])[props["unit"]]
        if state.get("LoadState") == "not-found":
            if state.get("ActiveState") not in S.SERVING_STATES:
                return None
            # Its file deleted by hand (and systemd reloaded) while it runs: systemd keeps it
            # running, and the unit file's resource shows the deletion and writes the file back,
            # which is the whole repair. Read as gone, the preview would promise a start of a
            # model that the update then leaves serving. Without its file systemd cannot say
            # whether it is enabled: the last reading stands.
            return {"active": state.get("ActiveState") == "active", "enabled": bool(props.get("enabled", True)),
                    "runningServer": self._running(props, state, sections)}
        live = {"active": state.get("ActiveState") == "active", "enabled": state.get("UnitFileState") == "enabled",
                "runningServer": self._running(props, state, sections)}
        # Drop-ins of the unit (`systemctl edit`): hand edits, drift until an up removes them. The
        # key only when there are some, so a state without any reads as before.
        drop_ins = switch.own_drop_ins(props["unit"], state.get("DropInPaths", ""))
        if drop_ins:
            live["dropIns"] = drop_ins
        # Every other drop-in systemd applies (a package's under /usr/lib) and the environment it
        # would start with: drift an up does not remove (dropins.py).
        live.update(dropins.live_fields(props, state.get("DropInPaths", ""), sections, lambda x: ssh.redact(x, _secrets(props))))
        # Another strategy enabled by hand beside the one that serves: a reboot would start both
        # and either could end up serving. Said by the serving unit only (the others' stacks are
        # superseded anyway); its up disables them, as a switch does.
        others = sorted(line.strip() for line in sections.get("others-enabled", "").splitlines() if line.strip())
        if others and live["active"] and props.get("enabled", True):
            live["othersEnabled"] = others
        return live

    def _running_now(self, props: dict) -> str:
        """After a start: what the process runs, read back rather than assumed."""
        if not props.get("active", True):
            return R.NOT_RUNNING
        live = self._read_live(_require_target(props), props)
        return live["runningServer"] if live else R.NOT_RUNNING

    @staticmethod
    def _superseded(t: ssh.Target, unit: str) -> Optional[str]:
        """`superseded: <unit> (stack <name>) serves since <time>` when another gpu-serving unit
        serves in this one's place: a switch by another stack, not an edit of this one."""
        try:
            # With the environments: the very read the switch preview makes (check), so one
            # answer serves both, and the readiness read's (ssh.run's `reuse`).
            return S.superseded_by(unit, S.parse_serving(ssh.fetch(t, reads.serving(with_environ=True)).stdout))
        except ssh.RemoteError:
            return None  # "not running" stays true; the drift shows either way

    def read(self, id, props):
        t = _require_target(props)
        live = self._read_live(t, props)
        if live is None:
            return ReadResult(id_=None, outs={})
        if live["runningServer"] == R.NOT_RUNNING:
            live["runningServer"] = self._superseded(t, props["unit"]) or R.NOT_RUNNING
        props = _without_last_reading(props)  # the last reading's: this one says whether there are any
        outs = {**props, **live}
        kept = {k: props[k] for k in props if k not in ("previous", "readinessReport", "switchFailure")}
        return ReadResult(id_=id, outs=outs, inputs={**kept, **live})

    def diff(self, id, olds, news):
        active = news.get("active", True)
        # A state written before the process was compared has no runningServer: as declared.
        olds = {**olds, "runningServer": olds.get("runningServer", R.AS_DECLARED)}
        news = {**news, "active": active, "enabled": news.get("enabled", True),
                "runningServer": news.get("runningServer", R.AS_DECLARED) if active else olds["runningServer"]}
        # execStart as an argv: a state written before it was one line holds the same list.
        olds, news = {**olds, "execStart": _argv(olds.get("execStart"))}, {**news, "execStart": _argv(news.get("execStart"))}
        changed = _changed(olds, news, ["unit", "configHash", "declared", "port", "bind", "active", "enabled",
                                        "connection", "runningServer", "execStart", "environment", *READ_ONLY_WHEN_SO])
        if olds.get("readinessReport") is None:
            changed.append("readinessReport")  # a state left empty by an earlier version: record it once
        if olds.get("switchFailure"):
            changed.append("switchFailure")  # the last switch left nothing serving: try it again
        changed += ["router"] if isinstance(news.get("router"), dict) and news["router"].get("rejoin") else []  # put back (roll.py)
        moved = _moved(olds, news)
        if moved:
            # Said at the diff, so the preview says it before anything happens.
            _progress(f"{_who(news)}{news.get('unit')} moves from {olds['connection'].get('host')} to "
                      f"{news['connection'].get('host')}: it starts there and is checked, then it is stopped "
                      "and its unit file removed where it served (CUDA, the venv and the environment file stay)")
        replaces = ["unit"] if olds.get("unit") != news.get("unit") else []
        return DiffResult(changes=bool(changed), replaces=replaces + moved, stables=[])

    def delete(self, id, props):
        if identity.left_behind(props):
            c = props["connection"]
            _progress(f"{_who(props)}warning: {props['unit']} is left on {c.get('host')}, which does not answer: "
                      f"if it comes back it starts {props['unit']} at boot; run `systemctl disable --now {props['unit']}` there")
            return
        if identity.claimed_elsewhere(props, "unit"):
            _progress(f"{_who(props)}{props['unit']} is declared under another name on the same machine now "
                      "(a renamed fleet entry, or a stack turned into a fleet): it is left serving")
            return
        t = _require_target(props, stored=True)
        try:
            serving = self._show(t, [props["unit"]])[props["unit"]].get("ActiveState") in S.SERVING_STATES
        except ssh.RemoteError:
            serving = False  # the stop below still runs; only the warning is lost
        if serving and props.get("router"):
            try:
                router_roll.leave(t, props, _progress, _who(props))
            except ssh.RemoteError as exc:
                _progress(f"{_who(props)}warning: {props['unit']} could not be taken out of the router first, requests "
                          f"in flight there may fail: {exc}")
        # Only this stack's own unit: siblings and shared files are never touched.
        _stop_and_disable(t, props["unit"])
        if serving:
            # Pulumi calls no provider code in a destroy's preview: the warning comes when it happens.
            _progress(f"{_who(props)}warning: {props['unit']} served and is stopped: nothing serves on {t.label} now "
                      "(deploy a strategy stack to serve again)")


# ---------------------------------------------------------------------------------------
# What a readiness report says it is (its `checked_by`): every report is "as of" its checked_at.
CHECKED_BY_START = "up: the switch started the unit and waited for a generation"
CHECKED_BY_UP = "up: looked at the unit it did not restart (waited while it loaded)"
CHECKED_BY_REFRESH = "refresh: one look, nothing started"
# The Readiness resource's inputs, as the program gives them (components/readiness_check.py).
READINESS_INPUTS = ("connection", "unit", "bind", "port", "declared", "readiness", "report", "hostEntry")


def props_unit(props: dict) -> str:
    return str(props.get("unit", "the unit"))


@identity.guarded
class ReadinessProvider(ResourceProvider):
    """The readiness report as a resource: created from the service's check, re-probed on
    refresh, so a server that died since the last `up` shows as drift. Every report, here and
    in the service's start, is built by readiness.build_report.

    props: connection, unit, bind, port, declared (layout), report (the service's check when it
    started the unit), readiness (the deadlines, for waiting on a server that is loading)."""

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.readiness(props)

    def _probe(self, props) -> R.Report:
        """One look (a refresh): the unit's state, the health and, when it generates, what it runs."""
        t = _require_target(props)
        request, = self.read_requests(props)
        obs, info_read = probe.read_snapshot(ssh.fetch(t, request).stdout, 0.0)
        verdict = R.judge_now(obs)
        if verdict.outcome == R.READY and info_read is None:
            info_read = probe.server_info(t, reads.probe_address(props["bind"]), int(props["port"]))
        # The same builder as the wait's (probe.wait_ready): on the same answer, the same report
        # but for seconds_to_ready, which only a start measures (tests/test_readiness_paths.py).
        return R.build_report(verdict, unit=props["unit"], declared=props["declared"], checked_at=probe.now_iso(),
                              url=f"http://{reads.probe_address(props['bind'])}:{int(props['port'])}", info_read=info_read)

    def _converge(self, props) -> dict:
        """An up that did not restart the unit: look, and wait for a server that is loading (it
        was restarted by systemd after a crash, by an operator, or by an interrupted run), so one
        `up` ends with the verdict rather than recording "loading" as drift for ever."""
        report = self._probe(props)
        t = _require_target(props)
        deadline = time.monotonic() + float((props.get("readiness") or {}).get("timeoutSeconds", 3600))
        if report.status == R.STOPPED:
            # Between a crash and systemd's restart (RestartSec): the restart is coming, wait for it.
            state = probe.unit_state(t, props["unit"])
            if state.sub_state == "auto-restart":
                _progress(f"{_who(props)}{props['unit']}: systemd restarts it (it was killed or crashed); waiting")
            while state.sub_state == "auto-restart" and time.monotonic() < deadline:
                time.sleep(1)
                state = probe.unit_state(t, props["unit"])
            report = self._probe(props)
        if report.status == R.LOADING:
            _progress(f"{_who(props)}{props['unit']}: {report.reason}; waiting for it to be ready")
            baseline = probe.unit_state(t, props["unit"])
            report = probe.wait_ready(t, props["unit"], bind=props["bind"], port=int(props["port"]),
                                      declared=props["declared"], settings=props.get("readiness") or {}, since=None,
                                      baseline=baseline, progress=lambda m: _progress(_who(props) + m, ephemeral=True))
        if report.status != R.READY:
            # Nothing here restarts a server (the service does, when its settings or its process
            # differ): say what is wrong rather than record a broken server as deployed.
            raise DeployError(f"{_who(props)}readiness: {report.status}: {report.reason} ({props_unit(props)}); "
                              f"check `journalctl -u {props_unit(props)}` on the host")
        return {**report.as_dict(), "checked_by": CHECKED_BY_UP}

    @staticmethod
    def _fresh(olds: dict, news: dict) -> bool:
        """The service started the unit in this run and checked it: its report is the truth."""
        given = news.get("report")
        return (isinstance(given, dict) and bool(given.get("checked_at"))
                and given.get("checked_at") != (olds.get("report") or {}).get("checked_at"))

    def create(self, props):
        report = {**props["report"], "checked_by": CHECKED_BY_START} if self._fresh({}, props) else self._converge(props)
        return CreateResult(id_=f"{props['connection']['host']}:{props['unit']}:readiness", outs={**props, **report})

    def update(self, id, olds, news):
        report = {**news["report"], "checked_by": CHECKED_BY_START} if self._fresh(olds, news) else self._converge(news)
        return UpdateResult(outs={**news, **report})

    def read(self, id, props):
        given = _just_checked(_require_target(props), props["unit"])
        if given is not None:
            # A switch of this run checked it moments ago (a real generation, and again after the
            # settle time): that check is the look, and the update that follows records it.
            return ReadResult(id_=id, outs={**props, **given, "checked_by": CHECKED_BY_START},
                              inputs={k: v for k, v in props.items() if k in READINESS_INPUTS})
        report = self._probe(props).as_dict()
        if report["status"] == R.READY:
            # seconds_to_ready belongs to the start that measured it; keep it.
            report["seconds_to_ready"] = props.get("seconds_to_ready")
        elif report["status"] == R.STOPPED:
            # Stopped because another strategy took the host: say which, so a switch never reads as a crash.
            superseded = ServiceProvider._superseded(_require_target(props), props["unit"])
            if superseded:
                report["reason"] = f"{superseded}; {report['reason']}"
        report["checked_by"] = CHECKED_BY_REFRESH
        report["rollback"] = None  # one look: a rollback is what a start reports
        # The inputs are what the program gives (not the report's fields): a later update then
        # shows what changes, not every field of the last report as removed.
        inputs = {k: v for k, v in props.items() if k in READINESS_INPUTS}
        return ReadResult(id_=id, outs={**props, **report}, inputs=inputs)

    def diff(self, id, olds, news):
        changed = _changed(olds, news, ["unit", "port", "declared", "connection"])
        if olds.get("status") not in (None, R.READY):
            changed.append("status")
        report = news.get("report")
        if report is not None and not isinstance(report, dict):
            # Unknown in a preview: the service is about to start and check again.
            changed.append("report")
        elif report and (olds.get("report") or {}).get("checked_at") != report.get("checked_at"):
            changed.append("report")
        return DiffResult(changes=bool(changed), replaces=_moved(olds, news), stables=[])

    def delete(self, id, props):
        pass


# ---------------------------------------------------------------------------------------
class FailedSwitchProvider(ResourceProvider):
    """Fails the run after a switch whose rollback failed (RollbackFailed), once the readiness
    resource has recorded it: registered by the program only then, so it is never in a state."""

    def create(self, props):
        raise DeployError(str(props["message"]))
