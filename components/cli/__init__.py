"""The commands of `python -m components`, one module each (issue 37.2): every module has
`add_parser(subparsers)`, which adds its command(s) and their flags, and `run(args) -> int`,
which does the command and returns its exit status. `main` builds the parser from `COMMANDS`
and calls the chosen command's `run`; `run` here is `main` with a closed pipe ending it quietly.

This is the top floor: nothing in components/ imports it but components/__main__.py. A command
module holds the argument handling, the printing and the exit statuses; what it calls stays on
its floor (core/ pure, remote/ host I/O, components/*.py the Automation API). Every command
module is imported for every command, so one that needs the SSH side or the engine imports it
inside its `run` (tests/test_layers.py, LAZY, says why for each).
"""
from __future__ import annotations

import argparse
import os
import sys

from . import advise, compare, hosts, ledger, metrics, plan, recommend, serving_bench, status, watch

# In the order `python -m components --help` lists them.
COMMANDS = (plan, hosts, status, serving_bench, compare, advise, watch, ledger, metrics, recommend)

USAGE = """``python -m components plan --stack NAME [--json]``: check a strategy offline, before any SSH.
``python -m components rehearsal-hosts --stack NAME``: the rehearsal hosts the stack deploys to.
``python -m components real-hosts --stack NAME``: the machines it deploys to that are not rehearsal hosts.
``python -m components status [--stack NAME] [--json]``: what serves on the hosts, read over SSH.
``python -m components compare [--stacks tp8,pp8,ep8]``: stored benchmark results side by side, and a PNG.
``python -m components advise --stack NAME [--concurrency 1,32,64] [--facts]``: rank layouts (estimates).
``python -m components bench --stack NAME``: SGLang's serving benchmark on the host, results in results/bench/.
``python -m components watch --stacks tp8,pp8,ep8 [--every 10m] [--once]``: the drift watch (status.json, a Prometheus file).
``python -m components ledger [list|clear]``: the failed starts recorded, and why (the failure ledger).
``python -m components metrics --scrape-config``: a Prometheus scrape configuration and a target file per stack.
``python -m components recommend --stack NAME``: the strategy the observed traffic calls for, with its numbers."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m components", description=USAGE)
    sub = parser.add_subparsers(dest="command", required=True)
    runs = {}
    for module in COMMANDS:
        before = set(sub.choices)
        module.add_parser(sub)
        # The names (and aliases) this module added are its commands.
        runs.update({name: module.run for name in set(sub.choices) - before})
    args = parser.parse_args(argv)
    return runs[args.command](args)


# The exit status of a command whose reader went away (`status | head -3`): a C tool killed by
# SIGPIPE reports 128 + 13 to the shell, and so does this one, without a traceback.
BROKEN_PIPE_EXIT = 141


def run(argv: list[str] | None = None) -> int:
    """`main`, with its output cut short quietly when the reader closes the pipe (Python's
    default is a BrokenPipeError traceback, and another when the interpreter flushes stdout at
    exit)."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Whatever is still buffered must not be flushed at exit into the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
