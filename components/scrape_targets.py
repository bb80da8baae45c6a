"""The Prometheus target files (components/core/scrape.py renders them), one per stack, written
by `python -m components metrics --scrape-config` (components/cli/metrics.py) and rewritten by
each watch tick (components/traffic_watch.py), so a fleet edit or a rehearsal host's new address
reaches Prometheus without a restart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .core import scrape
from .core.errors import ConfigError
from .core.plan import check_stack
from .core.stack_config import from_files
from .files import atomic_write


def _addresses() -> dict[str, str]:
    from .remote.ssh import rehearsal_addresses
    return rehearsal_addresses()


def stack_targets(project_dir: Path, stack: str, addresses: dict[str, str]) -> tuple[list[scrape.Target], list[str]]:
    """One stack's targets from its files (raises ConfigError on bad settings)."""
    settings = check_stack(stack, from_files(project_dir, stack), project_dir, addresses).settings
    return scrape.targets_of(settings, addresses)


def rewrite_targets(project_dir: Path, stacks: list[str], targets_dir: Path, log: Callable[[str], None] = print) -> list[str]:
    """Each stack's target file, written (atomically) only when its text changed. A stack whose
    settings cannot be read keeps its previous file (the watch reports the stack's error).
    Returns the files written."""
    addresses = _addresses()
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
