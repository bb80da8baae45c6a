"""Staging a checkpoint to N hosts as a plan: who copies from whom, the source read once.

Pure, modelled on `switch.plan`: the state of every host in (what each must still fetch, and
whether it fits), the links out (a target and the host, or the source, it copies from), or none
and why; cases in tests/data/weights/staging/. The executor (the ModelWeights provider, see
docs/weights-design.md) runs the links in parallel.

Why links and not waves: a link is pipelined by file. A target starts fetching a file as soon as
the host it copies from holds that file whole, so a chain source -> A -> B -> C moves the
checkpoint once over every host's link, at the same time: with 64 shards, four hosts finish
about 3/64 of a checkpoint later than one, where store-and-forward waves (A complete, then B)
would take three times as long. Every host's uplink carries `fanout` streams: 1 (a chain) gives
each stream the whole link, which is right when the hosts' links are alike; a fatter uplink can
feed a tree (fanout 2 or more). The source, whatever the fanout, feeds one link: it is read once.
Hosts that already hold the checkpoint feed the others and the source is not read at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .weights import gb

SOURCE = "source"


@dataclass(frozen=True)
class Target:
    """One host's state: the manifest paths it must still fetch, their bytes, and why it cannot
    take them (`weights.space_refusal`), if so."""

    files: tuple[str, ...] = ()
    bytes: int = 0
    refusal: Optional[str] = None

    @property
    def complete(self) -> bool:
        return not self.files


@dataclass(frozen=True)
class Link:
    """`target` copies its files from `origin` (a host's name, or SOURCE), file by file."""

    target: str
    origin: str
    files: int
    bytes: int

    def __str__(self) -> str:
        return f"{self.target} <- {self.origin}: {self.files} file{'s' if self.files != 1 else ''}, {gb(self.bytes)}"


@dataclass
class StagingPlan:
    links: list[Link]
    reason: str
    refused: Optional[str] = None
    failed: tuple[str, ...] = field(default_factory=tuple)

    @property
    def source_reads(self) -> int:
        return sum(1 for link in self.links if link.origin == SOURCE)

    def as_dict(self) -> dict[str, Any]:
        return {"links": [str(link) for link in self.links], "sourceReads": self.source_reads, "reason": self.reason,
                "refused": self.refused, "failed": list(self.failed)}


def plan(source: str, targets: dict[str, Target], *, fanout: int = 1, source_host: Optional[str] = None) -> StagingPlan:
    """The links that give every host of `targets` (in the stack's order) the whole checkpoint.

    `source`: model.source as written (for the messages); `source_host`: the hosts entry a host:
    source names (a target itself when it is a fleet peer: then it must be complete, its copy is
    the reference); `fanout`: the streams one host's uplink feeds (1: chains)."""
    if fanout < 1:
        raise ValueError("fanout is at least 1")
    refusals = [t.refusal for t in targets.values() if t.refusal]
    if refusals:
        return StagingPlan([], "a host has no room for its files", refused=(
            "; ".join(refusals) + " (nothing was copied)"))
    if source_host in targets and not targets[source_host].complete:
        t = targets[source_host]
        return StagingPlan([], f"the source host {source_host} lacks files", refused=(
            f"{source_host}, the source ({source}), lacks {len(t.files)} file{'s' if len(t.files) != 1 else ''} of the "
            f"checkpoint ({', '.join(t.files[:5])}{', ...' if len(t.files) > 5 else ''}): it cannot feed the others "
            "(nothing was copied). Complete it first, or name another source."))
    holders = [name for name, t in targets.items() if t.complete]
    needing = [name for name, t in targets.items() if not t.complete]
    if not needing:
        return StagingPlan([], f"every host holds the checkpoint ({len(targets)} of {len(targets)}): nothing to copy")
    links = _attach(holders, needing, targets, fanout)
    reads = sum(1 for link in links if link.origin == SOURCE)
    hosts = f"{len(needing)} host{'s' if len(needing) != 1 else ''} to stage"
    if reads:
        fed = f"{hosts} from {source}, read once" + (f", then host to host ({_shape(fanout)})" if len(needing) > 1 else "")
    else:
        fed = (f"{hosts} from {', '.join(holders)}, which hold{'s' if len(holders) == 1 else ''} the checkpoint "
               f"(the source is not read), host to host ({_shape(fanout)})")
    return StagingPlan(links, fed)


def _shape(fanout: int) -> str:
    return "a chain" if fanout == 1 else f"a tree, {fanout} streams a host"


def _attach(holders: list[str], needing: list[str], targets: dict[str, Target], fanout: int) -> list[Link]:
    """Breadth first: the holders (or, without one, the source with a single stream) feed the first
    targets, each attached target then feeds later ones, in the stack's order. With fanout 1 and
    two holders, each starts a chain of half the hosts."""
    # (host, streams it may still feed)
    feeders: list[tuple[str, int]] = [(h, fanout) for h in holders] or [(SOURCE, 1)]
    links: list[Link] = []
    for target in needing:
        while feeders[0][1] == 0:
            feeders.pop(0)
        origin, left = feeders[0]
        feeders[0] = (origin, left - 1)
        t = targets[target]
        links.append(Link(target, origin, len(t.files), t.bytes))
        feeders.append((target, fanout))
    return links


def after_failure(source: str, targets: dict[str, Target], done: set[str], failed: set[str], *,
                  fanout: int = 1, source_host: Optional[str] = None) -> StagingPlan:
    """The plan again once `failed` hosts' transfers failed and `done` finished: the failed ones
    are left out (each named, the others never wait for them) and the hosts that were to copy
    from them copy from a host that finished (or from the source when none did)."""
    rest = {name: (Target() if name in done else t) for name, t in targets.items() if name not in failed}
    p = plan(source, rest, fanout=fanout, source_host=source_host)
    named = ", ".join(sorted(failed))
    p.failed = tuple(sorted(failed))
    p.reason = f"{named} failed (its own transfer; the others go on): " + p.reason
    return p
