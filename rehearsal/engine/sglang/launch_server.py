"""``python -m sglang.launch_server``: the rehearsal engine's entry point (see sglang/__init__.py)."""
import sys

from sglang._rehearsal.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
