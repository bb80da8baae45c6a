"""paramiko, loaded on its first attribute access.

The Pulumi program imports the transport only to declare the providers, and never connects:
paramiko's ~60 ms of imports are paid by the provider process alone, which connects. Every
module of the transport takes `paramiko` from here, so the settings below hold for all of them.
"""
from __future__ import annotations

import logging
import sys
from typing import Any


def _lazy_import(name: str) -> Any:
    """The module, loaded on its first attribute access (importlib's LazyLoader). Typed Any:
    its attributes (paramiko.SSHClient, ...) exist only once it has loaded."""
    import importlib.util
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"{name} is not installed: scripts/setup installs the requirements")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


# paramiko imports invoke (a dependency of its own) only to run the `Match exec` lines of an
# ssh_config file, and gpu-serving never reads one: every connection setting is the stack's.
# invoke's import (asyncio, unittest.mock, yaml) was ~0.1 s of every provider process's first
# read (docs/benchmarks.md). Marked absent, paramiko takes its own "no invoke" path; a process
# that loaded invoke already keeps it.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]  # None there: "never import it" (importlib)
paramiko = _lazy_import("paramiko")
# paramiko's transport thread logs a connection it gives up (a host that sends no SSH banner) with
# its traceback, which lands on the provider's stderr and so in the engine's output (issue 36.12);
# the caller gets the same failure as one line (Unreachable). No handler: nothing of it is printed.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False
