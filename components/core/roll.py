"""The rolling switch behind SGLang's router as a plan: from what each host and the router say
before the first batch, which hosts switch, in which order and how many at a time, or a refusal
that names the hosts and says why. Pure (state in, order out; cases in tests/data/roll/); the
program reads the state once per run (components/roll_check.py asks the provider process,
components/remote/fleet_read.py reads), orders the hosts' switches by this plan, and registers a
check that fails the run before anything changes when the plan refuses.

What the roll protects is capacity it does not change itself: a host already down, unhealthy or
out of the router serves nothing, so it counts against rollout.maxUnavailable like a host the roll
takes out; one that leaves the fleet in the same run leaves the router before the first batch, so
it counts too while the router still routes to it. Hosts out of service that this run switches (or
puts back in the router) go first and together: their switch costs no capacity. Then the hosts
that serve, `size` at a time, never the last one serving. A host the run cannot reach over SSH
stops the roll before it starts: it can be neither switched nor counted on (smg may keep routing
to a dead server for minutes: it did for 80 s in issue 36).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .readiness import compare_running
from .status import parse_serving

# A worker the router sends requests to now (smg: healthy and status "ready").
ROUTED = "routed"

# Each server's /health, asked from the router's machine (argv: the worker URLs), all at once with
# a short bound: a server the router lists may be dead without the router knowing yet. Prints one
# JSON object {url: HTTP status, 0 for no answer}. No proxy: the URLs are the fleet's own.
PROBE_SCRIPT = r"""
import json, sys, threading, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
out = {}
def ask(url):
    try:
        with opener.open(url.rstrip("/") + "/health", timeout=3) as r:
            out[url] = r.status
    except urllib.error.HTTPError as e:
        out[url] = e.code
    except Exception:
        out[url] = 0
threads = [threading.Thread(target=ask, args=(u,)) for u in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join(10)
print(json.dumps(out))
"""


def parse_probe(stdout: str) -> dict[str, bool]:
    """PROBE_SCRIPT's answer -> {url: its server answered /health with 200}."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except ValueError:
        return {}
    return {str(u): code == 200 for u, code in doc.items()} if isinstance(doc, dict) else {}


@dataclass(frozen=True)
class HostNow:
    """One declared host as read before the roll."""
    name: str
    url: str                   # its server, as the router knows it
    reachable: bool = True
    error: str = ""            # why it could not be read (one line)
    serving: str = ""          # the gpu-serving unit serving there now ("" for none)
    as_declared: bool = False  # the declared unit serves what is declared: nothing to switch there


@dataclass(frozen=True)
class RouterNow:
    """The router and the servers as seen from the router's machine before the roll."""
    answers: bool = False      # its admin API listed its workers
    error: str = ""            # why not (the router not running yet is no reason to stop)
    machine_error: str = ""    # its machine does not answer over SSH: the roll cannot run
    listed: dict[str, str] = field(default_factory=dict)   # worker URL -> ROUTED, or what smg says instead
    health: dict[str, bool] = field(default_factory=dict)  # worker URL -> its server answered /health

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "RouterNow":
        return cls(answers=bool(doc.get("answers")), error=str(doc.get("error") or ""),
                   machine_error=str(doc.get("machine_error") or ""), listed=dict(doc.get("listed") or {}),
                   health={str(k): bool(v) for k, v in (doc.get("health") or {}).items()})


def host_from_dict(doc: dict[str, Any]) -> HostNow:
    return HostNow(name=str(doc["name"]), url=str(doc["url"]), reachable=bool(doc.get("reachable", True)),
                   error=str(doc.get("error") or ""), serving=str(doc.get("serving") or ""),
                   as_declared=bool(doc.get("as_declared")))


def host_now(name: str, url: str, serving_text: Optional[str], *, unit: str, declared_argv: list[str],
             declared_environment: dict[str, str], secret_keys: list[str], error: str = "") -> HostNow:
    """A host from its answer to status.SERVING_SCRIPT (read with the environments), or from the
    error that kept it from answering (`serving_text` None). `as_declared`: the declared unit
    serves, and its process runs the declared command line and environment (secret values are
    not compared here: a changed secret restarts the unit all the same, in its place in the order)."""
    if serving_text is None:
        return HostNow(name, url, reachable=False, error=error or "no answer")
    host = parse_serving(serving_text)
    now = host.serving
    mine = next((u for u in now if u.name == unit), None)
    same = mine is not None and not compare_running(declared_argv, declared_environment, {k: True for k in secret_keys},
                                                    mine.argv, mine.environ, host.manager)
    return HostNow(name, url, serving=now[0].name if now else "", as_declared=same)


def router_now(workers: Optional[list[Any]], health: dict[str, bool], *, error: str = "", machine_error: str = "") -> RouterNow:
    """The router from GET /workers (router.parse_workers; None when it did not answer)."""
    if workers is None:
        return RouterNow(answers=False, error=error, machine_error=machine_error, health=health)
    listed = {}
    for w in workers:
        if w.healthy and w.status == "ready":
            listed[w.url] = ROUTED
        else:
            listed[w.url] = f"{w.status or 'unknown'}{'' if w.healthy else ' (unhealthy)'}"
    return RouterNow(answers=True, listed=listed, health=health)


@dataclass(frozen=True)
class RollPlan:
    """The order of a roll. `batches`: the hosts that switch (or go back in the router), batch
    after batch; `first`: those of the first batch that serve nothing through the router now;
    `rejoin`: hosts that serve as declared but are out of the router (put back, not restarted);
    `after`: hosts nothing is expected to change on, chained after the batches `size` at a time
    (so that a restart nobody foresaw still rolls); `unavailable`: name (or leaving URL) -> why it
    counts as out of service; `refused`: the roll must not start, and why."""
    batches: tuple[tuple[str, ...], ...]
    size: int
    first: tuple[str, ...] = ()
    rejoin: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    unavailable: dict[str, str] = field(default_factory=dict)
    refused: Optional[str] = None

    @property
    def chain(self) -> tuple[tuple[str, ...], ...]:
        """Every host in the order the program chains them: the batches, then the others."""
        step = max(1, self.size)
        return self.batches + tuple(tuple(self.after[i:i + step]) for i in range(0, len(self.after), step))

    def describe(self, target: str, router_url: str) -> str:
        if not self.batches:
            return f"every host already serves {target} behind the router {router_url}: nothing to roll"
        order = " -> ".join("[" + ", ".join(b) + "]" for b in self.batches)
        rolled = len(self.batches) > (1 if self.first else 0)
        parts = [f"rolling switch to {target} behind the router {router_url}"
                 + (f", {self.size} at a time" if rolled else "") + f": {order}"]
        if self.first:
            parts.append("first, together, the hosts out of service now (" +
                         "; ".join(f"{n}: {self.unavailable[n]}" for n in self.first) + ")")
        if self.rejoin:
            parts.append(f"put back in the router without a restart: {', '.join(self.rejoin)}")
        if self.after:
            parts.append(f"unchanged: {', '.join(self.after)}")
        return "; ".join(parts)


def _entry(name: str) -> str:
    return f"hosts[{name}]"


def out_of_service(h: HostNow, router: RouterNow) -> Optional[str]:
    """Why host `h` serves nothing through the router now (None: it does)."""
    if not h.reachable:
        return f"does not answer over SSH ({h.error})"
    if not h.serving:
        return "serves nothing"
    if router.health.get(h.url) is False:
        return f"its server {h.url} does not answer /health"
    if router.answers:
        status = router.listed.get(h.url)
        if status is None:
            return "not in the router"
        if status != ROUTED:
            return f"the router lists it {status}"
    return None


def plan(hosts: list[HostNow], router: RouterNow, target: str, *, max_unavailable: int) -> RollPlan:
    """The roll over `hosts` (declared order) to `target`, or its refusal."""
    head = f"the roll to {target} is refused before any host leaves the router"
    dead = [h for h in hosts if not h.reachable]
    if dead:
        # Whether or not a switch is planned (a drift check too): the host's state is not known.
        return RollPlan((), 0, refused="nothing was changed: " + "; ".join(f"{_entry(h.name)} ({h.url}): {h.error}" for h in dead)
                        + ". A fleet behind the router changes only once every host is read (one that does not answer can "
                          "neither be switched nor counted on to serve): bring it back, or take it out of gpu-serving:hosts "
                          "(the router is told) and run again")
    if router.machine_error:
        return RollPlan((), 0, refused=f"{head}: the router's machine does not answer over SSH ({router.machine_error}); "
                                       "bring it back, or move the router (gpu-serving:router.runsOn or router.host)")
    why = {h.name: w for h in hosts if (w := out_of_service(h, router))}
    # Out of service, but serving as declared with a server that answers: only the router lacks it.
    rejoin = [h.name for h in hosts if h.name in why and h.as_declared and h.serving and router.health.get(h.url) is not False]
    first = [h.name for h in hosts if h.name in why and (not h.as_declared or h.name in rejoin)]
    stuck = {n: w for n, w in why.items() if n not in first}
    declared = {h.url for h in hosts}
    leaving = {url: "leaves the fleet in this run while the router routes to it" for url, status in router.listed.items()
               if url not in declared and status == ROUTED and router.health.get(url) is not False}
    serving = [h.name for h in hosts if h.name not in why]
    todo = [h.name for h in hosts if h.name not in why and not h.as_declared]
    after = [n for n in serving if n not in todo] + list(stuck)
    out = {**stuck, **leaving}
    budget = max_unavailable - len(out)
    # Serving while a batch is out: the hosts serving now and the first batch back, less the batch.
    keep = len(serving) + len(first) - 1
    size = max(0, min(budget, keep))
    unavailable = {**why, **leaving}
    if todo and size < 1:
        if keep < 1:
            others = "; ".join(f"{_entry(n)}: {w}" for n, w in stuck.items())
            reason = (f"{_entry(todo[0])} is the only server the router has: switching it leaves nothing serving"
                      + (f" (the others are out of service: {others})" if others else "")
                      + ". Bring another host back, or add one to gpu-serving:hosts, or remove gpu-serving:router to "
                        "switch in place (nothing serves while it loads)")
        else:
            counted = "; ".join([f"{_entry(n)} ({w})" for n, w in stuck.items()] + [f"{u} ({w})" for u, w in leaving.items()])
            reason = (f"{counted} {'counts' if len(out) == 1 else 'count'} against gpu-serving:rollout.maxUnavailable "
                      f"({max_unavailable}): with {_entry(todo[0])} taken out as well, {len(out) + 1} would be out of the "
                      "router at once. Bring the hosts out of service back, let a host leave in one `up` and switch in the "
                      "next, or raise rollout.maxUnavailable")
        return RollPlan((), size, unavailable=unavailable, refused=f"{head}: {reason}")
    step = max(1, size)
    batches = ((tuple(first),) if first else ()) + tuple(tuple(todo[i:i + step]) for i in range(0, len(todo), step))
    return RollPlan(batches, size, first=tuple(first), rejoin=tuple(rejoin), after=tuple(after), unavailable=unavailable)


def unknown(names: list[str], max_unavailable: int) -> RollPlan:
    """The roll when the hosts could not be read (the SDK's mocks: no engine, no provider): the
    declared order, `max_unavailable` at a time."""
    size = max(1, max_unavailable)
    return RollPlan(tuple(tuple(names[i:i + size]) for i in range(0, len(names), size)), size)


def unresolved(entries: list[tuple[str, str]]) -> str:
    """The refusal of a run with hosts whose address is not known (entry, why), before anything
    changes: the router's unit, a roll's order and a multi-node layout's meeting point would take
    a stand-in name (`rehearsal-<name>`) for a machine."""
    return ("nothing was changed: " + "; ".join(f"{entry}: {why}" for entry, why in entries)
            + ". A fleet's or a multi-node stack's run needs every host's address before it changes anything (the "
              "router's unit, the roll and the ranks' meeting point name them); start it, or take the entry out of "
              "gpu-serving:hosts to run without it")


def stops_a_routed_server(serving_units: list[Any], unit: str, own_router: str, *, who: str, where: str) -> Optional[str]:
    """The refusal of a switch to `unit`, by a stack whose router is `own_router` ("" for none), on a
    host where a unit that another router sends requests to serves (status.HostUnit.routed_by;
    `serving_units`: what serves there now). Refused rather than drained: taking the server out of
    that router needs its admin key, a secret of the fleet's stacks, and once switched the router
    would send requests to a server of a strategy none of its stacks declares (issue 36.7: a
    one-host stack switched a fleet member, with no drain and no warning)."""
    for u in serving_units:
        if u.routed_by and u.routed_by != own_router:
            return (f"{who}the switch to {unit} is refused before anything stops: {u.name} (stack {u.stack or 'unknown'}) "
                    f"serves on {where} as a member of a fleet behind SGLang's router {u.routed_by}, which sends it "
                    f"requests, and this stack {'declares another router' if own_router else 'declares no router'}: it "
                    "could not take the server out of that router and drain it first, and the router would then send "
                    "requests to a server its fleet does not declare. Switch the host from that fleet's stacks, or take it "
                    "out of that fleet's gpu-serving:hosts first (its `up` takes it out of the router, drains and stops it)")
    return None


def notice(roll: RollPlan, target: str, router_url: str) -> str:
    """The line a run prints once when a switch is planned (serving_unit.SwitchNotice)."""
    return f"hosts whose strategy changes switch in this order: {roll.describe(target, router_url)}"


def plan_to_dict(roll: RollPlan) -> dict[str, Any]:
    return {"batches": [list(b) for b in roll.batches], "size": roll.size, "first": list(roll.first),
            "rejoin": list(roll.rejoin), "after": list(roll.after), "unavailable": dict(roll.unavailable),
            "refused": roll.refused}
