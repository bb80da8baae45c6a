"""The failure ledger, pure: a failed start's signature (what was started, on what, and why it
failed), the match of a planned start against recorded failures, and the warning said before
another quarter of an hour of loading 590 GB ends the same way. Cases under tests/data/ledger/.

A signature: the model (and the weights manifest when known), the layout, the flags' hash and
the flags that differ from the stack's last good start, the GPU model, driver and SGLang
version, the readiness outcome and the error class read from the journal (failure_lines.py).
A planned start matches a failure when it would start the same model with the same flags on the
same GPU model: the flags carry the layout (--tp-size ...); what says where the server listens
(--host, --port) or which node it is (--dist-init-addr, --node-rank) does not change the start,
so it is left out of the hash. The store (a table in the team's PostgreSQL, or a file beside
the file backend) is components/remote/ledger_store.py.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Iterable, Optional

from .failure_lines import classify
from .readiness import flag_groups
from .status import describe_layout, layout_of_argv

# Flags that place the server, not what it runs: not in the hash.
PLACEMENT_FLAGS = frozenset({"--host", "--port", "--dist-init-addr", "--node-rank"})
# A failed start's outcomes (core/readiness.py) and a rollback that failed too.
ROLLBACK_FAILED = "rollback_failed"
VERBS = {"crashed_during_load": "crashed", "timed_out": "timed out", "unhealthy": "never generated",
         "layout_mismatch": "served another layout", ROLLBACK_FAILED: "crashed and its rollback failed"}


def start_flags(argv: list[str]) -> dict[str, str]:
    """The server's flags from its ExecStart argv (flag -> its values; a switch -> ""), without
    the interpreter and the placement flags."""
    groups = flag_groups([str(a) for a in argv])
    return {flag: value for flag, value in groups[1:] if flag not in PLACEMENT_FLAGS} if groups else {}


def flags_hash(argv: list[str]) -> str:
    flags = sorted(start_flags(argv).items())
    return hashlib.sha256(json.dumps(flags, separators=(",", ":")).encode()).hexdigest()[:16]


def flags_changed(last_good: Optional[list[str]], argv: list[str]) -> list[str]:
    """The flags that differ from the stack's last good start, in words; [] when there was none."""
    if not last_good:
        return []
    before, after = start_flags(last_good), start_flags(argv)
    out = []
    for flag in list(after) + [f for f in before if f not in after]:
        if flag not in before:
            out.append(f"{flag} {after[flag]}".strip() + " (added)")
        elif flag not in after:
            out.append(f"{flag} {before[flag]}".strip() + " (removed)")
        elif before[flag] != after[flag]:
            out.append(f"{flag} {after[flag]} (last good: {before[flag]})")
    return out


@dataclass(frozen=True)
class Failure:
    """One recorded failed start. `id` is the store's (empty until stored)."""
    stack: str
    host: str  # the hosts entry's name, or the address
    time: str  # UTC, ISO 8601
    outcome: str  # readiness status, or rollback_failed
    model: str
    model_path: str
    layout: str
    flags_hash: str
    flags: dict[str, Any] = field(default_factory=dict)
    flags_changed: tuple[str, ...] = ()
    gpu_model: str = ""
    driver_version: str = ""
    sglang_version: str = ""
    error_class: str = "other"
    error: str = ""  # "CUDA out of memory during CUDA graph capture"
    journal_line: str = ""
    manifest: str = ""  # the weights manifest's id, when the stack names one
    id: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Failure":
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        values["flags_changed"] = tuple(values.get("flags_changed") or ())
        values["id"] = str(values.get("id") or "")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def date(self) -> str:
        return self.time[:10]


def signature(*, stack: str, host: str, outcome: str, argv: list[str], journal: str, model: str,
              last_good_argv: Optional[list[str]] = None, facts: Optional[dict[str, Any]] = None, sglang_version: str = "",
              manifest: str = "", when: Optional[datetime] = None) -> Failure:
    """A failed start's signature. `facts`: the host's facts (HostFacts.as_dict), for the GPU
    model and the driver; `journal`: the unit's journal tail, already free of secrets."""
    flags = start_flags(argv)
    cause = classify(journal, outcome)
    facts = facts or {}
    when = (when or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return Failure(stack=stack, host=host, time=when.isoformat(timespec="seconds").replace("+00:00", "Z"),
                   outcome=outcome, model=model, model_path=flags.get("--model-path", ""),
                   layout=describe_layout(layout_of_argv([str(a) for a in argv])), flags_hash=flags_hash(argv),
                   flags=flags, flags_changed=tuple(flags_changed(last_good_argv, argv)),
                   gpu_model=", ".join(facts.get("gpu_models") or []), driver_version=facts.get("driver_version", ""),
                   sglang_version=sglang_version, error_class=cause.key, error=cause.label, journal_line=cause.line,
                   manifest=manifest)


def matches(failures: Iterable[Failure], *, argv: list[str], gpu_model: str) -> list[Failure]:
    """The recorded failures a planned start repeats: the same model path and flags (the layout
    with them) on the same GPU model; newest first. `gpu_model` "": not known yet (a host never
    read): any GPU model matches, the warning says on which it failed."""
    h = flags_hash(argv)
    path = start_flags(argv).get("--model-path", "")
    found = [f for f in failures if f.flags_hash == h and f.model_path == path and (not gpu_model or f.gpu_model == gpu_model)]
    return sorted(found, key=lambda f: f.time, reverse=True)


def warning(f: Failure, *, driver_version: str = "", sglang_version: str = "") -> str:
    """The words `plan`, `preview` and `advise` say before a start that matches `f`: "this layout
    with these flags crashed on gpu1 on 2026-12-04: CUDA out of memory during CUDA graph capture
    (<journal line>)", and what differs since, which may be why it would not fail again."""
    verb = VERBS.get(f.outcome, "failed")
    text = f"this layout with these flags {verb} on {f.host} on {f.date}: {f.error}"
    if f.journal_line:
        text += f" ({f.journal_line})"
    since = [f"{what} {then} then, {now} now" for what, then, now in (("driver", f.driver_version, driver_version),
                                                                      ("SGLang", f.sglang_version, sglang_version))
             if then and now and then != now]
    if since:
        text += "; " + ", ".join(since)
    return text + f" [ledger entry {f.id}: `python -m components ledger clear --id {f.id}` once it is fixed]" if f.id else text


def warnings_for(failures: Iterable[Failure], *, argv: list[str], gpu_model: str = "", driver_version: str = "",
                 sglang_version: str = "") -> list[str]:
    """What `plan`, `preview` and `advise` say before a start of `argv`, word for word the same:
    one `warning` per recorded failure it repeats (`matches`), newest first."""
    return [warning(f, driver_version=driver_version, sglang_version=sglang_version)
            for f in matches(failures, argv=argv, gpu_model=gpu_model)]


def model_of(argv: list[str]) -> str:
    """The model a start serves, in the operator's words: its served name, else its directory's name."""
    flags = start_flags(argv)
    return flags.get("--served-model-name") or flags.get("--model-path", "").rstrip("/").rsplit("/", 1)[-1]


# What a failed start's signature needs from its host beyond the journal, in one round trip after
# the failure (never on the way to a start): the GPU model and driver (nvidia-smi's query), and the
# SGLang the venv imports (its package's version.py, where SGLang keeps `__version__`: no Python
# started, and whatever distribution installed it). $1: the venv.
FAILED_START_SCRIPT = r"""
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
echo @@sglang
cat "$1"/lib/python3*/site-packages/sglang/version.py 2>/dev/null
"""


def venv_of(argv: list[str]) -> str:
    """The venv of a server's ExecStart (its interpreter `<venv>/bin/python`), "" when not one."""
    first = str(argv[0]) if argv else ""
    return first.rsplit("/bin/", 1)[0] if "/bin/" in first else ""


def parse_failed_start(text: str) -> tuple[dict[str, Any], str]:
    """(facts for `signature`: gpu_models and driver_version, the SGLang version) from
    FAILED_START_SCRIPT's answer; what it does not say is left empty."""
    head, _, tail = text.partition("@@sglang")
    models: set[str] = set()
    driver = ""
    for line in head.splitlines():
        name, _, version = line.rpartition(",")
        if name.strip() and version.strip():
            models.add(name.strip())
            driver = driver or version.strip()
    found = re.search(r"^__version__\s*=\s*[\"']([^\"'\s]+)[\"']", tail, re.M | re.ASCII)
    return {"gpu_models": sorted(models), "driver_version": driver}, (found.group(1) if found else "")


def describe(f: Failure) -> str:
    """One entry as `python -m components ledger` lists it."""
    lines = [f"{f.id or '-'}  {f.time}  stack {f.stack} on {f.host}: {VERBS.get(f.outcome, f.outcome)}: {f.error}",
             f"    {f.model} ({f.model_path}), {f.layout}, flags {f.flags_hash}"
             + (f", manifest {f.manifest}" if f.manifest else ""),
             f"    {f.gpu_model or 'GPU unknown'}, driver {f.driver_version or '?'}, SGLang {f.sglang_version or '?'}"]
    if f.flags_changed:
        lines.append("    since the last good start: " + "; ".join(f.flags_changed))
    if f.journal_line:
        lines.append(f"    journal: {f.journal_line}")
    return "\n".join(lines)
