"""The Prometheus target files (components/core/scrape.py renders them), one per stack, written
by `python -m components metrics --scrape-config` (components/cli/metrics.py) and rewritten by
each watch tick (components/traffic_watch.py) and by `pulumi up` of the stack (the program calls
`rewrite_after_up`), so a fleet edit or a rehearsal host's new address reaches Prometheus without
a restart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .core import scrape
from .core.config import StackSettings
from .core.errors import ConfigError
from .core.metrics_settings import METRICS_KEY, parse_metrics
from .core.plan import check_stack
from .core.rules import NAMESPACE
from .core.stack_config import RawConfig, from_files
from .files import atomic_write
from .remote import rehearsal_adapter


def stack_targets(project_dir: Path, stack: str, addresses: dict[str, str]) -> tuple[list[scrape.Target], list[str]]:
    """One stack's targets from its files (raises ConfigError on bad settings)."""
    settings = check_stack(stack, from_files(project_dir, stack), project_dir, addresses).settings
    return scrape.targets_of(settings, addresses)


def rewrite_targets(project_dir: Path, stacks: list[str], targets_dir: Path, log: Callable[[str], None] = print) -> list[str]:
    """Each stack's target file, written (atomically) only when its text changed. A stack whose
    settings cannot be read keeps its previous file (the watch reports the stack's error).
    Returns the files written."""
    addresses = rehearsal_adapter.addresses()
    written = []
    for stack in stacks:
        try:
            targets, notes = stack_targets(project_dir, stack, addresses)
        except ConfigError:
            continue
        for note in notes:
            log(f"metrics: stack {stack}: {note}")
        path = targets_dir / f"{stack}.json"
        text = scrape.render_targets(targets)
        try:
            same = path.read_text() == text
        except OSError:
            same = False
        if not same:
            atomic_write(path, text)
            written.append(str(path))
    return written


def rewrite_after_up(settings: StackSettings, raw: RawConfig, addresses: dict[str, str], warn: Callable[[str], None]) -> None:
    """`pulumi up`'s rewrite of the stack's own target file (from the settings the program just
    checked), in gpu-serving:metrics.targetsDir when that directory exists (made by `metrics
    --scrape-config` or a watch: where this machine's Prometheus reads); nothing otherwise. Best
    effort: a file that cannot be written is a warning, never a failed `up`."""
    try:
        directory = Path(parse_metrics(raw.values.get(f"{NAMESPACE}:{METRICS_KEY}")).targets_dir).expanduser()
    except ValueError:
        return  # refused by the stack's check already
    if not directory.is_dir():
        return
    targets, notes = scrape.targets_of(settings, addresses)
    for note in notes:
        warn(f"metrics: stack {settings.stack}: {note}")
    path = directory / f"{settings.stack}.json"
    text = scrape.render_targets(targets)
    try:
        if not path.exists() or path.read_text() != text:
            atomic_write(path, text)
    except OSError as exc:
        warn(f"metrics: the Prometheus target file of stack {settings.stack} was not rewritten in {directory}: {exc}")
