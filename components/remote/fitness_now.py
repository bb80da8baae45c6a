"""The hosts' fitness now, for `compare` and `advise`: each benchmark run recorded the machine's
fitness (meta.json); a run whose host reads otherwise now measured another machine, and is marked
"not comparable: <what changed>" (core/fitness_read.py `mark`). One small read a host
(reads.fitness), connected as `status` connects; a host that cannot be read is said, never a
failure of the command (its runs are then neither comparable nor not: unknown).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ..core import fitness_read, reads
from ..core.bench import host_label
from ..core.errors import ConfigError
from ..core.fitness import HostFitness
from ..core.plan import check_stack
from ..core.stack_config import from_files
from . import ssh
from . import status as remote_status


def read_hosts(project_dir: Path, stacks: Iterable[str], wanted: set[str]) -> tuple[dict[str, Optional[HostFitness]], list[str]]:
    """({host as a run records it: its fitness now}, what could not be read and why) for the hosts
    in `wanted` that a stack in `stacks` deploys to (a benchmark measures a stack's first host)."""
    found: dict[str, Optional[HostFitness]] = {}
    problems: list[str] = []
    for stack in stacks:
        try:
            checked = check_stack(stack, from_files(project_dir, stack), project_dir)
        except (ConfigError, OSError):
            continue  # a stack that cannot be planned names no host: its runs stay unknown
        (entry, _), (_, settings) = checked.plans[0], checked.settings.per_host()[0]
        label = host_label(settings, entry)
        if label not in wanted or label in found:
            continue
        try:
            t = ssh.Target.from_props({"connection": remote_status.connection(settings, stack, project_dir, checked)})
            read = fitness_read.parse(ssh.fetch(t, reads.fitness(always=True)).stdout)
        except (remote_status.StatusError, ssh.RemoteError, OSError) as exc:
            found[label] = None
            problems.append(f"fitness of {label} not read now ({exc}): its figures are not checked against the machine")
            continue
        found[label] = read.now
        problems += [f"fitness of {label}: {p}" for p in read.problems]
    for label in sorted(wanted - set(found)):
        problems.append(f"fitness of {label} not read now: no stack compared here deploys to it")
    return found, problems
