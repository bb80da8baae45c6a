"""The host's fitness now against its baseline, in one small read: what the switch checks before
anything stops (`readiness.fitness`), and what `status`, `compare` and `advise` show. Pure: the
script and its parser (cases under tests/data/fitness-read/).

The read is the baseline file (fitness_baseline.BASELINE_FILE), then, only when the host has one
(or when `status` asks for the degradations anyway), the fitness sections of the host facts:
nvidia-smi's XML report cut on the host, the system's NCCL, IOMMU and ACS (core/fitness.py). A
host never benchmarked pays one `cat` per switch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .facts import split_sections
from .fitness import IOMMU_SCRIPT, NCCL_SCRIPT, XML_FILTER, HostFitness, degradations, parse_fitness
from .fitness_baseline import BASELINE_FILE, Change, HostBaseline, compare, drift_message, not_comparable, parse_baseline, verdict

# Run by reads.fitness. $1: "always" reads the GPUs even without a baseline (status: what is degraded now); anything
# else only when there is one. @@end says the answer is whole.
FITNESS_SCRIPT = r"""
echo '@@baseline'; cat {baseline} 2>/dev/null
if [ "$1" = always ] || [ -s {baseline} ]; then
  echo '@@fitness'; { nvidia-smi -q -x 2>&1 || echo "@@rc=$?"; } | {xml_filter}
  echo '@@iommu'; {iommu}
  echo '@@nccl'; {nccl}
fi
echo '@@end'
""".replace("{baseline}", BASELINE_FILE).replace("{xml_filter}", XML_FILTER).replace("{iommu}", IOMMU_SCRIPT) \
    .replace("{nccl}", NCCL_SCRIPT)


@dataclass(frozen=True)
class FitnessNow:
    """What one read says: the host's baseline (None: never benchmarked), its fitness now (None:
    not read), and what kept either from being read."""
    baseline: Optional[HostBaseline]
    now: Optional[HostFitness]
    problems: tuple[str, ...] = ()

    @property
    def changes(self) -> Optional[list[Change]]:
        """What changed since the baseline; None: unknown (no baseline, or the GPUs not read)."""
        return compare(self.baseline.fitness, self.now) if self.baseline is not None else None

    def drift(self, host: str) -> str:
        """The drift check's line ("" when nothing changed or nothing is known)."""
        changes = self.changes
        return drift_message(host, changes, self.baseline.words()) if changes and self.baseline else ""

    def verdict(self, policy: str, host: str, stack: str) -> tuple[Optional[str], Optional[str]]:
        """(refusal, warning) of a start under `readiness.fitness` = policy."""
        return verdict(policy, host, self.changes, self.baseline.words() if self.baseline else "", stack)

    def degradations(self) -> list[str]:
        return degradations(self.now) if self.now is not None else []

    def as_dict(self, host: str) -> dict[str, Any]:
        """`status --json`'s `fitness` of a host."""
        changes = self.changes
        return {"baseline": self.baseline.words() if self.baseline else None,
                "baseline_run": self.baseline.run if self.baseline else None,
                "drift": self.drift(host) or None, "changes": [c.text() for c in changes or []],
                "degraded": self.degradations(), "problems": list(self.problems)}


def parse(text: str) -> FitnessNow:
    """FITNESS_SCRIPT's answer. An answer cut short (no @@end) reads as nothing known, with why."""
    s = split_sections(text)
    if "end" not in s:
        return FitnessNow(None, None, (f"the fitness read was cut short ({len(text)} characters)",))
    baseline, problem = parse_baseline(s.get("baseline"))
    problems = [problem] if problem else []
    now = None
    if "fitness" in s:
        now = parse_fitness(s["fitness"], s.get("nccl", ""), s.get("iommu", ""))
        problems += list(now.problems)
    return FitnessNow(baseline, now, tuple(problems))


def mark(run_fitness: Optional[dict[str, Any]], now: Optional[HostFitness]) -> Optional[str]:
    """A benchmark run's mark against the host now: "not comparable: <what changed>", or None
    (the same machine, or unknown: a run recorded before fitness was read, a host not read)."""
    changes = compare(run_fitness, now)
    return not_comparable(changes) if changes else None
