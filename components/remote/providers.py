"""Pulumi dynamic providers for what must be READ back from a host, so drift is visible.

`pulumi_command` cannot read (its refresh never looks at the host), so the unit files, the
shared environment file, the service's state and readiness are dynamic resources here: each
`read` asks the host what is really there, and each `diff` compares that with the declaration,
naming the fields that differ. The providers hold no state of their own (the engine pickles
them into the stack, by this module's path: the classes stay here): every call builds its SSH
target from the props, and opens them as the resource's spec (components/core/specs.py).

Each read is built by reads.py from the props (`read_requests`) and run by `ssh.fetch`. The
host-facts resource, the first remote work of a run, starts the reads of the later resources
(its `prefetch` prop, from components/core/reads.py) on the connection it opens, so a refresh does
not wait for them one resource after the other (readcache.py: what may be served, and when not).

The switch itself (lock, plan, start, judge, roll back) is remote/switch_executor.py; what a
unit runs now, remote/service_state.py.
"""
from __future__ import annotations

import hashlib
import posixpath
import time
from typing import Optional

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
from ..core.facts import FactError, HostFacts, check_facts, parse_facts, split_sections
from ..core.fitness_baseline import drift_of, parse_baseline
from ..core.rules import breaks_secret_line
from ..core import status as S
from ..core.specs import HostFactsSpec, ReadinessSpec, RemoteFileSpec, ServiceSpec
from . import cli, host_lock, identity, ledger_record, preview, probe, routed_guard, said, service_state, ssh, switch_executor
from . import router as router_roll
from .common import changed as _changed
from .common import host_name
from .common import moved as _moved
from .common import progress as _progress
from .common import require_target as _require_target
from .common import resource_id
from .common import stop_and_disable as _stop_and_disable
from .provider_errors import ROLLBACK_FAILED, DeployError, RollbackFailed, named
from .service_state import declared_inputs, without_last_reading
from .switch_memory import just_checked, remember_replaced
from .service_diff import service_diff

__all__ = ["DeployError", "RollbackFailed", "ROLLBACK_FAILED", "HostFactsProvider", "RemoteFileProvider", "ServiceProvider",
           "ReadinessProvider", "FailedSwitchProvider"]

def _foreign_owner(t: ssh.Target, owner: Optional[str]) -> bool:
    """A file of ours (written as root) that belongs to someone else now. Only over a root login:
    another login writes its files as itself."""
    return t.user == "root" and owner is not None and owner != "0:0"


# ---------------------------------------------------------------------------------------
@identity.guarded
class HostFactsProvider(ResourceProvider):
    """Reads GPUs, driver, CUDA, interconnect and OS in one round trip, and refuses a host that
    cannot run the declared strategy (before any unit is written: units depend on this).

    props: HostFactsSpec (connection, cudaHome, expect, prefetch: reads.py specs of the reads the
    later resources make, started at once on the connection this resource opens; never a change).
    Outputs: facts; fitnessDrift (only when the GPUs' fitness differs from the host's benchmark
    baseline, core/fitness_baseline.py): its own kind of drift, which `up` records and cannot repair.
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.host_facts(props)

    def _read(self, props: dict) -> tuple[dict, dict]:
        """(the facts, {"fitnessDrift": line} when the fitness drifted from the host's baseline, else {})."""
        t = _require_target(props)
        request, = self.read_requests(props)
        prefetch = HostFactsSpec.from_props(props).prefetch
        later = reads.expand(prefetch) if prefetch else []
        if later:
            if not all(ssh.held(t, r) for r in [request, *later]):
                ssh.client(t)  # the connection every read of this run shares, opened here
            ssh.prefetch(t, later)  # never connects: with every read handed over, none is made
        out = ssh.fetch_first(t, request)
        try:
            facts = parse_facts(out.stdout)
        except FactError as exc:  # cut short, or not what nvidia-smi prints: never read as "0 GPUs"
            raise ssh.RemoteError(f"reading host facts on {t.label} (exit {out.rc}): {exc}") from None
        # The baseline the host's last benchmark left (read in the same answer): a file it cannot
        # read is no drift (the switch's fitness check names it).
        baseline, _ = parse_baseline(split_sections(out.stdout).get("baseline"))
        drift = drift_of(host_name(props, t), baseline, facts.fitness)
        return facts.as_dict(), ({"fitnessDrift": drift} if drift else {})

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
            spec = HostFactsSpec.from_props(news)
            if not spec.prefetch or not isinstance(spec.connection, dict) or spec.connection.get("unavailable"):
                return
            t = ssh.Target.from_props(news)
            if ssh.prefetch_window_open(t):
                ssh.prefetch(t, reads.expand(spec.prefetch))
        except Exception:  # noqa: BLE001 - a prefetch is never a reason to fail a check
            pass

    def check(self, _olds, news):
        self._prefetch_after_read(news)
        return CheckResult(news, [])

    @staticmethod
    def _check(spec: HostFactsSpec, facts_dict: dict) -> list[str]:
        e = spec.expect
        # The router's machine declares only neededGpus 0 (check_facts then expects nothing).
        return check_facts(HostFacts.from_dict(facts_dict), gpu_count=e.gpu_count, gpu_memory_gb=e.gpu_memory_gb,
                           interconnect=e.interconnect, needed_gpus=e.needed_gpus)

    def _apply(self, props: dict) -> dict:
        spec = HostFactsSpec.from_props(props)
        facts, drift = self._read(props)
        problems = self._check(spec, facts)
        if problems:
            where = f"its gpu-serving:hosts entry {spec.host_entry!r}" if spec.host_entry else "gpu-serving:host"
            raise DeployError(f"{spec.who}the host does not match {where}, nothing was changed:\n  - " + "\n  - ".join(problems))
        # A drift is recorded again, not repaired (no file or setting of the stack holds it): the
        # next drift check still reports it, until the machine is restored or benchmarked again.
        return {**props, "facts": facts, **drift}

    def create(self, props):
        outs = self._apply(props)
        return CreateResult(id_=resource_id(props, "port"), outs=outs)

    def update(self, id, olds, news):
        return UpdateResult(outs=self._apply(news))

    def read(self, id, props):
        # The stored list: in a no-op, exactly this run's; `check` adds what changed since.
        facts, drift = self._read(props)
        kept = {k: v for k, v in props.items() if k != "fitnessDrift"}  # this read says whether there is one
        return ReadResult(id_=id, outs={**kept, "facts": facts, **drift})

    def diff(self, id, olds, news):
        # Not `prefetch`: which reads are started ahead is never a change of the host.
        changed = _changed(olds, news, ["connection", "cudaHome", "expect"])
        facts = olds.get("facts")  # an output of the last read
        if facts and self._check(HostFactsSpec.from_props(news), facts):
            changed.append("facts")
        drift = olds.get("fitnessDrift")  # an output of the last read: the machine, not a file, changed
        if drift:
            changed.append("fitnessDrift")
            if cli.provider_says_preview_things():
                _progress(f"{HostFactsSpec.from_props(news).who}warning: {drift}")
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def delete(self, id, props):
        pass


# ---------------------------------------------------------------------------------------
@identity.guarded
class RemoteFileProvider(ResourceProvider):
    """A file on the host: written atomically, read back on refresh.

    props: RemoteFileSpec (connection, path, content, mode "0644", secretEnvironment: KEY -> value,
    appended as KEY="value" lines and kept out of `content`, so the plain part stays readable in
    diffs; retainOnDelete: shared files; reloadSystemd: a unit file, daemon-reload after delete).
    """

    @staticmethod
    def _bad_secrets(spec: RemoteFileSpec) -> list[str]:
        """Secret values that would end or extend their KEY="value" line (never the values)."""
        return [key for key, value in sorted(dict(spec.secret_environment).items())
                if isinstance(value, str) and breaks_secret_line(value)]

    def check(self, olds, news):
        spec = RemoteFileSpec.from_props(news)
        if not olds and spec.show_when_new and isinstance(news.get("content"), str) and cli.provider_says_preview_things():
            # A new file's text, whole (the engine's display shortens a new multi-line value); a
            # changed one shows as the engine's line diff of `content`, an unchanged one not at all;
            # once a command (in the preview of a `pulumi up`, not again in its update), and once a
            # fleet when its hosts' files read the same (said.py).
            _progress(said.new_file(spec.who, spec.path, spec.content))
        return CheckResult(news, [
            CheckFailure("secretEnvironment", f"the secret for {key} (gpu-serving:hfToken) is empty or contains whitespace, "
                                              "a quote, a backslash, $ or a backtick; a token never does")
            for key in self._bad_secrets(spec)])

    def _full(self, spec: RemoteFileSpec) -> bytes:
        bad = self._bad_secrets(spec)
        if bad:
            raise ssh.RemoteError(f"the secret for {', '.join(bad)} (gpu-serving:hfToken) is empty or contains whitespace, "
                                  "a quote, a backslash, $ or a backtick; refusing to write it into the environment file")
        return (spec.content + spec.secret_lines).encode()

    def _write(self, props: dict) -> dict:
        t = _require_target(props)
        spec = RemoteFileSpec.from_props(props)
        data, path, mode = self._full(spec), spec.path, spec.mode_bits
        if ssh.read_file(t, path) != data or ssh.stat_mode(t, path) != mode or _foreign_owner(t, ssh.stat_owner(t, path)):
            # Under the host lock, like the switch it belongs to: never between another switch's
            # stop and start, nor under its rollback. What it replaces is kept for this run's
            # switch to put back if that fails (switch_memory.py).
            with ssh.one_connection(t, f"{spec.who}writing {path}"):
                lock = host_lock.acquire(t)
                try:
                    current, current_mode = ssh.read_file(t, path), ssh.stat_mode(t, path)
                    # A new file (written beside it, then renamed over it) is root's again.
                    if current != data or current_mode != mode or _foreign_owner(t, ssh.stat_owner(t, path)):
                        remember_replaced(t, path, current, current_mode)
                        ssh.write_file(t, path, data, mode)
                        if spec.reload_systemd:
                            # systemd must load the repaired file, and a new one too: a unit whose
                            # file was deleted by hand while it runs is still known to systemd, and
                            # loading the file back on demand fails (LoadState=error, EBUSY, seen on
                            # systemd 252) until the next daemon-reload; restarts then fail.
                            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)
                finally:
                    host_lock.release(lock)
        return {**props, "sha256": hashlib.sha256(data).hexdigest()}

    def create(self, props):
        return CreateResult(id_=resource_id(props, RemoteFileSpec.from_props(props).path), outs=self._write(props))

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
        props = without_last_reading(props)
        spec = RemoteFileSpec.from_props(props)
        text = data.decode(errors="replace")
        secret_lines = spec.secret_lines
        if secret_lines and text.endswith(secret_lines):
            text = text[: -len(secret_lines)]
        else:
            # The secret part was edited: keep the plain view and never store secret values.
            text = ssh.redact(text, _file_secrets(spec))
        mode = ssh.fetch(t, mode_request)
        state = {**props, "content": text, "mode": f"{mode:04o}" if mode is not None else spec.mode,
                 "sha256": hashlib.sha256(data).hexdigest()}
        owner = ssh.fetch(t, owner_request)
        if _foreign_owner(t, owner):
            # Given to another user by hand: it may read a secret or edit what root runs. The key
            # only then, so a state of root's files reads as before.
            state["owner"] = owner
        if secret_lines and not data.decode(errors="replace").endswith(secret_lines):
            state["secretEnvironment"] = {k: "[edited on host]" for k in dict(spec.secret_environment)}
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
        spec = RemoteFileSpec.from_props(props)
        if spec.retain_on_delete or identity.left_behind(props):
            return  # shared, or on a machine this run moved off because it does not answer (said there)
        if identity.claimed_elsewhere(props, "path"):
            return  # the same file on the same machine, now under another resource name of this run
        t = _require_target(props, stored=True)
        unit = posixpath.basename(spec.path)
        if spec.reload_systemd and unit.endswith(".service"):
            # A unit's file goes only with the unit: stopped and disabled first, so it never runs
            # on without a file (then systemctl can no longer disable it). The service's own
            # delete does the same; Pulumi runs the two at once when a move replaces both.
            _stop_and_disable(t, unit)
        ssh.remove_file(t, spec.path)
        if spec.reload_systemd:
            ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120)


def _file_secrets(spec: RemoteFileSpec) -> list[str]:
    values = [str((spec.connection or {}).get("privateKey") or "")] + [str(v) for v in dict(spec.secret_environment).values()]
    return [v for v in values if v]


# ---------------------------------------------------------------------------------------
@identity.guarded
class ServiceProvider(ResourceProvider):
    """The strategy unit's state: enabled and active, started under a host-wide lock, checked
    by readiness, rolled back to the strategy that served before when it fails
    (remote/switch_executor.py).

    props: ServiceSpec (connection, unit, configHash: what the server runs with, argv and
    environment, a change restarts the unit; execStart and environment: what the main process must
    run, compared with /proc/<MainPID> by `read`; bind, port, declared: the layout for readiness;
    readiness: the deadlines; enabled, active). The other strategies are found on the host when
    switching (switch.py). Outputs: runningServer ("as declared", "not running", or what the
    process runs otherwise: then `update` restarts it), readinessReport.
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.service(props)

    def _start(self, props: dict, restart: bool) -> dict:
        return {**props, **switch_executor.switch_service(ServiceSpec.from_props(props), restart)}

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
        spec = ServiceSpec.from_props(props)
        restart = self._running_now(props) != R.AS_DECLARED
        if not restart:
            _progress(f"{spec.who}{spec.unit} already runs as declared: taken over, not restarted")
        try:
            outs = self._start(props, restart=restart)
        except RollbackFailed as exc:
            outs = self._after_failed_rollback(props, exc)
        except (DeployError, ssh.RemoteError) as exc:
            raise named(spec.host_entry, exc) from None
        return CreateResult(id_=self._id(props), outs={**outs, "readinessReport": self._last_check(outs)})

    @staticmethod
    def _id(props: dict) -> str:
        return resource_id(props, ServiceSpec.from_props(props).unit)

    def update(self, id, olds, news):
        # Restart when the declaration changed, or when the running process was started from
        # other settings than the ones it declares (a hand edit + restart, since repaired on
        # disk): rewriting the files alone would leave it running the edit.
        spec = ServiceSpec.from_props(news)
        restart = switch.why_restart(olds, news, lambda: self._running_now(news))
        if switch.runs_an_edit(olds):
            _progress(f"{spec.who}{spec.unit}: restarting: {olds['runningServer']}")
        for line in olds.get("foreignDropIns") or []:  # an output of the last read
            _progress(f"{spec.who}warning: {spec.unit}: {dropins.STAYS}{line}")
        ledger_record.remember_last_good(olds)  # what a failed start's ledger entry is compared with
        try:
            outs = self._start(news, restart=restart is not None)
        except RollbackFailed as exc:
            outs = self._after_failed_rollback(news, exc)
        except (DeployError, ssh.RemoteError) as exc:
            raise named(spec.host_entry, exc) from None
        return UpdateResult(outs={**outs, "readinessReport": self._last_check(outs, olds)})

    @staticmethod
    def _after_failed_rollback(props: dict, exc: RollbackFailed) -> dict:
        """The outputs of a switch that left nothing serving: the unit as it is (stopped), the
        failed start's report with `rollback`, and `switchFailure`, the message the run then
        fails with (FailedSwitch). The next `up` tries the switch again (diff)."""
        return {**props, **exc.outs, "switchFailure": str(named(ServiceSpec.from_props(props).host_entry, exc))}

    @staticmethod
    def _last_check(outs: dict, olds: Optional[dict] = None) -> dict:
        """The report of the last start that checked readiness; one with no `checked_at` when there
        never was one (not an empty map, which the state may drop). Never None: an output left
        empty is *unknown* in every later preview, so the readiness check downstream would be "to
        update" in each preview and unchanged in each up, for ever (the drift that only two
        switches cured)."""
        return outs.get("readinessReport") or (olds or {}).get("readinessReport") or {"checked_at": ""}

    def _running_now(self, props: dict) -> str:
        """After a start: what the process runs, read back rather than assumed."""
        spec = ServiceSpec.from_props(props)
        if not spec.active:
            return R.NOT_RUNNING
        live = service_state.read_live(_require_target(props), spec, props)
        return live["runningServer"] if live else R.NOT_RUNNING

    def read(self, id, props):
        t = _require_target(props)
        spec = ServiceSpec.from_props(props)
        live = service_state.read_live(t, spec, props)
        if live is None:
            return ReadResult(id_=None, outs={})
        if live["runningServer"] == R.NOT_RUNNING:
            live["runningServer"] = service_state.superseded(t, spec.unit) or R.NOT_RUNNING
        props = without_last_reading(props)  # the last reading's: this one says whether there are any
        outs = {**props, **live}
        return ReadResult(id_=id, outs=outs, inputs={**declared_inputs(props), **live})

    def diff(self, id, olds, news):
        return service_diff(olds, news)

    def delete(self, id, props):
        spec = ServiceSpec.from_props(props)
        who, unit = spec.who, spec.unit
        if identity.left_behind(props):
            host = (spec.connection or {}).get("host")
            _progress(f"{who}warning: {unit} is left on {host}, which does not answer: "
                      f"if it comes back it starts {unit} at boot; run `systemctl disable --now {unit}` there")
            return
        if identity.claimed_elsewhere(props, "unit"):
            _progress(f"{who}{unit} is declared under another name on the same machine now "
                      "(a renamed fleet entry, or a stack turned into a fleet): it is left serving")
            return
        t = _require_target(props, stored=True)
        try:
            serving = service_state.show(t, [unit])[unit].get("ActiveState") in S.SERVING_STATES
        except ssh.RemoteError:
            serving = False  # the stop below still runs; only the warning is lost
        if serving and spec.router is not None:
            try:
                router_roll.leave(t, spec, _progress, who)
            except ssh.RemoteError as exc:
                _progress(f"{who}warning: {unit} could not be taken out of the router first, requests "
                          f"in flight there may fail: {exc}")
        # Only this stack's own unit: siblings and shared files are never touched.
        _stop_and_disable(t, unit)
        if serving:
            # Pulumi calls no provider code in a destroy's preview: the warning comes when it happens.
            _progress(f"{who}warning: {unit} served and is stopped: nothing serves on {t.label} now "
                      "(deploy a strategy stack to serve again)")


# ---------------------------------------------------------------------------------------
# What a readiness report says it is (its `checked_by`): every report is "as of" its checked_at.
CHECKED_BY_START = "up: the switch started the unit and waited for a generation"
CHECKED_BY_UP = "up: looked at the unit it did not restart (waited while it loaded)"
CHECKED_BY_REFRESH = "refresh: one look, nothing started"
# The Readiness resource's inputs, as the program gives them (components/readiness_check.py).
READINESS_INPUTS = ReadinessSpec.INPUTS


@identity.guarded
class ReadinessProvider(ResourceProvider):
    """The readiness report as a resource: created from the service's check, re-probed on
    refresh, so a server that died since the last `up` shows as drift. Every report, here and
    in the service's start, is built by readiness.build_report.

    props: ReadinessSpec (connection, unit, bind, port, declared: the layout; report: the service's
    check when it started the unit; readiness: the deadlines, for waiting on a server that is
    loading)."""

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.readiness(props)

    def _probe(self, props) -> R.Report:
        """One look (a refresh): the unit's state, the health and, when it generates, what it runs."""
        t, spec = _require_target(props), ReadinessSpec.from_props(props)
        request, = self.read_requests(props)
        obs, info_read = probe.read_snapshot(ssh.fetch(t, request).stdout, 0.0)
        verdict = R.judge_now(obs)
        address = reads.probe_address(spec.bind)
        if verdict.outcome == R.READY and info_read is None:
            info_read = probe.server_info(t, address, spec.port)
        # The same builder as the wait's (probe.wait_ready): on the same answer, the same report
        # but for seconds_to_ready, which only a start measures (tests/test_readiness_paths.py).
        return R.build_report(verdict, unit=spec.unit, declared=dict(spec.declared), checked_at=probe.now_iso(),
                              url=f"http://{address}:{spec.port}", info_read=info_read)

    def _converge(self, props) -> dict:
        """An up that did not restart the unit: look, and wait for a server that is loading (it
        was restarted by systemd after a crash, by an operator, or by an interrupted run), so one
        `up` ends with the verdict rather than recording "loading" as drift for ever."""
        spec = ReadinessSpec.from_props(props)
        report = self._probe(props)
        t = _require_target(props)
        deadline = time.monotonic() + spec.readiness.timeout_seconds
        if report.status == R.STOPPED:
            # Between a crash and systemd's restart (RestartSec): the restart is coming, wait for it.
            state = probe.unit_state(t, spec.unit)
            if state.sub_state == "auto-restart":
                _progress(f"{spec.who}{spec.unit}: systemd restarts it (it was killed or crashed); waiting")
            while state.sub_state == "auto-restart" and time.monotonic() < deadline:
                time.sleep(1)
                state = probe.unit_state(t, spec.unit)
            report = self._probe(props)
        if report.status == R.LOADING:
            _progress(f"{spec.who}{spec.unit}: {report.reason}; waiting for it to be ready")
            baseline = probe.unit_state(t, spec.unit)
            report = probe.wait_ready(t, spec.unit, bind=spec.bind, port=spec.port, declared=dict(spec.declared),
                                      deadlines=spec.readiness, since=None, baseline=baseline,
                                      progress=lambda m: _progress(spec.who + m, ephemeral=True))
        if report.status != R.READY:
            # Nothing here restarts a server (the service does, when its settings or its process
            # differ): say what is wrong rather than record a broken server as deployed.
            raise DeployError(f"{spec.who}readiness: {report.status}: {report.reason} ({spec.unit}); "
                              f"check `journalctl -u {spec.unit}` on the host")
        return {**report.as_dict(), "checked_by": CHECKED_BY_UP}

    @staticmethod
    def _fresh(olds: dict, news: dict) -> bool:
        """The service started the unit in this run and checked it: its report is the truth."""
        given = news.get("report")
        return (isinstance(given, dict) and bool(given.get("checked_at"))
                and given.get("checked_at") != (olds.get("report") or {}).get("checked_at"))

    def create(self, props):
        spec = ReadinessSpec.from_props(props)
        report = {**spec.report, "checked_by": CHECKED_BY_START} if self._fresh({}, props) else self._converge(props)
        return CreateResult(id_=resource_id(props, spec.unit, "readiness"), outs={**props, **report})

    def update(self, id, olds, news):
        spec = ReadinessSpec.from_props(news)
        report = {**spec.report, "checked_by": CHECKED_BY_START} if self._fresh(olds, news) else self._converge(news)
        return UpdateResult(outs={**news, **report})

    def read(self, id, props):
        spec = ReadinessSpec.from_props(props)
        given = just_checked(_require_target(props), spec.unit)
        if given is not None:
            # A switch of this run checked it moments ago (a real generation, and again after the
            # settle time): that check is the look, and the update that follows records it.
            return ReadResult(id_=id, outs={**props, **given, "checked_by": CHECKED_BY_START},
                              inputs={k: v for k, v in props.items() if k in READINESS_INPUTS})
        report = self._probe(props).as_dict()
        if report["status"] == R.READY:
            # seconds_to_ready belongs to the start that measured it; keep it.
            report["seconds_to_ready"] = props.get("seconds_to_ready")  # an output of the start that measured it
        elif report["status"] == R.STOPPED:
            # Stopped because another strategy took the host: say which, so a switch never reads as a crash.
            superseded = service_state.superseded(_require_target(props), spec.unit)
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
        raise DeployError(str(props.get("message") or "the switch failed"))
