"""Rehearsal traffic never leaves this machine (issue 13, first point).

A host that is stopped, rebooting or not booted yet has no /24 route of its own; without a
no-route entry for the whole range (10.213.0.0/16), SSH attempts and probes to its address
would go out through the default route. `scripts/install-host-deps` and `rehearsal up` add that
entry (idempotently) and refuse a machine attached to a network overlapping the range.

The real machine's entry is never removed here: the "missing" and "colliding" cases run in a
scratch network namespace of their own whose default route leads to a veth (so its leak would
go nowhere), entered with `nsenter --net` only (same mounts, same instances, same lock)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rehearsal import host, machine, network

pytestmark = pytest.mark.rehearsal

REPO = Path(__file__).resolve().parents[2]
# Seconds: the documented promise (docs/guarantees.md, section 0: "fail at once, locally
# (< 0.5 s)"): a local refusal, not a timeout (ssh's own start is counted apart). The kernel's
# route lookup answers a connect to the range's `unreachable` route with EHOSTUNREACH ("No route
# to host", no packet sent) in microseconds: 12-22 us for a TCP connect, 1.6 ms for a process's
# first HTTP GET through urllib (its opener built), measured here. So 0.5 s is over 300 times room
# for a loaded machine, and a probe whose packets left the machine would wait out its 5 s timeout.
AT_ONCE = 0.5


def unused_address() -> str:
    """An address of the range that no instance has (10.213.250.2 unless one took index 250)."""
    used = set(machine._used_indexes(""))
    index = next(i for i in range(250, network.MAX_INDEX + 1) if i not in used)
    return network.subnet(index)[1]


def route_get(address: str, netns: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *(["-n", netns] if netns else []), "route", "get", address],
                          capture_output=True, text=True, timeout=10)


def probes_fail_at_once(address: str) -> list[str]:
    """TCP connect to port 22 and an HTTP GET on the serving port: both must fail locally
    (an error at once, not a timeout, not an answer). Returns the errors seen."""
    errors = []
    t0 = time.monotonic()
    with pytest.raises(OSError) as tcp:
        socket.create_connection((address, 22), timeout=5).close()
    took = time.monotonic() - t0
    assert took < AT_ONCE and not isinstance(tcp.value, socket.timeout), (took, tcp.value)
    errors.append(str(tcp.value))
    t0 = time.monotonic()
    with pytest.raises(OSError) as http:
        urllib.request.urlopen(f"http://{address}:30000/health", timeout=5)
    took = time.monotonic() - t0
    assert took < AT_ONCE and "timed out" not in str(http.value), (took, http.value)
    errors.append(str(http.value))
    return errors


PROBE_SCRIPT = """
import json, socket, sys, time, urllib.request
out = []
for kind in ("tcp", "http"):
    t0 = time.monotonic()
    try:
        if kind == "tcp":
            socket.create_connection((sys.argv[1], 22), timeout=5).close()
        else:
            urllib.request.urlopen("http://" + sys.argv[1] + ":30000/health", timeout=5)
        out.append([kind, "answered", time.monotonic() - t0])
    except OSError as exc:
        out.append([kind, str(exc), time.monotonic() - t0])
print(json.dumps(out))
"""


def probes_in(netns: str, address: str) -> list:
    proc = in_netns(netns, "python3", "-c", PROBE_SCRIPT, address)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def in_netns(netns: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run argv in the network namespace `netns` only (mounts and /proc stay this machine's)."""
    return subprocess.run(["nsenter", f"--net=/run/netns/{netns}", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def no_route_entries(netns: str | None = None) -> list[str]:
    out = subprocess.run(["ip", *(["-n", netns] if netns else []), "-4", "route", "show",
                          "exact", str(network.RANGE)], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in network.NO_ROUTE_TYPES]


@pytest.fixture
def scratch_netns():
    """A network namespace that looks like a machine with a default route and no no-route
    entry: `ip route get` of the range goes "via 192.0.2.1" (into a veth whose peer is in the
    same namespace, so nothing it sends gets anywhere)."""
    ns = f"ptiso{os.getpid()}"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    steps = [["netns", "add", ns],
             ["-n", ns, "link", "set", "lo", "up"],
             ["-n", ns, "link", "add", "up0", "type", "veth", "peer", "name", "up1"],
             ["-n", ns, "addr", "add", "192.0.2.50/24", "dev", "up0"],
             ["-n", ns, "link", "set", "up0", "up"],
             ["-n", ns, "link", "set", "up1", "up"],
             ["-n", ns, "route", "add", "default", "via", "192.0.2.1"]]
    try:
        for step in steps:
            subprocess.run(["ip", *step], check=True, capture_output=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---------------------------------------------------------------------------------------------


def test_an_address_with_no_host_is_not_routable_and_a_running_host_is(rehearsal_host):
    """On this machine, with a rehearsal host running: an address of the range with no host has
    no route and probes to it fail at once; the running host answers through its own /24."""
    for address in (unused_address(), network.NEVER_A_HOST):
        got = route_get(address)
        assert got.returncode != 0, f"{address} is routable: {got.stdout}"
        probes_fail_at_once(address)
        t0 = time.monotonic()
        ssh = subprocess.run([*rehearsal_host.ssh_args()[:-1], f"root@{address}", "true"],
                             capture_output=True, text=True, timeout=30)
        assert ssh.returncode == 255 and time.monotonic() - t0 < 5, ssh
    assert no_route_entries(), "no blackhole/unreachable entry for the range"
    via = route_get(rehearsal_host.address)
    assert via.returncode == 0 and f"dev {rehearsal_host.veth} " in via.stdout, via.stdout
    assert network.port_open(rehearsal_host.address, 22)
    assert rehearsal_host.run("true").returncode == 0


def test_install_host_deps_and_up_add_the_no_route_entry_where_it_is_missing(scratch_netns):
    ns = scratch_netns
    probe = unused_address()
    leak = route_get(probe, ns)
    assert leak.returncode == 0 and "via 192.0.2.1" in leak.stdout, leak  # what it closes

    first = in_netns(ns, "bash", "scripts/install-host-deps")
    assert first.returncode == 0, first.stderr
    assert "added `unreachable 10.213.0.0/16`" in first.stdout, first.stdout
    assert len(no_route_entries(ns)) == 1
    assert route_get(probe, ns).returncode != 0
    again = in_netns(ns, "bash", "scripts/install-host-deps")
    assert again.returncode == 0 and "already ends here" in again.stdout, again
    assert len(no_route_entries(ns)) == 1
    for kind, error, took in probes_in(ns, probe):
        assert error != "answered" and took < AT_ONCE and "timed out" not in error, (kind, error, took)

    # Without it again: `rehearsal up` adds it, and the host it boots is reachable through its
    # own /24 while the rest of the range stays unroutable.
    subprocess.run(["ip", "-n", ns, "route", "del", str(network.RANGE)], check=True)
    assert route_get(probe, ns).returncode == 0
    name = f"pt{os.getpid()}-n"
    try:
        up = in_netns(ns, "python3", "-m", "rehearsal", "up", name, "--json")
        assert up.returncode == 0, up.stderr
        assert len(no_route_entries(ns)) == 1
        info = host.status(name)
        assert info.state == "running"
        assert route_get(probe, ns).returncode != 0
        via = route_get(info.address, ns)
        assert via.returncode == 0 and f"dev {info.veth} " in via.stdout, via.stdout
        ssh = in_netns(ns, *info.ssh_args(), "hostname", timeout=60)
        assert ssh.returncode == 0 and ssh.stdout.strip() == name, ssh
        for kind, error, took in probes_in(ns, probe):
            assert error != "answered" and took < AT_ONCE, (kind, error, took)
        # The host's /24 is not in this machine's main namespace: there, it is unroutable too.
        assert route_get(info.address).returncode != 0
    finally:
        down = in_netns(ns, "python3", "-m", "rehearsal", "down", name)
    assert down.returncode == 0, down.stderr
    assert host.status(name).state == "absent"


def test_a_machine_attached_to_the_range_is_refused_with_a_clear_message(scratch_netns):
    ns = scratch_netns
    subprocess.run(["ip", "-n", ns, "addr", "add", "10.213.77.5/24", "dev", "up1"], check=True)
    subprocess.run(["ip", "-n", ns, "route", "add", "10.0.0.0/8", "via", "192.0.2.1"], check=True)

    isolate = in_netns(ns, "python3", "-m", "rehearsal", "isolate")
    assert isolate.returncode == 1
    message = isolate.stderr
    assert "10.213.0.0/16 overlaps a network this machine is attached to" in message, message
    assert "address 10.213.77.5/24 on up1" in message and "route 10.0.0.0/8 via 192.0.2.1" in message
    assert "Traceback" not in message
    assert no_route_entries(ns) == []

    # install-host-deps says so but does not fail (deploying to real hosts works there) ...
    deps = in_netns(ns, "bash", "scripts/install-host-deps")
    assert deps.returncode == 0 and "no rehearsal host can start on this machine" in deps.stderr
    # ... and `up` refuses before it creates anything.
    name = f"pt{os.getpid()}-m"
    up = in_netns(ns, "python3", "-m", "rehearsal", "up", name)
    assert up.returncode == 1 and "overlaps a network this machine is attached to" in up.stderr
    assert host.status(name).state == "absent" and not host.instance_dir(name).exists()

    # Only the collision is refused: remove it and the same namespace is accepted.
    subprocess.run(["ip", "-n", ns, "addr", "del", "10.213.77.5/24", "dev", "up1"], check=True)
    subprocess.run(["ip", "-n", ns, "route", "del", "10.0.0.0/8"], check=True)
    assert in_netns(ns, "python3", "-m", "rehearsal", "isolate").returncode == 0
    assert len(no_route_entries(ns)) == 1


def test_own_veths_and_the_no_route_entry_are_not_collisions(rehearsal_host):
    """The running host's veth address and /24, and the range's entry, are ours."""
    assert network.range_collisions() == []


def test_rehearsal_hosts_reach_each_other_and_nothing_else(rehearsal_host, rehearsal_host_factory):
    """A router in front of a fleet and the ranks of a multi-node layout talk host to host: a
    host reaches another's sshd through this machine; an address of the range with no host fails
    from inside a host too (it ends on this machine); only the hosts' own veths forward (the machine-wide switch
    is left as it was), and a host has no default route."""
    before = Path("/proc/sys/net/ipv4/conf/all/forwarding").read_text()
    other = rehearsal_host_factory()
    a = rehearsal_host
    inside = ["ip", "netns", "exec", network.netns_name(a.name)]
    reach = subprocess.run([*inside, "bash", "-c", f"exec 3<>/dev/tcp/{other.address}/22 && head -c 4 <&3"],
                           capture_output=True, text=True, timeout=20)
    assert reach.returncode == 0 and reach.stdout == "SSH-", reach
    # No host there: the packet ends on this machine's no-route entry (an `unreachable` one
    # answers at once, a `blackhole` drops it: then the connect times out), never beyond.
    lost = subprocess.run([*inside, "timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{unused_address()}/22"],
                          capture_output=True, text=True, timeout=20)
    assert lost.returncode != 0, lost
    assert no_route_entries() and route_get(unused_address()).returncode != 0
    assert "default" not in subprocess.run([*inside, "ip", "route"], capture_output=True, text=True).stdout
    for h in (a, other):
        assert Path(f"/proc/sys/net/ipv4/conf/{network.veth_name(h.name)}/forwarding").read_text().strip() == "1"
    assert Path("/proc/sys/net/ipv4/conf/all/forwarding").read_text() == before
