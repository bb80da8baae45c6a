"""python -m rehearsal: manage local rehearsal hosts (see rehearsal/host.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import degrade, host


def _print_info(info: host.HostInfo, as_json: bool) -> None:
    if as_json:
        print(info.to_json())
        return
    d = info.to_dict()
    keys = ["name", "state", "address", "port", "user", "private_key", "host_public_key",
            "known_hosts", "profile", "model_path", "pid", "index", "netns", "console_log"]
    if info.state == "absent":
        keys = ["name", "state"]
    width = max(len(k) for k in keys)
    for k in keys:
        if d.get(k) is not None:
            print(f"{k:<{width}}  {d[k]}")
    if info.state == "running":
        print(f"{'ssh':<{width}}  python -m rehearsal ssh {info.name} [command...]")


def _down_names(args) -> list[str] | None:
    """The hosts `down` removes: the ones named, or with --all every one on this machine, after
    a yes (asked on a terminal, or --yes). None: refused (said on stderr), nothing removed."""
    if args.all and args.name:
        print("rehearsal: error: down takes host names or --all, not both", file=sys.stderr)
        return None
    if not args.all:
        if not args.name:
            print("rehearsal: error: down removes a host completely: name it (`python -m rehearsal down NAME`; "
                  "`python -m rehearsal list` shows them), or --all for every host on this machine", file=sys.stderr)
            return None
        return list(args.name)
    names = [i.name for i in host.list_hosts()]
    if not names or args.yes:
        return names
    question = f"remove every rehearsal host on this machine ({len(names)}: {', '.join(names)})? [y/N] "
    if not sys.stdin.isatty():
        print(f"rehearsal: error: --all would remove {len(names)} host(s) ({', '.join(names)}), some perhaps "
              "other people's: add --yes to do it without a terminal to ask on", file=sys.stderr)
        return None
    if input(question).strip().lower() not in ("y", "yes"):
        print("rehearsal: nothing removed", file=sys.stderr)
        return None
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rehearsal",
                                description="Local rehearsal hosts: Debian bookworm, systemd "
                                "PID 1 and OpenSSH, in systemd-nspawn + a network namespace.")
    sub = p.add_subparsers(dest="verb", required=True)

    def add(verb, help_, name_nargs="?"):
        sp = sub.add_parser(verb, help=help_)
        if name_nargs is not None:
            sp.add_argument("name", nargs=name_nargs, default=host.DEFAULT_NAME,
                            help=f"instance name (default {host.DEFAULT_NAME!r})")
        return sp

    sp = add("up", "boot a host (build the rootfs once first); idempotent")
    sp.add_argument("--profile", help=f"GPU profile (default {host.DEFAULT_PROFILE})")
    sp.add_argument("--model", help=f"model stand-in (default {host.DEFAULT_MODEL})")
    sp.add_argument("--index", type=int, help="subnet index: 10.213.<index>.0/24 "
                    "(default: lowest free)")
    sp.add_argument("--timeout", type=float, default=120.0)
    sp.add_argument("--json", action="store_true")

    # No default name here: removing a host is never what a bare `down` should guess.
    sp = sub.add_parser("down", help="power off and remove completely (name each host, or --all)")
    sp.add_argument("name", nargs="*", help="instance name(s) to remove")
    sp.add_argument("--all", action="store_true", help="every instance on this machine (asks first; --yes to skip)")
    sp.add_argument("--yes", action="store_true", help="with --all: do not ask")
    sp.add_argument("--timeout", type=float, default=30.0)

    sp = add("stop", "power off cleanly, keep the disk (up boots it again)")
    sp.add_argument("--timeout", type=float, default=30.0)
    sp.add_argument("--json", action="store_true")

    sp = add("restart", "clean poweroff, then boot again on the same disk (a reboot)")
    sp.add_argument("--timeout", type=float, default=120.0)
    sp.add_argument("--json", action="store_true")

    sp = add("status", "running / stopped / absent, with the connection info "
             "(exit 0 when running, 3 otherwise)")
    sp.add_argument("--json", action="store_true")

    sp = add("list", "all instances", name_nargs=None)
    sp.add_argument("--json", action="store_true")

    sp = sub.add_parser("ssh", help="ssh into a host (pinned host key, generated key)")
    sp.add_argument("name")
    sp.add_argument("command", nargs=argparse.REMAINDER)

    sub.add_parser("isolate", help=f"make the rehearsal address range ({host.RANGE}) end on this "
                   "machine: refuse if the machine is attached to a network overlapping it, else "
                   "add a no-route entry for it (idempotent; up does it too)")

    sp = add("degrade", "degrade the host's simulated GPUs now (read by its next nvidia-smi): "
             "a power cap, clocks locked low, a slower PCIe link, retired memory, persistence off")
    sp.add_argument("--gpu", default="all", help="GPU indices, comma-separated, or 'all' (default)")
    sp.add_argument("--power-cap", type=float, metavar="W", help="enforced power limit in watts (nvidia-smi -pl)")
    sp.add_argument("--clocks-locked", type=int, metavar="MHz", help="graphics clocks held at MHz")
    sp.add_argument("--pcie", metavar="genGxW", help="the link as trained now, e.g. gen4x8")
    sp.add_argument("--ecc-retired-pages", type=int, metavar="N", help="memory retired after ECC errors, pending a reboot")
    sp.add_argument("--persistence-off", action="store_true", help="persistence mode off (nvidia-smi -pm 0)")
    sp.add_argument("--clear", action="store_true", help="remove every degradation (the profile's hardware again)")

    sp = add("rootfs", "build the base rootfs now (normally done by the first up)",
             name_nargs=None)
    sp.add_argument("--force", action="store_true", help="rebuild even when present")

    args = p.parse_args(argv)
    try:
        if args.verb == "up":
            _print_info(host.up(args.name, profile=args.profile, model=args.model,
                                index=args.index, timeout=args.timeout), args.json)
        elif args.verb == "down":
            names = _down_names(args)
            if names is None:
                return 2
            for n in names:
                host.down(n, timeout=args.timeout)
                print(f"{n}: down")
        elif args.verb == "stop":
            _print_info(host.stop(args.name, timeout=args.timeout), args.json)
        elif args.verb == "restart":
            _print_info(host.restart(args.name, timeout=args.timeout), args.json)
        elif args.verb == "status":
            info = host.status(args.name)
            _print_info(info, args.json)
            return 0 if info.state == "running" else 3
        elif args.verb == "list":
            infos = host.list_hosts()
            if args.json:
                print(json.dumps([i.to_dict() for i in infos], indent=2))
            else:
                for i in infos:
                    print(f"{i.name:<12} {i.state:<8} {i.address or '-':<14} "
                          f"pid={i.pid or '-'} profile={i.profile} model={i.model}")
        elif args.verb == "ssh":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            argv_ = host.ssh_argv(args.name, command)
            sys.stdout.flush()
            os.execvp(argv_[0], argv_)
        elif args.verb == "degrade":
            if args.clear:
                gone = degrade.clear(args.name)
                print(f"{args.name}: {'degradations removed' if gone else 'nothing was degraded'}")
                return 0
            changes = {k: v for k, v in (("power_cap_w", args.power_cap), ("clocks_locked_mhz", args.clocks_locked),
                                         ("pcie", args.pcie), ("ecc_retired_pages", args.ecc_retired_pages),
                                         ("persistence_off", args.persistence_off or None)) if v is not None}
            gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
            table = degrade.degrade(args.name, gpus, changes)
            print(json.dumps({"host": args.name, "gpus": table}, indent=2))
        elif args.verb == "isolate":
            print(host.isolate_range())
        elif args.verb == "rootfs":
            print(host.ensure_rootfs(force=args.force))
    except host.RehearsalError as exc:
        print(f"rehearsal: error: {exc}", file=sys.stderr)
        return 1
    return 0


def run(argv: list[str] | None = None) -> int:
    """`main`, its output cut short quietly when the reader closes the pipe (`list | head -1`):
    no BrokenPipeError traceback, the exit status of a tool killed by SIGPIPE (128 + 13)."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(run())
