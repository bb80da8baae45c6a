"""The rehearsal hosts of a benchmark run: booting them, counting the SSH connections and
sessions each tool opens (from the host's own sshd log, read from outside so that counting
opens nothing), and checking that a tool left the host in the declared state."""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from rehearsal import host as rh

# sshd at VERBOSE logs one "Starting session: command|subsystem 'sftp'|shell ..." line per
# channel that runs something, so the log counts commands as well as connections.
SSHD_DROPIN = "/etc/ssh/sshd_config.d/20-bench.conf"


@dataclass
class Host:
    info: rh.HostInfo

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def journal(self) -> Path:
        return Path(self.info.instance_dir) / "merged" / "var" / "log" / "journal"

    def sh(self, command: str, timeout: float = 120, check: bool = True) -> str:
        out = self.info.run(command, timeout=timeout, check=check)
        return out.stdout

    def sshd_lines(self, after: Optional[str]) -> tuple[list[str], Optional[str]]:
        """sshd's log lines after the cursor `after` (all when None), and the new last cursor."""
        argv = ["journalctl", "-D", str(self.journal), "-t", "sshd", "--no-pager", "-o", "cat", "--show-cursor"]
        if after:
            argv.append(f"--after-cursor={after}")
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        lines, cursor = [], after
        for line in out.splitlines():
            if line.startswith("-- cursor: "):
                cursor = line[len("-- cursor: "):].strip()
            else:
                lines.append(line)
        return lines, cursor


def count(lines: list[str]) -> tuple[int, int]:
    """(connections, sessions) in sshd log lines."""
    return (sum("Accepted publickey" in ln for ln in lines), sum("Starting session:" in ln for ln in lines))


class Counter:
    """Connections and sessions opened on a set of hosts between start() and stop()."""

    def __init__(self, hosts: list[Host]):
        self.hosts = hosts
        self.cursors: dict[str, Optional[str]] = {}

    def start(self) -> None:
        for h in self.hosts:
            _, self.cursors[h.name] = h.sshd_lines(None) if h.name not in self.cursors else h.sshd_lines(self.cursors[h.name])

    def stop(self) -> tuple[int, int]:
        time.sleep(0.3)  # journald takes sshd's last datagrams
        conns = sessions = 0
        for h in self.hosts:
            lines, self.cursors[h.name] = h.sshd_lines(self.cursors.get(h.name))
            c, s = count(lines)
            conns, sessions = conns + c, sessions + s
        return conns, sessions


def boot(names: list[str], log: Callable[[str], None], fresh: bool = True) -> list[Host]:
    """Boot the hosts; `fresh`: remove what an earlier run left on them first."""
    hosts = []
    for name in names:
        if fresh:
            rh.down(name)
        info = rh.up(name)
        hosts.append(Host(info))
    # Log every command sshd starts (counted per run), then let sshd re-read its config.
    parallel(hosts, lambda h: h.sh(f"grep -qx 'LogLevel VERBOSE' {SSHD_DROPIN} 2>/dev/null || "
                                   f"{{ echo 'LogLevel VERBOSE' > {SSHD_DROPIN} && systemctl reload ssh; }}"))
    log(f"hosts up: {', '.join(f'{h.name} ({h.info.address})' for h in hosts)}")
    return hosts


def parallel(hosts: list[Host], fn: Callable[[Host], object]) -> list:
    with cf.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as ex:
        return list(ex.map(fn, hosts))


def serve(h: Host, unit: str, port: int, units: list[str], timeout: float = 60) -> None:
    """Start `unit` (Conflicts= stops the sibling) and wait until it generates: the starting
    point of a switch, set the same way for every tool. The units' start-rate counters are reset
    first (StartLimitBurst counts deliberate starts too; a benchmark starts them often); a start
    lost to the container's cgroup race is tried again."""
    h.sh(f"""for attempt in 1 2 3; do
  systemctl reset-failed {' '.join(units)} 2>/dev/null
  systemctl start {unit} || continue
  for i in $(seq {int(timeout * 5)}); do
    [ "$(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health_generate)" = 200 ] && exit 0
    systemctl is-failed --quiet {unit} && break
    sleep 0.2
  done
done
echo '{unit} did not become ready' >&2; exit 1""", timeout=3 * timeout + 30)


# What the journal of a rehearsal host's unit says when systemd-nspawn's cgroup v1 hierarchy lost
# a race (now and then, when a unit starts while its sibling stops): the new unit fails with
# 219/CGROUP, or systemd cannot signal the old one through its cgroup, so the stop waits out
# TimeoutStopSec (90 s) before the start can come. Neither is the tool's doing.
CGROUP_FLAKES = ("status=219/CGROUP", "Failed to kill control group")


def cgroup_flake(h: Host, units: list[str], since: float) -> bool:
    """Did a unit lose the rehearsal host's cgroup race since `since` (CGROUP_FLAKES)?"""
    out = h.sh(f"journalctl --since @{int(since) - 1} --no-pager -o cat " + " ".join(f"-u {u}" for u in units), check=False)
    return any(mark in out for mark in CGROUP_FLAKES)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


STATE_SCRIPT = r"""
for f in "$@"; do
  if [ -e "$f" ]; then echo "file $f $(sha256sum "$f" | cut -c1-64) $(stat -c %a "$f")"; else echo "file $f absent -"; fi
done
for u in $UNITS; do
  echo "unit $u $(systemctl is-active $u) $(systemctl is-enabled $u 2>/dev/null || echo -) $(systemctl show -p NeedDaemonReload --value $u)"
done
echo "health $(curl -s -o /dev/null -w '%{http_code}' --max-time 30 http://127.0.0.1:$PORT/health_generate)"
echo "info $(curl -s --max-time 30 http://127.0.0.1:$PORT/server_info | tr -d '\n' \
  | grep -o '"\(tp\|ep\|pp\)_size": *[0-9]*' | tr -d ' "' | tr '\n' ' ')"
"""


def parse_state(text: str) -> dict:
    files, units, health, info = {}, {}, None, {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "file" and len(parts) == 4:
            files[parts[1]] = {"sha256": None if parts[2] == "absent" else parts[2],
                               "mode": None if parts[3] == "-" else parts[3]}
        elif parts[0] == "unit" and len(parts) >= 4:
            units[parts[1]] = {"active": parts[2], "enabled": parts[3], "need_reload": parts[4] if len(parts) > 4 else ""}
        elif parts[0] == "health":
            health = parts[1] if len(parts) > 1 else None
        elif parts[0] == "info":
            for kv in parts[1:]:
                k, _, v = kv.partition(":")
                if v.isdigit():
                    info[k] = int(v)
    return {"files": files, "units": units, "health": health, "server": info}


def expected_problems(state: dict, plans: dict[str, dict], serving: str) -> list[str]:
    """What differs between a host's state and the state `serving` declared (its unit file,
    the shared environment file 0600, every other strategy's unit file as rendered, only
    `serving` active and enabled, systemd reloaded, generating, in the declared layout)."""
    p = plans[serving]
    problems = []
    env = state["files"].get(p["environment_path"], {})
    if env.get("sha256") != sha256(p["environment_text"]):
        problems.append(f"{p['environment_path']} is not the rendered environment")
    if env.get("mode") != "600":
        problems.append(f"{p['environment_path']} has mode {env.get('mode')}, not 600")
    for stack, q in plans.items():
        path = f"/etc/systemd/system/{q['unit_name']}"
        f = state["files"].get(path, {})
        if stack == serving or f.get("sha256"):
            if f.get("sha256") != sha256(q["unit_text"]):
                problems.append(f"{path} is not the rendered {stack} unit")
            elif f.get("mode") != "644":
                problems.append(f"{path} has mode {f.get('mode')}")
    for stack, q in plans.items():
        u = state["units"].get(q["unit_name"], {})
        want = "active" if stack == serving else "inactive"
        if u.get("active") != want and not (want == "inactive" and u.get("active") in ("inactive", "failed", None)):
            problems.append(f"{q['unit_name']} is {u.get('active')}, expected {want}")
        if stack == serving:
            if u.get("enabled") != "enabled":
                problems.append(f"{q['unit_name']} is {u.get('enabled')}, not enabled")
            if u.get("need_reload") != "no":
                problems.append(f"{q['unit_name']}: systemd was not reloaded after the unit changed")
        elif u.get("enabled") == "enabled":
            problems.append(f"{q['unit_name']} is enabled: only the serving strategy should be")
    if state["health"] != "200":
        problems.append(f"/health_generate answers {state['health']}")
    layout = p["layout"]
    for key in ("tp_size", "pp_size", "ep_size"):
        if state["server"].get(key) != layout[key]:
            problems.append(f"the server runs {key}={state['server'].get(key)}, declared {layout[key]}")
    return problems


def host_state(h: Host, plans: dict[str, dict]) -> dict:
    any_plan = next(iter(plans.values()))
    files = [any_plan["environment_path"], *(f"/etc/systemd/system/{p['unit_name']}" for p in plans.values())]
    units = " ".join(p["unit_name"] for p in plans.values())
    out = h.info.run(f"UNITS='{units}' PORT={int(any_plan['port'])} sh -s -- " + " ".join(files), input=STATE_SCRIPT,
                     timeout=90)
    return parse_state(out.stdout)
