"""The switch to or from a prefill/decode stack, as a plan: what stops, in which order, what
serves meanwhile and how long nothing does. Pure (the checked stacks in, the plan out).

The two layouts cannot both hold the same GPUs: a host's old server stops before its new one
loads. Behind the router a fleet keeps serving while some of its hosts switch; a prefill/decode
pair serves only while it has a prefill and a decode server and the router is in PD mode. The
plan switches hosts one at a time while the old stack still serves, then the hosts whose switch
ends it together (nothing serves until the new stack can: the outage), then the rest while the
new one serves. The router changes mode (its unit's ExecStart, a restart) when the new stack
first can serve. How long a host's start takes comes from its recorded starts (switch_cost
forecasts, given by the caller); `plan` has none and says so.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import router as R
from .pd_plan import server_url
from .switch_cost import Forecast, duration

if TYPE_CHECKING:
    from .plan import CheckedStack, ServingPlan


@dataclass(frozen=True)
class Side:
    """One stack as the switch sees it: per host, its unit and what it serves as."""

    stack: str
    units: dict[str, ServingPlan]  # host -> its plan
    roles: dict[str, Optional[str]]  # host -> "prefill" | "decode" | None
    router_unit: Optional[str]
    describe: dict[str, str]       # host -> "tp8x2 (tp 8, ...)" or "pd1p1d prefill (tp 8, ...)"

    def serves(self, gone: set[str]) -> bool:
        """Whether this stack still serves once the hosts in `gone` left it."""
        left = [h for h in self.units if h not in gone]
        if any(self.roles.values()):
            return any(self.roles[h] == "prefill" for h in left) and any(self.roles[h] == "decode" for h in left)
        if self.router_unit is None:
            return not gone  # without a router a fleet switches all at once
        return bool(left)

    def ready(self, done: set[str]) -> bool:
        """Whether this (new) stack can serve with only the hosts in `done` switched to it."""
        return self.serves({h for h in self.units if h not in done})


def side(checked: CheckedStack, addresses: Optional[dict[str, str]] = None) -> Side:
    """A checked stack (plan.CheckedStack) as a Side."""
    s = checked.settings
    units = {name or s.host.target: plan for name, plan in checked.plans}
    roles = {name or s.host.target: (plan.settings.role.role if plan.settings.role else None) for name, plan in checked.plans}
    if checked.pd is not None:
        router_unit = checked.pd.router_unit
    elif s.router is not None:
        router_unit = R.render_unit(s, [server_url(p.settings, addresses) for _, p in checked.plans])
    else:
        router_unit = None
    describe = {h: f"{s.stack}{' ' + str(roles[h]) if roles[h] else ''} ({p.layout.describe()})" for h, p in units.items()}
    return Side(s.stack, units, roles, router_unit, describe)


@dataclass(frozen=True)
class HostSwitch:
    host: str
    before: Optional[str]
    after: Optional[str]
    stops: Optional[str]
    starts: Optional[str]
    forecast: Optional[Forecast]
    unit_diff: list[str]


@dataclass(frozen=True)
class SwitchPlan:
    source: str
    target: str
    hosts: list[HostSwitch]
    steps: list[str]
    outage_hosts: list[str]            # the hosts whose switch nobody serves through
    outage_seconds: Optional[float]    # their slowest start; None: not known
    outage: str
    router_diff: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.source, "to": self.target, "steps": self.steps, "outage": self.outage,
                "outage_hosts": self.outage_hosts, "outage_seconds": self.outage_seconds,
                "hosts": [{"host": h.host, "before": h.before, "after": h.after, "stops": h.stops, "starts": h.starts,
                           "forecast": h.forecast.text if h.forecast else None, "unit_diff": h.unit_diff}
                          for h in self.hosts],
                "router_diff": self.router_diff}


def _diff(a: str, b: str, left: str, right: str) -> list[str]:
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), left, right, lineterm="", n=1))


def plan(before: Side, after: Side, forecasts: Optional[dict[str, Any]] = None) -> SwitchPlan:
    """`before` -> `after` over the hosts of `after` (a host of `before` only is left alone).
    `forecasts`: host -> switch_cost.Forecast of the host's start as `after` (none: no figures)."""
    forecasts = forecasts or {}
    order = [h for h in after.units if after.roles.get(h) == "prefill"] + \
        [h for h in after.units if after.roles.get(h) != "prefill"]
    hosts = []
    for h in order:
        old, new = before.units.get(h), after.units[h]
        hosts.append(HostSwitch(h, before.describe.get(h), after.describe[h], old.unit.name if old else None,
                                new.unit.name, forecasts.get(h),
                                _diff(old.unit.text if old else "", new.unit.text, f"{h}: {before.stack}", f"{h}: {after.stack}")))
    gone: set[str] = set()
    steps: list[str] = []
    fmt: Callable[..., Any] = lambda h: _one(h, before, after, forecasts)  # noqa: E731 - one line a host
    # 1. While the old stack serves: the hosts it can spare, one at a time.
    for h in order:
        if before.serves(gone | {h}):
            gone.add(h)
            left = [x for x in before.units if x not in gone]
            steps.append(f"{fmt(h)}; {before.stack} serves meanwhile on {', '.join(left)} "
                         f"({len(left)} of {len(before.units)} hosts)")
    # 2. The hosts whose switch the old stack cannot serve through, together, until the new one can.
    group = []
    for h in order:
        if h in gone:
            continue
        if before.serves(gone) and after.ready(gone):
            break
        group.append(h)
        gone.add(h)
        if after.ready(gone):
            break
    known = [forecasts[h].seconds for h in group if h in forecasts and forecasts[h].seconds is not None]
    seconds = max(known) if group and len(known) == len(group) else None
    router_step = _router_step(before, after)
    if group:
        how_long = (f"~{duration(seconds)} (the slowest start of {', '.join(group)})" if seconds is not None else
                    f"as long as {' and '.join(f'{h} takes to start {after.describe[h]}' for h in group)} "
                    "(no start of it recorded there: no figure)")
        outage = (f"nothing serves from the stop of {before.stack} on {', '.join(group)} until {after.stack} is ready"
                  f"{' and ' + router_step if router_step else ''}: {how_long}; the two layouts cannot both hold "
                  "the same GPUs")
        steps.append(f"{' and '.join(fmt(h) for h in group)}{' together' if len(group) > 1 else ''}: NOTHING SERVES"
                     + (f"; then {router_step}" if router_step else ""))
    else:
        outage = f"something serves throughout: {after.stack} can serve before {before.stack} stops"
        if router_step:
            steps.append(router_step)
    # 3. The rest, one at a time, while the new stack serves.
    for h in order:
        if h not in gone:
            gone.add(h)
            serving = [x for x in order if x in gone and x != h]
            steps.append(f"{fmt(h)}; {after.stack} serves meanwhile on {', '.join(serving)}")
    for h in before.units:
        if h not in after.units:
            steps.append(f"{h} is not a host of {after.stack}: its {before.describe[h]} is left as it is")
    router_diff = _diff(before.router_unit or "", after.router_unit or "", f"router: {before.stack}", f"router: {after.stack}") \
        if before.router_unit != after.router_unit else []
    return SwitchPlan(before.stack, after.stack, hosts, steps, group, seconds, outage, router_diff)


def _one(h: str, before: Side, after: Side, forecasts: dict[str, Any]) -> str:
    old = before.describe.get(h)
    out = "" if before.router_unit is None or old is None else " out of the router,"
    f = forecasts.get(h)
    took = f" (~{duration(f.seconds)} to start)" if f is not None and f.seconds is not None else ""
    return f"{h}:{out} {old or 'nothing'} stops, {after.describe[h]} starts{took}"


def _router_step(before: Side, after: Side) -> str:
    if after.router_unit is None or before.router_unit == after.router_unit:
        return ""
    mode = "PD mode" if any(after.roles.values()) else "regular mode"
    return f"the router restarts in {mode} routing to {after.stack}'s servers"


def render(p: SwitchPlan) -> str:
    lines = [f"switch {p.source} -> {p.target}:", f"  {p.outage}"]
    lines += [f"  {i}. {s}" for i, s in enumerate(p.steps, 1)]
    for h in p.hosts:
        lines.append(f"  {h.host}: {h.stops or 'nothing'} stops, {h.starts} starts"
                     + (f"; {h.forecast.text}" if h.forecast else ""))
        lines += h.unit_diff or [f"  {h.host}: unit identical"]
    lines += p.router_diff or ["  router: unit identical" if p.hosts else ""]
    return "\n".join(lines)
