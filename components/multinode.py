"""MultiNodeServing: a layout over several machines (issue 17). Per node its environment file
and its unit file (each a resource with a real read, so a hand edit on one node is drift there
and is repaired there only); one service resource that switches every node as one; before any of
them, the check that every node reaches rank 0."""
from __future__ import annotations

import hashlib
import shlex
from typing import Optional

import pulumi

from .core import readiness as R
from .core.plan import ServingPlan, declared_layout
from .core.specs import ReadinessDeadlines, RankSpec, RendezvousNode, RendezvousSpec, ServiceSpec, file_spec
from .core.unit import UNIT_DIR
from .gpu_host import GpuHost
from .resources import MultiNodeService, RemoteFile, RendezvousCheck, wait_in_children


class MultiNodeServing(pulumi.ComponentResource):
    readiness_report: pulumi.Output

    def __init__(self, name: str, nodes: list[tuple[str, ServingPlan, GpuHost]], secret_environment: Optional[pulumi.Output],
                 opts: Optional[pulumi.ResourceOptions] = None):
        opts, installs = wait_in_children(opts)
        super().__init__("gpu-serving:index:MultiNodeServing", name, {}, opts)
        child = pulumi.ResourceOptions(parent=self)
        first = nodes[0][1]
        s = first.settings
        self.unit_name = first.unit.name
        rank0 = nodes[0][2]
        self.rendezvous = RendezvousCheck(f"{name}-rendezvous", RendezvousSpec(
            connection=rank0.connection,
            nodes=tuple(RendezvousNode(n, p.settings.node_place.rank, h.connection) for n, p, h in nodes),
            address=s.node_place.rank0_address,
            ssh_port=rank0.connection.apply(lambda c: int(c.get("port", 22))),
            port=s.node_place.port,
            # A changed unit on any node checks again before it is written.
            units={n: hashlib.sha256(p.unit.text.encode()).hexdigest()[:16] for n, p, _ in nodes},
        ).to_props(), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[*installs, *(h for _, _, h in nodes)])))
        after_check = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.rendezvous]))
        files = []
        for n, plan, host in nodes:
            files.append(RemoteFile(f"{n}-environment-file", file_spec(
                host.connection, plan.unit.environment_path, plan.environment_text, "0600", n,
                secretEnvironment=secret_environment if secret_environment is not None else {}, retainOnDelete=True,
            ).to_props(), pulumi.ResourceOptions.merge(after_check, pulumi.ResourceOptions(retain_on_delete=True))))
            files.append(RemoteFile(f"{n}-unit-file", file_spec(
                host.connection, f"{UNIT_DIR}/{plan.unit.name}", plan.unit.text, "0644", n, reloadSystemd=True, showWhenNew=True,
            ).to_props(), after_check))
        secret_hash = (secret_environment or pulumi.Output.from_input({})).apply(R.secret_hash)
        self.service = MultiNodeService(f"{name}-service", ServiceSpec(
            connection=rank0.connection,
            unit=first.unit.name,
            # Every rank's command and environment: a change on any node restarts them all.
            config_hash=secret_hash.apply(lambda sh: R.running_config_hash(
                [a for _, p, _ in nodes for a in p.unit.exec_start], {f"{n}:{k}": v for n, p, _ in nodes
                                                                      for k, v in p.environment.items()}, sh)),
            exec_start=shlex.join(str(a) for a in first.unit.exec_start),
            environment=first.environment,
            ranks=tuple(RankSpec(n, p.settings.node_place.rank, h.connection, shlex.join(str(a) for a in p.unit.exec_start), p.environment)
                        for n, p, h in nodes),
            bind=s.serving.host,
            port=s.serving.port,
            declared=declared_layout(first),
            readiness=ReadinessDeadlines.from_settings(s.readiness),
            secret_environment=secret_environment if secret_environment is not None else {},
            stack=s.stack,
            host_entry=nodes[0][0],
        ).to_props(), pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=files)))
        self.active = self.service.active
        self.readiness_report = self.service.readinessReport
        self.register_outputs({"unit": self.unit_name, "active": self.active})
