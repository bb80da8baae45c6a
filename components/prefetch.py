"""Which reads a refresh of one host will make after its host facts, known before it starts.

The program passes `refresh_reads(plan)` to the host-facts resource (its `prefetch`
prop): the provider process starts these reads at once, on the connection it opens for the
host facts, instead of the engine waiting for them one dependent resource after the other
(components/remote/readcache.py says what is served and when it is not).

Each entry is a spec of components/remote/reads.py, ``{"kind": ..., "props": {...}}``: the kind
of the resource and the very props the program gives that resource, which its provider turns
into the read request with the same builder (`reads.BUILDERS`), so the two cannot disagree
(tests/test_prefetch.py checks it against what the program registers). Plain data: paths, unit
names, a port; no connection, no secret.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .remote import reads

if TYPE_CHECKING:
    from .plan import ServingPlan


def refresh_reads(plan: ServingPlan) -> list[dict]:
    """The reads of the CUDA toolkit, the venv, the environment and unit files, the service and
    readiness, in the order a refresh reaches them, for the host `plan.settings` describes."""
    from .serving_unit import UNIT_DIR  # the unit file's path is composed there
    s = plan.settings
    unit = plan.unit.name
    return [
        reads.spec("cuda-toolkit", {"home": s.cuda.home, "aptPackage": s.cuda.apt_package}),
        reads.spec("venv-packages", {"path": s.venv.path}),
        reads.spec("file", {"path": plan.unit.environment_path}),
        reads.spec("file", {"path": f"{UNIT_DIR}/{unit}"}),
        reads.spec("service", {"unit": unit}),
        reads.spec("readiness", {"unit": unit, "bind": s.serving.host, "port": s.serving.port}),
    ]
