"""Rehearsal stand-in for SGLang (distribution ``sglang-rehearsal``).

It is NOT SGLang: it runs no model and touches no GPU. ``python -m sglang.launch_server`` parses
SGLang's command line, applies SGLang's layout and memory rules against the GPUs a (simulated)
nvidia-smi reports, then serves SGLang's HTTP surface with fake generations. Everything it
reports carries a version containing "rehearsal".
"""
from sglang.version import __version__

__all__ = ["__version__"]
