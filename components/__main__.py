"""`python -m components <command>`: the commands live in components/cli/ (one module each);
`main` is importable from here as before (the tests call it)."""
from __future__ import annotations

import sys

from components.cli import BROKEN_PIPE_EXIT, main, run

__all__ = ["BROKEN_PIPE_EXIT", "main", "run"]

if __name__ == "__main__":
    sys.exit(run())
