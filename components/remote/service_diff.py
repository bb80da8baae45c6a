"""A serving unit's diff: what the engine must change for the Service resource (one host) and the
MultiNodeService (every rank), from the stored state and the declaration. Its fixed key list is
why a new input outside it never restarts a serving model by itself."""
from __future__ import annotations

from pulumi.dynamic import DiffResult

from ..core import readiness as R
from ..core.specs import ServiceSpec, argv
from .common import changed as _changed
from .common import moved as _moved
from .common import progress as _progress
from .service_state import READ_ONLY_WHEN_SO


def service_diff(olds: dict, news: dict, more: tuple[str, ...] = ()) -> DiffResult:
    """A serving unit's diff (one host, or a multi-node layout with `more` = ("ranks",)): what the
    engine must change, from the stored state (its last read's outputs among them) and the
    declaration."""
    active = ServiceSpec.from_props(news).active
    # A state written before the process was compared has no runningServer: as declared.
    olds = {**olds, "runningServer": olds.get("runningServer", R.AS_DECLARED)}
    news = {**news, "active": active, "enabled": news.get("enabled", True),
            "runningServer": news.get("runningServer", R.AS_DECLARED) if active else olds["runningServer"]}
    # execStart as an argv: a state written before it was one line holds the same list.
    olds, news = {**olds, "execStart": argv(olds.get("execStart"))}, {**news, "execStart": argv(news.get("execStart"))}
    changed = _changed(olds, news, ["unit", "configHash", "declared", "port", "bind", "active", "enabled",
                                    "connection", "runningServer", "execStart", "environment", *READ_ONLY_WHEN_SO, *more])
    if olds.get("readinessReport") is None:
        changed.append("readinessReport")  # a state left empty by an earlier version: record it once
    if olds.get("switchFailure"):
        changed.append("switchFailure")  # the last switch left nothing serving: try it again
    place = ServiceSpec.from_props(news).router
    changed += ["router"] if place is not None and place.rejoin else []  # put back (roll.py)
    moved = _moved(olds, news)
    if moved:
        # Said at the diff, so the preview says it before anything happens.
        _progress(f"{ServiceSpec.from_props(news).who}{news.get('unit')} moves from {olds['connection'].get('host')} to "
                  f"{news['connection'].get('host')}: it starts there and is checked, then it is stopped "
                  "and its unit file removed where it served (CUDA, the venv and the environment file stay)")
    replaces = ["unit"] if olds.get("unit") != news.get("unit") else []
    return DiffResult(changes=bool(changed), replaces=replaces + moved, stables=[])
