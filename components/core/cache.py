"""Where gpu-serving keeps what is slow to make on this machine (the rehearsal engine's wheel,
the router's and the benchmark client's wheels): one root, `GPU_SERVING_CACHE` or
/var/cache/gpu-serving, the same as scripts/setup's. Read when asked, never at import (the warm
process imports this module once for every run)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

DEFAULT = "/var/cache/gpu-serving"


def cache_root(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("GPU_SERVING_CACHE") or DEFAULT)
