"""`benchmark.onDeploy: true`: SGLang's serving benchmark as the last step of `pulumi up`, after
the readiness check, on the stack's (first) host; its summary is the stack output `benchmark`.
The run itself is `components bench`'s (components/remote/bench.py), given as props here."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pulumi

from .core import bench as B
from .core.plan import ServingPlan, declared_layout
from .gpu_host import GpuHost
from .readiness_check import ReadinessCheck
from .resources import Benchmark
from .serving_unit import ServingUnit


def benchmark_after_ready(name: str, plan: ServingPlan, host: GpuHost, unit: ServingUnit, ready: ReadinessCheck,
                          project_dir: Path) -> Benchmark:
    """The Benchmark resource of one host (`name`: the fleet entry or "")."""
    s = plan.settings
    prefix = f"{name}-" if name else ""
    r = ready.resource
    return Benchmark(f"{prefix}benchmark", {
        **B.host_spec(stack=s.stack, settings=s, plan=plan, entry=name, declared=declared_layout(plan)),
        "connection": host.connection,
        # A new measurement when the unit's files change (a switch of layout or flags) ...
        "unitConfig": hashlib.sha256((plan.unit.text + "\0" + plan.environment_text).encode()).hexdigest(),
        # ... or when this program started the server again (a switch back to this stack): the
        # service's readiness check of that start. An `up` that changes nothing keeps both.
        "started": unit.readiness_report.apply(lambda report: str((report or {}).get("checked_at") or "")),
        # The verdict it runs after: only `ready` in the declared layout is benchmarked.
        "readinessStatus": r.status,
        "mismatches": r.mismatches,
        "projectDir": str(project_dir),
        "resultsDir": B.RESULTS_DIR,
        **({"hostEntry": name} if name else {}),
    }, pulumi.ResourceOptions(depends_on=[ready]))
