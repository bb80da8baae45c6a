"""python -m rehearsal.cuda [--version 13.0] [--force]: build the stand-in CUDA apt repository."""
from __future__ import annotations

import argparse
import json
import sys

from .repo import RepoBuildError, build_repo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rehearsal.cuda",
                                description="Build (or reuse from the cache) the signed stand-in of NVIDIA's "
                                            "CUDA apt repository that rehearsal hosts install from.")
    p.add_argument("--version", default="13.0", help="CUDA toolkit version (default 13.0)")
    p.add_argument("--force", action="store_true", help="rebuild the repository (the signing key is kept)")
    args = p.parse_args(argv)
    try:
        info = build_repo(args.version, force=args.force)
    except RepoBuildError as exc:
        print(f"rehearsal.cuda: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
