"""Whether this program run says what a preview says (core/run_kind.py): in a preview, and in an
update only when its `pulumi` command showed no preview first. The program's warnings about the
settings follow it (the providers decide the same for theirs: remote/cli.py)."""
from __future__ import annotations

import pulumi

from .remote import cli


def says_preview_things() -> bool:
    return cli.says_preview_things(bool(pulumi.runtime.is_dry_run()))
