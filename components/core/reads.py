"""The read requests the providers make, as plain data: what to ask the host, not how to ask it.

Each provider's read is two halves: *build the request* (here: pure functions of the resource's
props, importable without paramiko) and *run it* (`ssh.fetch`). The program uses the same
builders to tell the provider process, in advance, which reads the later resources of a refresh
will make (`refresh_reads` below), so that the host-facts resource can start
them all at once on the connection it opens (`ssh.prefetch`), and the two can never disagree.

A request is a dict:

- ``{"op": "run", "argv": [...], "purpose": str, "timeout": seconds, "check": bool}``: a
  read-only command (an argv list; a script is one of the constant scripts below or of
  facts/cuda/venv, with the values as its arguments);
- ``{"op": "read_file", "path": p}``: the file's bytes (None when it does not exist), by SFTP;
- ``{"op": "stat_mode", "path": p}``: its permission bits (None when it does not exist);
- ``{"op": "stat_owner", "path": p}``: its owner, "uid:gid" (None when it does not exist).

What the program hands to the provider is a list of *specs*, ``{"kind": ..., "props": {...}}``
(a resource kind of `BUILDERS` and the props its builder needs): the provider process turns them
into requests with `expand`, so no command text ever travels through the state.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from . import cuda, fitness_read, status, venv
from .facts import ENVIRONMENT_SHOW_OPTIONS, FACTS_SCRIPT, SHOW_OPTIONS, UNIT_PROPERTIES, show_options
from .unit import MANAGED_UNITS_GREP, UNIT_DIR

if TYPE_CHECKING:
    from .plan import ServingPlan

# Timeout of the installers' read-only probes (cuda toolkit, venv, wheelhouse digests).
PROBE_TIMEOUT = 120

# What every unit read asks systemctl (facts.UNIT_PROPERTIES); the names of before, kept for
# their importers.
UNIT_PROPS = SERVICE_PROPS = list(UNIT_PROPERTIES)

# $1 unit, $2 probe address, $3 port, $4 generation timeout, $5 start time (epoch seconds; "-": do
# not read the journal, e.g. on refresh, where a busy server's day of logs would be scanned)
POLL_SCRIPT = r"""
systemctl show """ + SHOW_OPTIONS + r""" -- "$1"
echo @@health
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time "$4" "http://$2:$3/health_generate"); echo "$code $?"
echo @@ready
if [ "$5" = - ]; then echo 0; else
journalctl -u "$1" --since "@$5" -q --no-pager -o cat 2>/dev/null | grep -c 'The server is fired up and ready to roll' || true
fi
"""

# $1 probe address, $2 port
INFO_SCRIPT = r"""
echo @@server_info
curl -s -w '\n%{http_code}' --max-time 10 "http://$1:$2/server_info"
echo; echo @@get_server_info
curl -s -w '\n%{http_code}' --max-time 10 "http://$1:$2/get_server_info"
echo; echo @@models
curl -s -w '\n%{http_code}' --max-time 10 "http://$1:$2/v1/models"
echo
"""

# A poll that waits on the host: for up to $6 seconds it asks /health_generate every 0.2 s (each
# ask bounded by 2 s; the report's own ask below has the whole generation timeout) and stops as
# soon as the server gives a signal: it generates, the unit is no longer running, the port opened
# or closed since the caller's last look ($8: "closed" or "open"; empty: not known), or the
# server logged its ready line ($9 = 0: not seen yet; read from the journal only once the port is
# open). Then it reports like POLL_SCRIPT (the unit's state, the health, the ready line). When it
# generates and $7 (settle seconds) is set, it waits $7 on the host and reports again after
# "@@settled" (ready must last), then what it runs (INFO_SCRIPT). So the moment the server is
# ready is seen within 0.2 s, not a poll interval later, and the settle costs no round trip.
# $1..$5 as POLL_SCRIPT.
#
# The clock is /proc/uptime (monotonic, read with the shell's own `read`, in hundredths of a second
# once its dot is dropped): the loop starts no process of its own to look at the time, where it
# started two (`date`, `awk`) every 0.2 s while a server loads (docs/benchmarks.md, eleventh round).
SNAPSHOT_SCRIPT = r"""
read up _ < /proc/uptime
end=$(awk -v w="$6" -v up="$up" 'BEGIN { printf "%d", (up + w) * 100 }')
while read up _ < /proc/uptime && [ "${up%.*}${up#*.}" -lt "$end" ]; do
  c=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$2:$3/health_generate")
  [ "$c" = 200 ] && break
  case "$(systemctl show -p ActiveState --value -- "$1")" in active|activating|reloading) ;; *) break ;; esac
  if [ "$c" = 000 ]; then port=closed; else port=open; fi
  [ -n "$8" ] && [ "$port" != "$8" ] && break
  if [ "$port" = open ] && [ "$9" = 0 ] && [ "$5" != - ] && journalctl -u "$1" --since "@$5" -q --no-pager -o cat 2>/dev/null \
       | grep -q 'The server is fired up and ready to roll'; then break; fi
  sleep 0.2
done
""" + POLL_SCRIPT + r"""
if [ "$code" = 200 ] && [ "${7:-0}" != 0 ]; then
  sleep "$7"
  echo @@settled
""" + POLL_SCRIPT + r"""
fi
if [ "$code" = 200 ]; then set -- "$2" "$3"
""" + INFO_SCRIPT + r"""
fi
"""

# $1 unit: its state (UNIT_PROPERTIES, as `unit_states`), then what its main process runs, taken
# from the same MainPID: /proc/<pid>/cmdline and /proc/<pid>/environ (NUL-separated, so base64),
# the service manager's own environment (what systemd gives every service), the environment
# systemd holds for the unit and the part of it its file sets, each drop-in's text (dropins.py),
# and the other gpu-serving units that are enabled (a reboot would start them too: only one may be).
SERVICE_SCRIPT = r"""
show=$(systemctl show """ + SHOW_OPTIONS + r""" -- "$1") || exit $?
printf '%s\n' "$show"
pid=$(printf '%s\n' "$show" | sed -n 's/^MainPID=//p')
echo @@cmdline
if [ "${pid:-0}" -gt 0 ] 2>/dev/null; then base64 -w0 "/proc/$pid/cmdline" 2>/dev/null; fi; echo
echo @@environ
if [ "${pid:-0}" -gt 0 ] 2>/dev/null; then base64 -w0 "/proc/$pid/environ" 2>/dev/null; fi; echo
echo @@manager
systemctl show-environment 2>/dev/null || true
echo @@unit-environment
systemctl show """ + ENVIRONMENT_SHOW_OPTIONS + r""" -- "$1" 2>/dev/null
echo @@unit-file-environment
grep -E '^(Environment|EnvironmentFile|UnsetEnvironment|PassEnvironment)=' -- '""" + UNIT_DIR + r"""'/"$1" 2>/dev/null
for p in $(printf '%s\n' "$show" | sed -n 's/^DropInPaths=//p'); do echo "@@drop-in $p"; head -c 16384 -- "$p" 2>/dev/null; echo; done
echo @@others-enabled
cd """ + UNIT_DIR + r""" 2>/dev/null || exit 0
for f in $(""" + MANAGED_UNITS_GREP + r"""); do
  [ "$f" = "$1" ] || [ "$(systemctl is-enabled -- "$f" 2>/dev/null)" != enabled ] || echo "$f"
done
exit 0
"""

# Generation timeout of the readiness read on refresh (seconds).
REFRESH_GENERATION_TIMEOUT = 60


def probe_address(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind


def command(argv: list[str], *, purpose: str, timeout: float, check: bool, reuse: bool = False) -> dict[str, Any]:
    """`reuse`: a snapshot several providers read in one run; the transport serves its first
    answer again until the host changes (components/remote/readcache.py)."""
    out = {"op": "run", "argv": [str(a) for a in argv], "purpose": purpose, "timeout": timeout, "check": check}
    return {**out, "reuse": True} if reuse else out


def file_read(path: str) -> dict[str, Any]:
    return {"op": "read_file", "path": str(path)}


def file_mode(path: str) -> dict[str, Any]:
    return {"op": "stat_mode", "path": str(path)}


def file_owner(path: str) -> dict[str, Any]:
    return {"op": "stat_owner", "path": str(path)}


# --- the requests, by what they read --------------------------------------------------------

def unit_states(units: list[str]) -> dict[str, Any]:
    """`systemctl show` of the unit properties for `units` (blocks in argument order)."""
    return command(["systemctl", "show", *show_options(), "--", *units],
                   purpose="reading unit states", timeout=30, check=True)


def snapshot(unit: str, address: str, port: int, gen_timeout: float, since: Optional[int], wait: float = 0.0,
             settle: float = 0.0, seen_port: str = "", seen_ready: bool = False) -> dict[str, Any]:
    """One readiness poll (probe.SNAPSHOT_SCRIPT): the unit's state, the health and, when it
    generates, what it runs. `since` None: the journal is not read; `wait`: seconds the host may
    wait for a signal of the server first (`seen_port`: "closed"/"open" as the caller last saw it,
    `seen_ready`: the caller saw its ready line); `settle`: seconds it must still generate after
    its first answer, looked at again on the host."""
    return command(["sh", "-c", SNAPSHOT_SCRIPT, "sh", unit, address, str(int(port)), str(int(gen_timeout)),
                    "-" if since is None else str(since), f"{max(0.0, wait):.1f}", f"{max(0.0, settle):g}", seen_port,
                    "1" if seen_ready else "0"],
                   purpose=f"probing {unit}", timeout=gen_timeout * (2 if settle else 1) + wait + settle + 60, check=False)


# --- what each resource's read makes, from its props ----------------------------------------

def host_facts(props: dict[str, Any]) -> list[dict[str, Any]]:
    """HostFactsProvider: GPUs, driver, CUDA, interconnect and OS in one command."""
    return [command(["sh", "-c", FACTS_SCRIPT, "sh", props["cudaHome"]], purpose="reading host facts", timeout=60,
                    check=False)]


def cuda_toolkit(props: dict[str, Any]) -> list[dict[str, Any]]:
    """CudaToolkitProvider: nvcc, the package, its owner, the OS, in one command."""
    package = props["aptPackage"].split("=", 1)[0]
    return [command(["sh", "-c", cuda.PROBE_SCRIPT, "sh", props["home"], package], purpose="checking the CUDA toolkit",
                    timeout=PROBE_TIMEOUT, check=False)]


def python_venv(props: dict[str, Any]) -> list[dict[str, Any]]:
    """PythonVenvProvider: the venv's python version and installed distributions."""
    path = props["path"]
    return [command(["sh", "-c", venv.PROBE_SCRIPT, "sh", path], purpose=f"checking the venv {path}",
                    timeout=PROBE_TIMEOUT, check=False)]


def remote_file(props: dict[str, Any]) -> list[dict[str, Any]]:
    """RemoteFileProvider: the file's bytes, its mode, its owner."""
    return [file_read(props["path"]), file_mode(props["path"]), file_owner(props["path"])]


def service(props: dict[str, Any]) -> list[dict[str, Any]]:
    """ServiceProvider: the unit's state and what its main process runs (SERVICE_SCRIPT)."""
    return [command(["sh", "-c", SERVICE_SCRIPT, "sh", props["unit"]], purpose=f"reading the state of {props['unit']}",
                    timeout=30, check=True)]


# $1 unit, $2 the line a rank logs once it joined the world: the unit's state, then how often its
# current run (its InvocationID: the journal of this start only, however long ago) logged the line.
RANK_SCRIPT = r"""
systemctl show """ + SHOW_OPTIONS + r""" -- "$1"
echo @@joined
id=$(systemctl show -p InvocationID --value -- "$1" 2>/dev/null)
if [ -z "$id" ]; then echo 0; exit 0; fi
n=$(journalctl -q --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$id" 2>/dev/null | grep -c -F -- "$2")
echo "${n:-0}"
"""


def rank(unit: str, line: str) -> dict[str, Any]:
    """A rank >= 1 of a multi-node layout: its unit's state and whether its current run joined
    rank 0 (RANK_SCRIPT), for a switch's wait and for `status`."""
    return command(["sh", "-c", RANK_SCRIPT, "sh", unit, line], purpose=f"reading whether {unit} joined rank 0",
                   timeout=60, check=False)


def readiness(props: dict[str, Any]) -> list[dict[str, Any]]:
    """ReadinessProvider: one poll without waiting and without the journal."""
    return [snapshot(props["unit"], probe_address(props["bind"]), int(props["port"]), REFRESH_GENERATION_TIMEOUT, None)]


def fitness(always: bool = False) -> dict[str, Any]:
    """The host's fitness baseline and, when it has one (or `always`), its GPUs' fitness now
    (fitness_read.FITNESS_SCRIPT): the switch's readiness.fitness check, status, compare, advise."""
    return command(["sh", "-c", fitness_read.FITNESS_SCRIPT, "sh", "always" if always else "if-baseline"],
                   purpose="reading the GPUs' fitness", timeout=60, check=False)


def serving(with_environ: bool = False) -> dict[str, Any]:
    """What serves on the host (status.SERVING_SCRIPT): every gpu-serving unit, its stack, state and
    main process; `with_environ`: the processes' environments too (compared, never shown)."""
    return command(["sh", "-c", status.SERVING_SCRIPT, "sh", "environ" if with_environ else "-"],
                   purpose="reading what serves", timeout=60, check=True, reuse=True)


BUILDERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "host-facts": host_facts,
    "cuda-toolkit": cuda_toolkit,
    "venv-packages": python_venv,
    "file": remote_file,
    "service": service,
    "readiness": readiness,
}


def spec(kind: str, props: dict[str, Any]) -> dict[str, Any]:
    """What the program tells the provider: the kind of resource and the props its read uses."""
    if kind not in BUILDERS:
        raise ValueError(f"no read builder for {kind!r}")
    return {"kind": kind, "props": dict(props)}


def expand(specs: Any) -> list[dict[str, Any]]:
    """The requests of a list of specs. Anything that is not a well-formed spec (a state written
    by another version, say) is skipped: a prefetch is an optimisation, never a reason to fail."""
    out: list[dict[str, Any]] = []
    for s in specs if isinstance(specs, list) else []:
        if not isinstance(s, dict) or s.get("kind") not in BUILDERS or not isinstance(s.get("props"), dict):
            continue
        props = s["props"]
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in props.values()):
            continue
        try:
            out += BUILDERS[s["kind"]](props)
        except (KeyError, TypeError, ValueError):
            continue
    return out


# --- which reads a refresh of one host makes after its host facts ---------------------------

def refresh_reads(plan: ServingPlan) -> list[dict[str, Any]]:
    """The reads of the CUDA toolkit, the venv, the environment and unit files, the service and
    readiness, in the order a refresh reaches them, for the host `plan.settings` describes.

    The program passes this list to the host-facts resource (its `prefetch` prop): the provider
    process starts these reads at once, on the connection it opens for the host facts, instead
    of the engine waiting for them one dependent resource after the other
    (components/remote/readcache.py says what is served and when it is not). Each entry is the
    kind of a resource and the very props the program gives that resource, which its provider
    turns into the request with the same builder (`BUILDERS`), so the two cannot disagree
    (tests/test_prefetch.py checks it against what the program registers). Plain data: paths,
    unit names, a port; no connection, no secret."""
    s = plan.settings
    unit = plan.unit.name
    return [
        spec("cuda-toolkit", {"home": s.cuda.home, "aptPackage": s.cuda.apt_package}),
        spec("venv-packages", {"path": s.venv.path}),
        spec("file", {"path": plan.unit.environment_path}),
        spec("file", {"path": f"{UNIT_DIR}/{unit}"}),
        spec("service", {"unit": unit}),
        spec("readiness", {"unit": unit, "bind": s.serving.host, "port": s.serving.port}),
    ]
