"""The rehearsal hosts' network: one network namespace and veth pair per host on
10.213.<index>.0/24, and the whole 10.213.0.0/16 range ending on this machine so no rehearsal
traffic ever leaves it. Imports common only.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
from pathlib import Path
from typing import Optional

from .common import RehearsalError, global_lock, require_root, run

SUBNET_PREFIX = "10.213"  # 10.213.<index>.0/24: root side .1, host .2
MAX_INDEX = 254
# The whole range ends on this machine (a no-route entry, `isolate_range`): a host that is
# stopped, rebooting or not booted yet has no /24 of its own, and without it SSH attempts and
# probes to its address would leave through the default route to whatever network owns it.
RANGE = ipaddress.ip_network(f"{SUBNET_PREFIX}.0.0/16")
# Never a host (indexes stop at 254): `isolate_range` checks that it has no route.
NEVER_A_HOST = f"{SUBNET_PREFIX}.255.2"
NO_ROUTE_TYPES = ("blackhole", "unreachable", "prohibit")


def netns_name(name: str) -> str:
    return f"gsr-{name}"


def veth_name(name: str) -> str:
    return f"gsr-{name}"


def subnet(index: int) -> tuple[str, str]:
    """(root-side address, host address) for an instance index."""
    return f"{SUBNET_PREFIX}.{index}.1", f"{SUBNET_PREFIX}.{index}.2"


# --------------------------------------------------------------------------------------
# The range, namespaces and veths


def _netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _link_exists(dev: str, ns: Optional[str] = None) -> bool:
    argv = ["ip"] + (["-n", ns] if ns else []) + ["link", "show", "dev", dev]
    return run(argv, check=False).returncode == 0


def _ip_json(*argv: str) -> list[dict]:
    proc = run(["ip", "-j", *argv])
    text = proc.stdout.decode(errors="replace").strip()
    return json.loads(text) if text else []


def _ours(dev: Optional[str]) -> bool:
    """A rehearsal host's veth (root side): `gsr-<name>`."""
    return bool(dev) and dev.startswith(veth_name(""))


def range_collisions() -> list[str]:
    """What attaches this machine to a network overlapping the rehearsal range, other than the
    hosts' own veths and the range's no-route entry: addresses and routes (every table), as
    text for an error message. The default route is not a collision (the range is carved out of
    it); a no-route entry of any size is not a network."""
    found = []
    for link in _ip_json("-4", "addr", "show"):
        if _ours(link.get("ifname")):
            continue
        for a in link.get("addr_info", []):
            net = ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False)
            if net.overlaps(RANGE):
                found.append(f"address {a['local']}/{a.get('prefixlen', 32)} on {link['ifname']}")
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "default")
        # local/broadcast entries come from an address, listed above already
        if (dst == "default" or r.get("type") in NO_ROUTE_TYPES + ("local", "broadcast")
                or _ours(r.get("dev"))):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.prefixlen and net.overlaps(RANGE):
            how = " ".join(f"{word} {r[k]}" for k, word in (("gateway", "via"), ("dev", "dev"),
                                                             ("table", "table")) if r.get(k))
            found.append(f"route {' '.join(filter(None, [r.get('type'), dst]))} {how}".strip())
    return found


def _has_no_route_entry() -> bool:
    for r in _ip_json("-4", "route", "show", "exact", str(RANGE)):
        if r.get("type") in NO_ROUTE_TYPES:
            return True
    return False


def isolate_range() -> str:
    """Make the rehearsal range end on this machine, idempotently: refuse when the machine is
    attached to a network overlapping it, add an `unreachable` route for the whole range when
    there is no no-route entry yet (an existing blackhole counts), and check that an address of
    the range no host ever has is not routable. The per-host /24 on each veth is more specific
    and keeps working. Returns what it did, for a log line."""
    require_root()
    with global_lock():
        collisions = range_collisions()
        if collisions:
            raise RehearsalError(
                f"the rehearsal hosts' address range {RANGE} overlaps a network this machine is "
                f"attached to ({'; '.join(collisions)}): rehearsal traffic must never leave this "
                "machine, so no rehearsal host starts here. Remove that address or route, or "
                "run the rehearsal on a machine that is not attached to that range")
        done = f"{RANGE} already ends here (no-route entry present)"
        if not _has_no_route_entry():
            run(["ip", "route", "replace", "unreachable", str(RANGE)])
            done = f"added `unreachable {RANGE}`: the rehearsal range ends on this machine"
        probe = run(["ip", "route", "get", NEVER_A_HOST], check=False)
        if probe.returncode == 0:
            raise RehearsalError(
                f"{NEVER_A_HOST} (in the rehearsal range {RANGE}, never a host) is still "
                f"routable ({probe.stdout.decode(errors='replace').strip()}) despite the "
                f"no-route entry: a policy rule (`ip rule`) sends the range elsewhere; "
                "rehearsal traffic must never leave this machine, so no rehearsal host starts")
    return done


def network_up(name: str, index: int) -> None:
    """The host's namespace and veth pair, addressed from its index (idempotent)."""
    ns, veth = netns_name(name), veth_name(name)
    gw, addr = subnet(index)
    if not _netns_exists(ns):
        run(["ip", "netns", "add", ns])
    if not _link_exists("host0", ns):
        if _link_exists(veth):
            run(["ip", "link", "del", veth])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", ns])
    run(["ip", "addr", "replace", f"{gw}/24", "dev", veth])
    run(["ip", "link", "set", veth, "up"])
    run(["ip", "-n", ns, "addr", "replace", f"{addr}/24", "dev", "host0"])
    run(["ip", "-n", ns, "link", "set", "host0", "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    link_to_range(name, index)


def link_to_range(name: str, index: int) -> None:
    """Rehearsal hosts reach each other (a router in front of a fleet, the ranks of a
    multi-node layout), as machines of one cluster do: the host routes the range through this
    machine, whose side of the host's veth forwards. Forwarding is switched on for this veth
    only (the input device decides), so nothing else on this machine starts forwarding, and the
    host has no default route: its traffic stays in the range, whose addresses without a host
    end here (`isolate_range`)."""
    gw, _ = subnet(index)
    run(["ip", "-n", netns_name(name), "route", "replace", str(RANGE), "via", gw, "dev", "host0"])
    Path(f"/proc/sys/net/ipv4/conf/{veth_name(name)}/forwarding").write_text("1\n")


def network_down(name: str) -> None:
    ns, veth = netns_name(name), veth_name(name)
    if _link_exists(veth):
        run(["ip", "link", "del", veth], check=False)
    if _netns_exists(ns):
        run(["ip", "netns", "del", ns], check=False)
        if _netns_exists(ns):  # ip netns del leaves the file if unmount failed
            run(["umount", "-l", f"/run/netns/{ns}"], check=False)
            with contextlib.suppress(OSError):
                os.unlink(f"/run/netns/{ns}")


# --------------------------------------------------------------------------------------
# Reachability


def port_open(addr: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connect to addr:port succeeds within `timeout`."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False
