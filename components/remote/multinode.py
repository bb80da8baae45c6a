"""Multi-node layouts (issue 17): one SGLang server over several machines, one unit a node.

Two providers:

- `RendezvousCheckProvider`: before any unit file of the layout is written, every node >= 1
  checks over SSH that it reaches rank 0's address (a route to it, and a TCP connection to rank
  0's sshd: the rendezvous port itself is not listening yet). A node that cannot is named and
  nothing changes on any node.
- `MultiNodeServiceProvider`: the switch of all the nodes as one. Every node is locked, planned
  (switch.py, as for one host) and refused before anything stops; then the other strategies stop
  on every node, the ranks start together (ranks >= 1, then rank 0, without waiting between them:
  rank 0 waits for the others in SGLang's rendezvous), and the verdict is rank 0's (generation and
  the layout of the whole world from /server_info) plus each other rank's unit and journal, never
  its HTTP answer (readiness.judge_ranks). A failure undoes the switch on every node: the new
  units stop, the replaced files go back, and what served before starts again on every node.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Optional

from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from ..core import readiness as R
from ..core import switch
from . import identity, probe, ssh
from .common import changed as _changed
from .common import progress as _progress
from .common import require_target as _require_target
from .common import stop_and_disable as _stop_and_disable
from .providers import (ROLLBACK_FAILED, DeployError, RollbackFailed, ServiceProvider, _secrets, _take_replaced,
                        _without_last_reading)

# How often a multi-node switch looks at the ranks >= 1 while rank 0 loads (one command per rank):
# soon enough to name a rank that has not joined long before rank 0's deadline.
RANK_LOOK_SECONDS = 5.0

# $1 rank 0's address, $2 a port it listens on (its sshd). Exit 3: no route; 4: no TCP connection.
REACH_SCRIPT = (
    "if command -v ip >/dev/null 2>&1; then r=$(ip route get \"$1\" 2>&1) || { echo \"no route: $r\"; exit 3; }; fi\n"
    "timeout 5 bash -c 'exec 3<>/dev/tcp/$0/$1' \"$1\" \"$2\" 2>/dev/null"
    " || { echo \"no TCP connection to $1 port $2 within 5 s\"; exit 4; }\n"
    "echo reachable\n"
)


def _node_label(node: dict) -> str:
    # Numbers come back from the engine as floats (1.0): written as the integers they are.
    return f"{node['name']} (rank {int(node['rank'])})"


@identity.guarded
class RendezvousCheckProvider(ResourceProvider):
    """props: connection (rank 0's), nodes [{name, rank, connection}], address (rank 0's as the
    others reach it), sshPort (rank 0's sshd), port (the rendezvous port), units (the units'
    hashes: a changed layout checks again)."""

    def _check_all(self, props: dict) -> None:
        problems = []
        for node in props["nodes"]:
            if int(node["rank"]) == 0:
                continue
            t = _require_target({**props, "connection": node["connection"]})
            out = ssh.run(t, ["sh", "-c", REACH_SCRIPT, "sh", props["address"], str(int(props["sshPort"]))],
                          purpose=f"checking that {node['name']} reaches rank 0", timeout=30, check=False, read=True)
            if out.rc != 0:
                problems.append(f"{_node_label(node)} cannot reach rank 0 ({props['nodes'][0]['name']}) at {props['address']}: "
                                f"{(out.stdout or out.stderr).strip()[-300:]}")
        if problems:
            raise DeployError("multi-node rendezvous: " + "; ".join(problems) + f". The ranks meet at {props['address']}:"
                              f"{int(props['port'])} (strategy.distInitPort); nothing was changed on any node.")

    def create(self, props):
        self._check_all(props)
        return CreateResult(id_=f"{props['address']}:{props['port']}:rendezvous", outs=props)

    def update(self, id, olds, news):
        self._check_all(news)
        return UpdateResult(outs=news)

    def read(self, id, props):
        return ReadResult(id_=id, outs=props, inputs=props)

    def diff(self, id, olds, news):
        changed = _changed(olds, news, ["nodes", "address", "sshPort", "port", "units"])
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def delete(self, id, props):
        pass


@identity.guarded
class MultiNodeServiceProvider(ServiceProvider):
    """The layout's units on every node, switched as one. props: what ServiceProvider takes for
    rank 0 (connection, unit, configHash, execStart, environment, bind, port, declared, readiness,
    secretEnvironment, stack), plus ranks [{name, rank, connection, execStart, environment}] in
    rank order (rank 0 first)."""

    @staticmethod
    def _node(props: dict, rank: int) -> dict:
        """The props a one-host ServiceProvider would have for node `rank`."""
        r = props["ranks"][rank]
        return {**{k: v for k, v in props.items() if k != "ranks"}, "connection": r["connection"], "execStart": r["execStart"],
                "environment": r["environment"], "hostEntry": r["name"]}

    def _start(self, props: dict, restart: bool) -> dict:
        unit = props["unit"]
        nodes = [self._node(props, k) for k in range(len(props["ranks"]))]
        targets = [_require_target(p) for p in nodes]
        with contextlib.ExitStack() as stack:
            for t in targets:
                stack.enter_context(ssh.one_connection(t, f"the switch to {unit}"))
            locks = []
            try:
                # In rank order on every run: two switches never wait for each other's lock crosswise.
                for t, p in zip(targets, nodes):
                    locks.append(self._lock(t, p))
                return self._switch_all(targets, nodes, props, restart)
            finally:
                for lock in locks:
                    self._unlock(lock)

    def _switch_all(self, targets: list, nodes: list[dict], props: dict, restart: bool) -> dict:
        unit, port = props["unit"], int(props["port"])
        active, enabled = props.get("active", True), props.get("enabled", True)

        def plan_of(t, p, again: bool):
            units, holder = self._managed(t, unit, port)
            return switch.plan(unit, units, restart=again, active=active, enabled=enabled, port_holder=holder, port=port,
                               host=f"{p['hostEntry']} ({t.label})")
        plans = [plan_of(t, p, restart) for t, p in zip(targets, nodes)]
        refused = [p.refused for p in plans if p.refused]
        if refused:
            raise ssh.RemoteError("; ".join(refused) + " (no node was changed)")
        if active and not restart and any(p.starts for p in plans):
            # A rank cannot join a world that already runs: one node's start restarts them all.
            plans = [plan_of(t, p, True) for t, p in zip(targets, nodes)]
        for p, plan in zip(nodes, plans):
            if plan.progress:
                _progress(f"hosts[{p['hostEntry']}] {unit}: {plan.progress}")
        # Everything before the starts, on every node (other strategies stop everywhere first).
        for t, plan in zip(targets, plans):
            for step in plan.steps:
                if step.action in ("start", "restart"):
                    break
                self._do(t, step, unit)
        report = None
        starting = [k for k, plan in enumerate(plans) if plan.starts]
        if starting:
            report = self._start_together(targets, nodes, plans, props)
        for t, plan in zip(targets, plans):
            after = False
            for step in plan.steps:
                if after:
                    self._do(t, step, unit)
                after = after or step.action in ("start", "restart")
        for t in targets:
            _take_replaced(t)  # kept: nothing to put back
        return self._outs_all(props, plans[0].previous, report)

    def _start_together(self, targets, nodes, plans, props) -> dict:
        """Start every rank within the rendezvous window (ranks >= 1 first, rank 0 last, none
        waiting for another), then judge: rank 0 by generation and layout, the others by unit
        and journal."""
        unit = props["unit"]
        started: dict[int, tuple[int, R.UnitState]] = {}
        try:
            for k in [*range(1, len(targets)), 0]:
                verb = plans[k].starts.action if plans[k].starts else "restart"
                started[k] = probe.start(targets[k], unit, verb)
        except ssh.RemoteError as exc:
            self._fail_all(targets, nodes, plans, props, R.CRASHED, str(exc), None, started, None)
        since0, base0 = started[0]
        report = probe.wait_ready(targets[0], unit, bind=props["bind"], port=int(props["port"]), declared=props["declared"],
                                  settings=props.get("readiness") or {}, since=since0, baseline=base0,
                                  progress=lambda m: _progress(f"hosts[{nodes[0]['hostEntry']}] rank 0: {m}", ephemeral=True),
                                  others=self._ranks_look(targets, nodes, unit, started))
        ranks = []
        for k in range(1, len(targets)):
            since, baseline = started[k]
            now = probe.unit_state(targets[k], unit)
            journal = probe.journal_tail(targets[k], unit, since, 400, _secrets(props))
            ranks.append(R.RankState(k, f"{nodes[k]['hostEntry']} ({targets[k].label})", R.rank_problem(baseline, now),
                                     R.JOINED_LINE in journal))
        status, reason, culprit = R.judge_ranks(report.status, report.reason, ranks)
        report = dataclasses.replace(report, status=status, reason=reason)
        if status != R.READY:
            self._fail_all(targets, nodes, plans, props, status, reason, culprit, started, report)
        return report.as_dict()

    @staticmethod
    def _ranks_look(targets, nodes, unit: str, started: dict):
        """What rank 0's wait asks at each poll (probe.wait_ready's `others`): which ranks >= 1 have
        not joined yet, looked at every RANK_LOOK_SECONDS at most and said when it changes; once all
        joined, no more looks. Returns why waiting longer is pointless (None: it is not)."""
        import time
        last: dict[str, object] = {"at": None, "said": ("", None)}

        def look() -> Optional[str]:
            now = time.monotonic()
            if last["said"][0] == "every rank joined" or (last["at"] is not None and now - last["at"] < RANK_LOOK_SECONDS):
                return last["said"][1]
            last["at"] = now
            waiting, gone = [], []
            for k in range(1, len(targets)):
                state, joined = probe.rank_look(targets[k], unit)
                if joined:
                    continue
                who = f"rank {k} on {nodes[k]['hostEntry']} ({targets[k].label})"
                problem = R.rank_problem(started[k][1], state)
                (gone if problem else waiting).append(f"{who}: {problem}" if problem else who)
            said = R.ranks_waited_for(waiting, gone)
            if said[0] != last["said"][0]:
                # Kept among the run's lines (not a step of the wait): which rank holds rank 0 up.
                _progress(f"hosts[{nodes[0]['hostEntry']}] rank 0: {said[0]}")
            last["said"] = said
            return said[1]
        return look

    def _fail_all(self, targets, nodes, plans, props, status: str, reason: str, culprit: Optional[int], started: dict,
                  report: Optional[R.Report]):
        """The layout did not come up: the journal of the rank that explains it (rank 0's
        otherwise), then every node's plan.on_failure, the new units down everywhere before
        anything that served before starts again."""
        unit = props["unit"]
        k = culprit or 0
        since = started.get(k, (0, None))[0]
        journal = probe.journal_tail(targets[k], unit, since, 50, _secrets(props)) if since else "(not started)"
        restored: dict[int, list[str]] = {}
        for t, plan in zip(targets, plans):
            for step in plan.on_failure:
                if step.action not in ("start", "restore-files"):
                    self._do(t, step, unit, check=False)
        for i, (t, plan) in enumerate(zip(targets, plans)):
            if any(s.action == "restore-files" for s in plan.on_failure):
                restored[i] = self._restore(t)
        # What served before, started on every node first (a previous multi-node layout needs all
        # its ranks), then each judged.
        back = {i: next((s.units[0] for s in plan.on_failure if s.action == "start"), None) for i, plan in enumerate(plans)}
        lines: list[str] = []
        failed: list[str] = []  # the lines that say a rollback failed (nothing serves there)
        begun: dict[int, tuple] = {}
        for i in sorted(back, key=lambda i: i == 0):
            if back[i]:
                try:
                    begun[i] = probe.start(targets[i], back[i], "start")
                except ssh.RemoteError as exc:
                    failed.append(f"{nodes[i]['hostEntry']}: {ROLLBACK_FAILED} {back[i]} could not be started again ({exc}).")
                    lines.append(failed[-1])
        for i, previous in back.items():
            name = nodes[i]["hostEntry"]
            if previous is None:
                lines.append(f"{name}: no strategy was serving before; {unit} was stopped.")
            elif i in begun:
                served, text = self._judge_rollback(targets[i], props, previous, *begun[i])
                lines.append(f"{name}: {text}")
                if not served:
                    failed.append(lines[-1])
            if restored.get(i):
                lines.append(f"{name}: put back as they were: {', '.join(restored[i])}.")
        where = f"{nodes[k]['hostEntry']} ({targets[k].label})"
        # Named by the rank that explains it (not by rank 0's entry, which the run would put first).
        message = ssh.redact(f"hosts[{nodes[k]['hostEntry']}]: readiness: {status}: {reason}\n" + "\n".join(lines)
                             + f"\nLast lines of journalctl -u {unit} on {where}:\n{journal}", _secrets(props))
        if failed:
            # As on one host: nothing serves, so the service records it and FailedSwitch fails the run.
            report = report or R.Report(status=status, unit=unit, url="", checked_at=probe.now_iso())
            summary = ssh.redact(failed[0].splitlines()[0], _secrets(props))
            raise RollbackFailed(message, self._outs_all(props, plans[0].previous,
                                                         {**report.as_dict(), "status": status, "reason": reason, "rollback": summary}))
        raise DeployError(message)

    def _judge_rollback(self, t, props, previous: str, since: int, baseline: R.UnitState) -> tuple[bool, str]:
        """A unit started again: a rank >= 1 of a multi-node layout by its unit (its HTTP answer
        proves nothing), any other by a real generation. Whether it serves again, and what to say."""
        command = ssh.run(t, ["systemctl", "show", "-p", "ExecStart", "--value", "--", previous], purpose=f"reading {previous}'s command",
                          timeout=30, check=False, read=True).stdout
        rank = re.search(r"--node-rank ([0-9]+)", command)
        if rank and rank.group(1) != "0":
            import time
            time.sleep(float((props.get("readiness") or {}).get("settleSeconds", 1)) + 2)
            problem = R.rank_problem(baseline, probe.unit_state(t, previous))
            return (problem is None, f"rolled back: {previous} (rank {rank.group(1)}) runs again." if problem is None else
                    f"{ROLLBACK_FAILED} {previous} (rank {rank.group(1)}) did not stay up: {problem}.")
        bind, port = self._address_of(t, previous, props)
        report = probe.wait_ready(t, previous, bind=bind, port=port, declared={}, settings=props.get("readiness") or {},
                                  since=since, baseline=baseline, progress=lambda m: _progress(f"rollback {m}", ephemeral=True))
        if report.status == R.READY:
            return True, f"rolled back: restarted {previous}, the strategy that was serving before; it generates again."
        return False, f"{ROLLBACK_FAILED} {previous} did not come back ({report.status}: {report.reason})."

    def _outs_all(self, props, previous, report) -> dict:
        # One read per rank gives its state and what it runs (the single-host switch reads the
        # same with its last step).
        live = self._together(self._lives(props))
        if not props.get("active", True):
            live = {**live, "active": False, "runningServer": R.NOT_RUNNING}
        return {**props, "previous": previous, "readinessReport": report, **live}

    def check(self, olds, news):
        return CheckResult(news, [])

    @staticmethod
    def _id(props: dict) -> str:
        # Its own id: the same host and unit can be a single-host service of another stack.
        return f"{props['connection']['host']}:{props['unit']}:nodes"

    def _lives(self, props: dict) -> list[tuple[dict, Optional[dict]]]:
        """Each rank's node props and its `_read_live` answer (None: the unit is not there)."""
        return [(node, self._read_live(_require_target(node), node))
                for node in (self._node(props, k) for k in range(len(props["ranks"])))]

    @classmethod
    def _together(cls, lives: list[tuple[dict, Optional[dict]]]) -> dict:
        """The ranks as one service: active and enabled when every rank is, and what they run."""
        together = {"active": all(v and v["active"] for _, v in lives), "enabled": all(v and v["enabled"] for _, v in lives),
                    "runningServer": cls._ranks_running(lives)}
        for key in ("dropIns", "othersEnabled", "foreignDropIns", "effectiveEnvironment"):
            said = [f"{node['hostEntry']}:{item}" for node, v in lives if v for item in v.get(key, [])]
            if said:
                together[key] = said
        return together

    @staticmethod
    def _ranks_running(lives: list[tuple[dict, Optional[dict]]]) -> str:
        """What every rank runs: as declared, or the first rank that does not and why."""
        for k, (node, live) in enumerate(lives):
            running = live["runningServer"] if live else R.NOT_RUNNING
            if running != R.AS_DECLARED:
                return running if k == 0 else f"rank {k} on {node['hostEntry']}: {running}"
        return R.AS_DECLARED

    def _running_now(self, props: dict) -> str:
        return self._ranks_running(self._lives(props)) if props.get("active", True) else R.NOT_RUNNING

    def read(self, id, props):
        lives = self._lives(props)
        if all(live is None for _, live in lives):
            return ReadResult(id_=None, outs={})
        live = self._together(lives)
        props = _without_last_reading(props)  # the last reading's: this one says whether there are any
        inputs = {k: props[k] for k in props if k not in ("previous", "readinessReport", "switchFailure")}
        return ReadResult(id_=id, outs={**props, **live}, inputs={**inputs, **live})

    def diff(self, id, olds, news):
        result = super().diff(id, olds, news)
        ranks = _changed(olds, news, ["ranks"])
        return DiffResult(changes=result.changes or bool(ranks), replaces=result.replaces, stables=[])

    def delete(self, id, props):
        for k in range(len(props.get("ranks") or [])):
            node = self._node(props, k)
            t = _require_target(node, stored=True)
            _stop_and_disable(t, props["unit"])
