"""``python -m components ledger``: the failure ledger, listed and cleared.

Each failed start a stack recorded (readiness other than ready, or a failed rollback), with its
signature and the journal line that says why (components/core/ledger.py), kept beside the state
(components/remote/ledger_store.py): in the team's PostgreSQL, or a file next to the file backend.
`plan`, `preview` and `advise` warn before a start that matches an entry; clear an entry once
what made it fail is fixed (a driver upgraded, a flag changed back on purpose).

    python -m components ledger [list] [--stack ep8] [--json]
    python -m components ledger clear --id 3 [--id 4]      # those entries
    python -m components ledger clear --stack ep8          # a stack's
    python -m components ledger clear --all                # every entry
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..core.ledger import describe
from ..remote.ledger_store import LedgerError, store_for


def add_parser(sub) -> None:
    p = sub.add_parser("ledger", help="the failure ledger: each failed start recorded with why (list, clear)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=("list", "clear"), default="list")
    p.add_argument("--stack", help="only this stack's entries")
    p.add_argument("--id", action="append", dest="ids", metavar="ID", help="clear: this entry (again for more)")
    p.add_argument("--all", action="store_true", help="clear: every entry")
    p.add_argument("--json", action="store_true", help="list: machine-readable output")
    p.add_argument("--backend", help="the state's backend URL (default: $PULUMI_BACKEND_URL, as scripts/env.sh sets it)")


def run(args) -> int:
    """Exit 0 done; 2 a bad command line or a ledger that cannot be reached (the message says why)."""
    if args.action == "clear" and not (args.ids or args.stack or args.all):
        print("error: ledger clear: name what to clear: --id ID, --stack NAME or --all", file=sys.stderr)
        return 2
    if args.action == "clear" and args.all and (args.ids or args.stack):
        print("error: ledger clear: --all clears every entry; leave out --id and --stack", file=sys.stderr)
        return 2
    if args.action == "list" and (args.ids or args.all):
        print("error: ledger list: --id and --all are for `ledger clear`", file=sys.stderr)
        return 2
    try:
        store = store_for(args.backend or os.environ.get("PULUMI_BACKEND_URL"))
        if args.action == "clear":
            n = store.clear(ids=args.ids, stack=args.stack)
            print(f"cleared {n} ledger entr{'y' if n == 1 else 'ies'} ({store.where})")
            return 0
        entries = store.list(args.stack)
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([e.as_dict() for e in entries], sys.stdout, indent=2)
        print()
    elif not entries:
        print(f"no failed start recorded{' for stack ' + args.stack if args.stack else ''} ({store.where})")
    else:
        print(f"{len(entries)} failed start{'s' if len(entries) != 1 else ''} recorded ({store.where}):")
        for e in entries:
            print(describe(e))
    return 0
