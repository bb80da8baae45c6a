"""`readiness.fitness` before anything stops: the switch executor calls `before_stop` once every
node is planned and before any stop step runs. Each node that will start reads its fitness now
against its baseline (core/fitness_read.py: one small read; a host never benchmarked pays one
`cat`); with `refuse`, a drifted node refuses the whole switch, and what serves keeps serving
(same MainPID); with `warn` (the default) the switch goes ahead and says what changed.

Unknown is never refused: a host without a baseline, or whose GPUs could not be read, starts (the
read's problem is said as a warning)."""
from __future__ import annotations

from typing import Any, Sequence

from ..core import fitness_read, reads
from ..core.specs import ServiceSpec
from ..core.switch import SwitchPlan
from . import ssh
from .common import host_name, progress




def before_stop(spec: ServiceSpec, nodes: Sequence[Any], plans: Sequence[SwitchPlan]) -> None:
    """Raise ssh.RemoteError (the refusal, "Nothing was stopped") when `readiness.fitness` is
    refuse and a node that starts drifted from its baseline; say the warning otherwise. `nodes`:
    the switch's (switch_executor.Node: t, spec, props), `plans` each node's."""
    policy = spec.readiness.fitness
    refusals = []
    for node, plan in zip(nodes, plans):
        if plan.starts is None:
            continue  # nothing starts here: nothing to decide
        try:
            read = fitness_read.parse(ssh.fetch(node.t, reads.fitness()).stdout)
        except ssh.RemoteError as exc:
            progress(f"{node.spec.who}warning: the GPUs' fitness was not read before the start ({exc}); starting")
            continue
        for problem in read.problems:
            progress(f"{node.spec.who}warning: fitness: {problem}")
        refusal, warning = read.verdict(policy, host_name(node.props, node.t), spec.stack or spec.unit)
        if refusal:
            refusals.append(refusal)
        elif warning:
            progress(f"{node.spec.who}warning: {warning}")
    if refusals:
        raise ssh.RemoteError("\n".join(refusals))
