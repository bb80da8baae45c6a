"""One switch of a serving strategy, over the nodes it runs on: one host (a list of one), or every
node of a multi-node layout switched as one. The single-host and the multi-node service providers
both hand their switch here; this is where a switch is locked, planned, run and rolled back.

1. Lock every node (in rank order: two switches never wait for each other's lock crosswise), over
   one connection each that the lock lives on.
2. Plan each node (core/switch.py decides from the host's units); a refusal on any node refuses
   the whole switch before anything changes.
3. Run the steps before the start (the stop of what serves), then start. One host: the steps and
   the start in one round trip, so the GPUs are idle only from the stop to the start. Several
   nodes: the other strategies stop everywhere first, then the ranks start together (ranks >= 1,
   then rank 0, none waiting for another: rank 0 waits for them in SGLang's rendezvous).
4. Judge: rank 0 by a real generation and the layout it reports; ranks >= 1 by their unit and
   journal, never their HTTP answer (their health server always answers 200).
5. On a failure: the journal of the node that explains it, then every node's `on_failure`: the
   new units stopped and disabled everywhere, the files this run replaced put back, then what
   served before started again on every node and judged. Nothing served before: said so. Not back:
   `RollbackFailed`, with the outputs for the service to record.
6. Finish: the steps after the start (enable, disable the others), the unit read back.

A fleet host behind SGLang's router takes its turn in the roll around step 3-6: out of the router
and drained first, back in after (remote/router.py: membership).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..core import readiness as R
from ..core import switch
from ..core.specs import ServiceSpec
from ..core.switch import SwitchPlan
from . import fitness_gate, host_lock, ledger_record, probe, service_state, ssh
from . import router as router_roll
from .common import progress
from .common import require_target
from .provider_errors import ROLLBACK_FAILED, DeployError, RollbackFailed
from .switch_memory import remember_check, remember_replaced, take_replaced

# How often a multi-node switch looks at the ranks >= 1 while rank 0 loads (one command per rank):
# soon enough to name a rank that has not joined long before rank 0's deadline.
RANK_LOOK_SECONDS = 5.0


@dataclass
class Node:
    """A machine the switch runs on: how to reach it, and the service as it runs there (a
    multi-node layout's node k: `spec.node(k)`)."""

    t: ssh.Target
    spec: ServiceSpec
    rank: int = 0

    @property
    def name(self) -> str:
        return self.spec.host_entry

    @property
    def where(self) -> str:
        return f"{self.name} ({self.t.label})" if self.name else self.t.label

    @property
    def props(self) -> dict[str, Any]:
        """The node's props for the read builders of core/reads.py."""
        return self.spec.to_props()


def nodes_of(spec: ServiceSpec) -> list[Node]:
    """One host: the spec's own; a multi-node layout: every rank, rank 0 first."""
    if not spec.ranks:
        return [Node(require_target(spec.to_props()), spec)]
    out = []
    for k in range(len(spec.ranks)):
        node = spec.node(k)
        out.append(Node(require_target(node.to_props()), node, rank=k))
    return out


def do_step(t: ssh.Target, step: switch.Step, unit: str, check: bool = True) -> None:
    """One systemctl step of a plan (switch.ACTIONS); start, restart and restore-files are the
    executor's (they wait, or write files)."""
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
            remember_replaced(t, path, ssh.read_file(t, path), ssh.stat_mode(t, path))
        ssh.run(t, ["sh", "-c", switch.REMOVE_DROP_INS_SCRIPT, "sh", *step.units], purpose=f"removing the drop-ins {names}",
                timeout=60, check=check)
    else:
        raise ValueError(f"switch step {step} is not a systemctl step")


def restore(t: ssh.Target) -> list[str]:
    """Write back, byte for byte, every file this run replaced on the host (a file it created,
    the failed strategy's own unit, stays: stopped and disabled, it runs nothing)."""
    restored = []
    for path, (data, mode) in sorted(take_replaced(t).items()):
        if data is not None:
            ssh.write_file(t, path, data, mode if mode is not None else 0o644)
            restored.append(path)
    if restored:
        ssh.run(t, ["systemctl", "daemon-reload"], purpose="systemctl daemon-reload", timeout=120, check=False)
    return restored


def managed(t: ssh.Target, unit: str, port: int) -> tuple[dict[str, dict[str, str]], Optional[str]]:
    """The gpu-serving units the host has and their state, `unit` first, and a process that
    holds the serving port and is none of them (switch.py), in one round trip."""
    out = ssh.run(t, ["sh", "-c", switch.MANAGED_UNITS_SCRIPT, "sh", unit, str(port)], purpose="listing the gpu-serving units",
                  timeout=60, read=True)
    units = switch.parse_managed_units(out.stdout)
    units = units if unit in units else {unit: {}, **units}
    ss_out, cgroups = switch.parse_listeners(out.stdout)
    return units, switch.foreign_listener(ss_out, cgroups, list(units))


def serves_at(t: ssh.Target, unit: str, spec: ServiceSpec) -> tuple[str, int, Optional[int]]:
    """Where `unit` (another strategy, started again by a rollback) answers, from its ExecStart:
    bind address, port, and its node rank when it is a rank of a multi-node layout."""
    command = ssh.run(t, ["systemctl", "show", "-p", "ExecStart", "--value", "--", unit], purpose=f"reading {unit}'s command",
                      timeout=30, check=False, read=True).stdout
    port = re.search(r"--port ([0-9]+)", command)
    host = re.search(r"--host ([^ ;]+)", command)
    rank = re.search(r"--node-rank ([0-9]+)", command)
    return ((host.group(1) if host else spec.bind), (int(port.group(1)) if port else spec.port),
            (int(rank.group(1)) if rank else None))


class Switch:
    """The switch of `spec`'s unit over `nodes` (rank 0 first), restarting it when `restart`."""

    def __init__(self, spec: ServiceSpec, nodes: list[Node], restart: bool):
        self.spec, self.nodes, self.restart = spec, nodes, restart
        self.unit = spec.unit
        self.multi = len(nodes) > 1
        self.plans: list[switch.SwitchPlan] = []

    # --- the run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Lock, switch (in its turn behind the router, for a fleet host), unlock: the switch's
        outputs (previous, readinessReport, active, enabled, runningServer, and what a read adds)."""
        with contextlib.ExitStack() as stack:
            # One connection a node for the whole switch: the lock lives on it, and if it drops the
            # switch stops with a clear error rather than carrying on unlocked over a new one.
            for node in self.nodes:
                stack.enter_context(ssh.one_connection(node.t, f"the switch to {self.unit}"))
            for node in self.nodes:
                stack.callback(host_lock.release, host_lock.acquire(node.t))
            return self._in_turn()

    def _in_turn(self) -> dict[str, Any]:
        spec, first = self.spec, self.nodes[0]
        if self.multi or not spec.behind_router:
            return self.switch()
        if self.restart or not service_state.serving(first.t, self.unit):
            # This host's turn in a rolling switch: out of the router and drained, the switch (which
            # rolls itself back when the new strategy fails), back in the router and healthy. A
            # failure stops the roll here: the hosts after it depend on this service.
            try:
                with router_roll.membership(first.t, spec, progress, spec.who):
                    return self.switch(restart=True)
            except (DeployError, ssh.RemoteError) as exc:
                raise DeployError(f"the roll stopped at {spec.who.strip().rstrip(':') or first.t.label}: the hosts after it "
                                  f"keep serving their strategy.\n{exc}") from None
        outs = self.switch()
        # Served without a switch (a host that joined the fleet already serving): the router does
        # not know it yet.
        router_roll.ensure_listed(spec, progress, spec.who)
        return outs

    def switch(self, restart: Optional[bool] = None) -> dict[str, Any]:
        """Observe every node, plan, then run the plans' steps in order (the locks are held)."""
        if restart is not None:
            self.restart = restart
        self.plans = [self._plan(node, self.restart) for node in self.nodes]
        refused = [p.refused for p in self.plans if p.refused]
        if refused:
            raise ssh.RemoteError("; ".join(refused) + (" (no node was changed)" if self.multi else ""))
        if self.multi and self.spec.active and not self.restart and any(p.starts for p in self.plans):
            # A rank cannot join a world that already runs: one node's start restarts them all.
            self.plans = [self._plan(node, True) for node in self.nodes]
        for node, plan in zip(self.nodes, self.plans):
            if plan.progress:
                who = f"hosts[{node.name}] " if self.multi else node.spec.who
                progress(f"{who}{self.unit}: {plan.progress}")
        fitness_gate.before_stop(self.spec, self.nodes, self.plans)  # readiness.fitness: refused here, nothing has stopped
        return self._run_all() if self.multi else self._run_one()

    def _plan(self, node: Node, restart: bool) -> SwitchPlan:
        units, holder = managed(node.t, self.unit, self.spec.port)
        return switch.plan(self.unit, units, restart=restart, active=self.spec.active, enabled=self.spec.enabled,
                           port_holder=holder, port=self.spec.port, host=node.where if self.multi else node.t.label)

    def _run_one(self) -> dict[str, Any]:
        node, plan = self.nodes[0], self.plans[0]
        t, unit = node.t, self.unit
        # The unit's drop-ins go first (before the reload that follows them), while it still serves.
        steps = [s for s in plan.steps if s.action != "remove-drop-ins"]
        for step in plan.steps:
            if step.action == "remove-drop-ins":
                progress(f"{node.spec.who}{unit}: removing its drop-ins (hand edits of the unit): {', '.join(step.units)}")
                do_step(t, step, unit)
        report = None
        after = steps
        if plan.starts:
            # The steps before the start (daemon-reload, then the stop of what serves) and the start
            # in one round trip: the GPUs are idle only from the stop to the new server's start.
            at = steps.index(plan.starts)
            since, baseline = probe.start(t, unit, plan.starts.action, before=steps[:at])
            started = {0: (since, baseline)}
            report = probe.wait_ready(t, unit, bind=self.spec.bind, port=self.spec.port, declared=dict(self.spec.declared),
                                      deadlines=self.spec.readiness, since=since, baseline=baseline,
                                      progress=lambda m: progress(node.spec.who + m, ephemeral=True))
            if report.status != R.READY:
                self.fail(report.status, report.reason, None, started, report)
            remember_check(t, unit, report.as_dict())
            after = steps[at + 1:]
        # The rest (enable it, disable the others) and the read of what it runs now: one round trip.
        live = probe.run_steps(t, unit, after)
        take_replaced(t)  # kept: nothing to put back
        return {"previous": plan.previous, "readinessReport": report.as_dict() if report else None,
                **service_state.outputs(self.spec, live)}

    def _run_all(self) -> dict[str, Any]:
        unit = self.unit
        # Everything before the starts, on every node (other strategies stop everywhere first).
        for node, plan in zip(self.nodes, self.plans):
            for step in plan.steps:
                if step.action in ("start", "restart"):
                    break
                do_step(node.t, step, unit)
        report = self._start_together() if any(p.starts for p in self.plans) else None
        for node, plan in zip(self.nodes, self.plans):
            after = False
            for step in plan.steps:
                if after:
                    do_step(node.t, step, unit)
                after = after or step.action in ("start", "restart")
        for node in self.nodes:
            take_replaced(node.t)  # kept: nothing to put back
        return {"previous": self.plans[0].previous, "readinessReport": report, **self.read_together()}

    def _start_together(self) -> dict[str, Any]:
        """Start every rank within the rendezvous window (ranks >= 1 first, rank 0 last, none
        waiting for another), then judge: rank 0 by generation and layout, the others by unit
        and journal."""
        unit, nodes = self.unit, self.nodes
        started: dict[int, tuple[int, R.UnitState]] = {}
        try:
            for k in [*range(1, len(nodes)), 0]:
                plan = self.plans[k]
                started[k] = probe.start(nodes[k].t, unit, plan.starts.action if plan.starts else "restart")
        except ssh.RemoteError as exc:
            self.fail(R.CRASHED, str(exc), None, started, None)
        since0, base0 = started[0]
        report = probe.wait_ready(nodes[0].t, unit, bind=self.spec.bind, port=self.spec.port, declared=dict(self.spec.declared),
                                  deadlines=self.spec.readiness, since=since0, baseline=base0,
                                  progress=lambda m: progress(f"hosts[{nodes[0].name}] rank 0: {m}", ephemeral=True),
                                  others=self._ranks_look(started))
        ranks = []
        for k in range(1, len(nodes)):
            since, baseline = started[k]
            now = probe.unit_state(nodes[k].t, unit)
            journal = probe.journal_tail(nodes[k].t, unit, since, 400, self.spec.secrets)
            ranks.append(R.RankState(k, nodes[k].where, R.rank_problem(baseline, now), R.JOINED_LINE in journal))
        status, reason, culprit = R.judge_ranks(report.status, report.reason, ranks)
        report = dataclasses.replace(report, status=status, reason=reason)
        if status != R.READY:
            self.fail(status, reason, culprit, started, report)
        return report.as_dict()

    def _ranks_look(self, started: dict[int, tuple[int, R.UnitState]]) -> Callable[[], Optional[str]]:
        """What rank 0's wait asks at each poll (probe.wait_ready's `others`): which ranks >= 1 have
        not joined yet, looked at every RANK_LOOK_SECONDS at most and said when it changes; once all
        joined, no more looks. Returns why waiting longer is pointless (None: it is not)."""
        import time
        nodes, unit = self.nodes, self.unit
        last: dict[str, Any] = {"at": None, "said": ("", None)}

        def look() -> Optional[str]:
            now = time.monotonic()
            if last["said"][0] == "every rank joined" or (last["at"] is not None and now - last["at"] < RANK_LOOK_SECONDS):
                return last["said"][1]
            last["at"] = now
            waiting: list[str] = []
            gone: list[str] = []
            for k in range(1, len(nodes)):
                state, joined = probe.rank_look(nodes[k].t, unit)
                if joined:
                    continue
                who = f"rank {k} on {nodes[k].where}"
                problem = R.rank_problem(started[k][1], state)
                (gone if problem else waiting).append(f"{who}: {problem}" if problem else who)
            said = R.ranks_waited_for(waiting, gone)
            if said[0] != last["said"][0]:
                # Kept among the run's lines (not a step of the wait): which rank holds rank 0 up.
                progress(f"hosts[{nodes[0].name}] rank 0: {said[0]}")
            last["said"] = said
            return said[1]
        return look

    # --- a failed start ---------------------------------------------------------------------
    def fail(self, status: str, reason: str, culprit: Optional[int], started: Mapping[int, tuple[int, R.UnitState]],
             report: Optional[R.Report]) -> None:
        """The layout did not come up: the journal of the node that explains it (rank 0's
        otherwise), then every node's plan.on_failure, the new units down everywhere before
        anything that served before starts again; raises DeployError (RollbackFailed when
        nothing serves again)."""
        unit, secrets = self.unit, self.spec.secrets
        k = culprit or 0
        since = started.get(k, (0, None))[0]
        journal = probe.journal_tail(self.nodes[k].t, unit, since, 50, secrets) if since else "(not started)"
        for node, plan in zip(self.nodes, self.plans):
            for step in plan.on_failure:
                if step.action not in ("start", "restore-files"):
                    do_step(node.t, step, unit, check=False)  # undoing: each step is tried, whatever the one before did
        restored = {i: restore(node.t) for i, (node, plan) in enumerate(zip(self.nodes, self.plans))
                    if any(s.action == "restore-files" for s in plan.on_failure)}
        back = {i: next((s.units[0] for s in plan.on_failure if s.action == "start"), None) for i, plan in enumerate(self.plans)}
        judged = self._roll_back(back)
        if self.multi:
            message, failed = self._message_all(status, reason, k, back, judged, restored, journal)
        else:
            message, failed = self._message_one(status, reason, back[0], judged.get(0), restored.get(0, []), journal)
        message = ssh.redact(message, secrets)
        message += ledger_record.record(self.spec, self.nodes[k], status, journal, served_again=not failed)  # the team's memory
        if failed:
            # Nothing serves: the service records it (its outputs say so) and FailedSwitch fails the run.
            report = report or R.Report(status=status, unit=unit, url="", checked_at=probe.now_iso())
            summary = ssh.redact(failed.splitlines()[0], secrets)
            # The units as they are now (stopped), read as a switch's last step reads them.
            now = self.read_together() if self.multi else service_state.outputs(self.spec, probe.run_steps(self.nodes[0].t, unit, []))
            outs = {"previous": self.plans[0].previous,
                    "readinessReport": {**report.as_dict(), "status": status, "reason": reason, "rollback": summary}, **now}
            raise RollbackFailed(message, outs)
        raise DeployError(message)

    def _roll_back(self, back: Mapping[int, Optional[str]]) -> dict[int, tuple[bool, str]]:
        """What served before, started again on every node (a previous multi-node layout needs all
        its ranks; rank 0 last), then each judged: whether it serves again, and what to say."""
        judged: dict[int, tuple[bool, str]] = {}
        begun: dict[int, tuple[int, R.UnitState]] = {}
        for i in sorted(back, key=lambda i: i == 0):
            previous = back[i]
            if previous:
                try:
                    begun[i] = probe.start(self.nodes[i].t, previous, "start")
                except ssh.RemoteError as exc:
                    judged[i] = (False, f"{previous} could not be started again ({exc}).")
        for i, previous in back.items():
            if previous and i in begun:
                judged[i] = self._judge_rollback(self.nodes[i], previous, *begun[i])
        return judged

    def _judge_rollback(self, node: Node, previous: str, since: int, baseline: R.UnitState) -> tuple[bool, str]:
        """A unit started again: a rank >= 1 of a multi-node layout by its unit (its HTTP answer
        proves nothing), any other by a real generation."""
        bind, port, rank = serves_at(node.t, previous, self.spec)
        if rank:
            import time
            time.sleep(self.spec.readiness.settle_seconds + 2)
            problem = R.rank_problem(baseline, probe.unit_state(node.t, previous))
            return (problem is None, f"{previous} (rank {rank}) runs again." if problem is None else
                    f"{previous} (rank {rank}) did not stay up: {problem}.")
        where = "rollback " if self.multi else node.spec.who
        report = probe.wait_ready(node.t, previous, bind=bind, port=port, declared={}, deadlines=self.spec.readiness,
                                  since=since, baseline=baseline, progress=lambda m: progress(where + m, ephemeral=True))
        if report.status == R.READY:
            return True, f"restarted {previous}, the strategy that was serving before; it generates again."
        if self.multi:
            return False, f"{previous} did not come back ({report.status}: {report.reason})."
        journal = probe.journal_tail(node.t, previous, since, 20, self.spec.secrets)
        return False, (f"{previous}, the strategy that was serving before, did not come back ({report.status}: {report.reason})."
                       f"\nLast lines of journalctl -u {previous}:\n{journal}")

    def _message_one(self, status: str, reason: str, previous: Optional[str], judged: Optional[tuple[bool, str]],
                     restored: list[str], journal: str) -> tuple[str, str]:
        """One host's failure message, and the line saying nothing serves ("" when something does)."""
        unit, label = self.unit, self.nodes[0].t.label
        if previous is None:
            rollback, failed = f"No strategy was serving before; {unit} was stopped.", ""
        elif judged is not None and judged[0]:
            rollback, failed = f"Rolled back: {judged[1]}", ""
        else:
            text = judged[1] if judged else f"{previous} could not be started again."
            rollback = failed = f"{ROLLBACK_FAILED} nothing serves on {label}: {text}"
        if restored:
            rollback += "\nPut back as they were: " + ", ".join(restored) + "."
        return f"readiness: {status}: {reason}\n{rollback}\nLast lines of journalctl -u {unit}:\n{journal}", failed

    def _message_all(self, status: str, reason: str, k: int, back: Mapping[int, Optional[str]],
                     judged: Mapping[int, tuple[bool, str]], restored: Mapping[int, list[str]], journal: str) -> tuple[str, str]:
        """A multi-node layout's failure message, named by the rank that explains it (not by rank
        0's entry, which the run would put first), a line a node; and the first line that says a
        rollback failed ("" when every node serves again)."""
        lines: list[str] = []
        failed: list[str] = []
        for i, previous in back.items():
            name = self.nodes[i].name
            if previous is None:
                lines.append(f"{name}: no strategy was serving before; {self.unit} was stopped.")
            elif i in judged:
                served, text = judged[i]
                lines.append(f"{name}: rolled back: {text}" if served else f"{name}: {ROLLBACK_FAILED} {text}")
                if not served:
                    failed.append(lines[-1])
            if restored.get(i):
                lines.append(f"{name}: put back as they were: {', '.join(restored[i])}.")
        node = self.nodes[k]
        message = (f"hosts[{node.name}]: readiness: {status}: {reason}\n" + "\n".join(lines)
                   + f"\nLast lines of journalctl -u {self.unit} on {node.where}:\n{journal}")
        return message, (failed[0] if failed else "")

    # --- reading the nodes back ---------------------------------------------------------------
    def read_together(self) -> dict[str, Any]:
        """The ranks as one service (one read a rank): active and enabled when every rank is, and
        what they run."""
        live = together(lives(self.nodes))
        if not self.spec.active:
            live = {**live, "active": False, "runningServer": R.NOT_RUNNING}
        return live


def lives(nodes: list[Node]) -> list[tuple[Node, Optional[dict]]]:
    """Each node and its unit now (service_state.read_live; None: the unit is not there)."""
    return [(node, service_state.read_live(node.t, node.spec, node.props)) for node in nodes]


def together(read: list[tuple[Node, Optional[dict]]]) -> dict[str, Any]:
    """The ranks as one service: active and enabled when every rank is, and what they run."""
    out: dict[str, Any] = {"active": all(v and v["active"] for _, v in read), "enabled": all(v and v["enabled"] for _, v in read),
                           "runningServer": ranks_running(read)}
    for key in ("dropIns", "othersEnabled", "foreignDropIns", "effectiveEnvironment"):
        said = [f"{node.name}:{item}" for node, v in read if v for item in v.get(key, [])]
        if said:
            out[key] = said
    return out


def ranks_running(read: list[tuple[Node, Optional[dict]]]) -> str:
    """What every rank runs: as declared, or the first rank that does not and why."""
    for k, (node, live) in enumerate(read):
        running = live["runningServer"] if live else R.NOT_RUNNING
        if running != R.AS_DECLARED:
            return running if k == 0 else f"rank {k} on {node.name}: {running}"
    return R.AS_DECLARED


def switch_service(spec: ServiceSpec, restart: bool) -> dict[str, Any]:
    """The switch of `spec` on its nodes: its outputs (see Switch.run)."""
    return Switch(spec, nodes_of(spec), restart).run()
