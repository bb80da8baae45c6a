"""SGLang's router in front of a fleet: its pinned packages, its systemd unit, what its admin API
answers, and the rolling switch as a plan. Pure (data in, text or decisions out; cases under
tests/data/router/); components/remote/router.py talks to the router and the hosts.

The router is the Shepherd Model Gateway, PyPI ``smg`` (the successor of ``sglang-router``): a
Rust binary in a manylinux wheel, started as ``<venv>/bin/smg launch``. Facts used here, read
from the installed 1.13.0 (``smg launch --help``, and its admin API on loopback):
- ``--worker-urls`` at start; at run time ``POST /workers {"url": ...}`` (202, queued),
  ``DELETE /workers/{id}`` (202; the worker shows ``status: draining`` until it is gone) and
  ``GET /workers`` (``{"workers": [{id, url, status, is_healthy, load, labels{tp_size, pp_size,
  dp_size, enable_dp_attention, ...}}], "total": N}``), all behind ``Authorization: Bearer KEY``
  once ``--control-plane-api-keys 'id:name:admin:KEY'`` is given;
- ``/readiness`` (200 with a healthy worker, 503 otherwise), ``/health``;
- a Prometheus endpoint, ``0.0.0.0:29000`` unless ``--prometheus-host/--prometheus-port``.
Its per-worker ``load`` drops to 0 as soon as a worker is removed, with requests still streaming:
a removed host is drained by reading the server's own ``sglang:num_running_reqs``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from . import server_metrics
from .errors import ConfigError, SettingError, shown
from .rules import NAMESPACE, ROUTER_KEY
from .unit import UNIT_DIR

if TYPE_CHECKING:  # the provider's process imports this module, and never the settings models
    from .config import StackSettings

PINS_DIR = Path(__file__).parent / "data" / "router"
# The smg key entry: id and name are ours, the role is admin (it may add and remove workers).
KEY_ID = "gpu-serving"
# The variable of the router's 0600 environment file that holds the key entry; ExecStart reads
# it as ${...} (one word), so the key is never in the world-readable unit file.
KEY_VARIABLE = "GPU_SERVING_ROUTER_KEYS"
ENVIRONMENT_DIR = "/etc/gpu-serving"
# Marks the router's unit (not X-GpuServing-Stack: a switch stops every unit carrying that one).
MARKER_KEY = "X-GpuServing-Router"
_PLAIN = re.compile(r"\A[A-Za-z0-9_./:,+@=\[\]-]+\Z", re.ASCII)


def pins(version: str) -> list[str]:
    """The pinned wheel set of smg `version` (components/core/data/router/smg-<version>.txt)."""
    path = PINS_DIR / f"smg-{version}.txt"
    if not path.is_file():
        raise ConfigError([SettingError(f"{NAMESPACE}:router.version", f"no pinned wheels for smg {shown(version)}",
                                        f"one of {', '.join(pinned_versions())}")])
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def pinned_versions() -> list[str]:
    return sorted(p.name[len("smg-"):-len(".txt")] for p in PINS_DIR.glob("smg-*.txt"))


def url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def worker_url(address: str, port: int) -> str:
    return f"http://{url_host(address)}:{port}"


# ---------------------------------------------------------------------------------------------
# The unit

def unit_name(settings: StackSettings) -> str:
    return f"{settings.declared_router.unit_name}.service"


def environment_path(settings: StackSettings) -> str:
    return environment_path_of(unit_name(settings))


def environment_path_of(unit: str) -> str:
    """The environment file of router unit `unit` (its admin key)."""
    return f"{ENVIRONMENT_DIR}/{unit.removesuffix('.service')}.env"


def unit_file_of(unit: str) -> str:
    return f"{UNIT_DIR}/{unit}"


def exec_start(settings: StackSettings, workers: list[str], pd: Optional[tuple[Any, ...]] = None) -> list[str]:
    """smg's command line: the declared fleet as --worker-urls (a restarted router comes back
    routing to all of them; a roll takes hosts out through the admin API). `pd`: (prefill
    [(url, bootstrap port)], decode [url]) of a prefill/decode stack: PD mode instead, each
    prefill server with its bootstrap port (`smg launch --help`: --prefill URL [BOOTSTRAP_PORT])."""
    r = settings.declared_router
    argv = [f"{r.venv_path}/bin/smg", "launch", "--host", r.bind, "--port", str(r.port), "--policy", r.policy,
            "--prometheus-host", r.bind, "--prometheus-port", str(r.metrics_port)]
    if pd is not None:
        argv.append("--pd-disaggregation")
        for url, port in pd[0]:
            argv += ["--prefill", url, str(port)]
        for url in pd[1]:
            argv += ["--decode", url]
    elif workers:
        argv += ["--worker-urls", *workers]
    return argv


def render_environment(key: str) -> str:
    """The router's environment file (written 0600): the admin key entry. The key's shape was
    checked (rules.ROUTER_KEY); checked again here, never quoted in a refusal."""
    if not isinstance(key, str) or not ROUTER_KEY.fullmatch(key):
        raise ConfigError([SettingError(f"{NAMESPACE}:routerAdminKey", "must be 16 to 256 of A-Z a-z 0-9 . _ ~ + / = -")])
    return ("# Managed by gpu-serving: the router's admin key (a Pulumi secret).\n"
            f"{KEY_VARIABLE}={KEY_ID}:{KEY_ID}:admin:{key}\n")


def without_workers(unit_text: str) -> str:
    """The router's unit text but for the fleet it routes to (its --worker-urls and the count in
    its description): two units equal here differ only in which servers the router routes to,
    which its admin API changes without a restart."""
    return "\n".join(line for line in unit_text.splitlines()
                     if not line.startswith("Description=") and not line.lstrip().startswith("--worker-urls "))


def worker_urls(unit_text: str) -> list[str]:
    """The --worker-urls of a router unit rendered by render_unit, in order."""
    for line in unit_text.splitlines():
        words = line.split()
        if words and words[0] == "--worker-urls":
            return [w for w in words[1:] if w != "\\"]
    return []


def render_unit(settings: StackSettings, workers: list[str], pd: Optional[tuple[Any, ...]] = None) -> str:
    r = settings.declared_router
    argv = exec_start(settings, workers, pd)
    for word in argv:
        if not _PLAIN.fullmatch(word):
            raise ConfigError([SettingError(f"{NAMESPACE}:router", f"{shown(word)} cannot be written into the router's unit")],
                              "the rendered router unit")
    groups: list[list[str]] = [argv[:2]]
    for word in argv[2:]:
        if word.startswith("--"):
            groups.append([word])
        else:
            groups[-1].append(word)
    groups.append(["--control-plane-api-keys", "${%s}" % KEY_VARIABLE])
    exec_lines = [("ExecStart=" if i == 0 else "    ") + " ".join(g) for i, g in enumerate(groups)]
    exec_lines = [line + " \\" for line in exec_lines[:-1]] + [exec_lines[-1]]
    lines = [
        # The same bytes from every strategy stack of the fleet: the router outlives a switch.
        "# Managed by gpu-serving (the fleet's router, shared by its strategy stacks); hand edits are drift.",
        "[Unit]",
        f"Description=SGLang router (smg {r.version}, {r.policy}) on port {r.port} for {len(workers)} server(s)" if pd is None
        else f"Description=SGLang router (smg {r.version}, {r.policy}, prefill/decode) on port {r.port} for "
             f"{len(pd[0])} prefill and {len(pd[1])} decode server(s)",
        f"{MARKER_KEY}={r.unit_name}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"EnvironmentFile={environment_path(settings)}",
        *exec_lines,
        # The router holds no model: a crash is restarted at once, with every declared worker.
        "Restart=always",
        "RestartSec=2",
        "TimeoutStopSec=30",
        "KillMode=control-group",
        "LimitNOFILE=1048576",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# What the router says

@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    status: str              # "ready" | "draining" | "pending" ...
    healthy: bool
    load: int
    strategy: str            # "tp8 pp1 dp1" from the labels the router read off /server_info


def _strategy(labels: dict[str, Any]) -> str:
    parts = [f"{k}{labels[f'{k}_size']}" for k in ("tp", "pp", "ep", "dp") if f"{k}_size" in labels]
    if str(labels.get("enable_dp_attention", "")).lower() == "true":
        parts.append("dp-attention")
    return " ".join(parts)


def parse_workers(text: str) -> list[Worker]:
    """GET /workers -> the workers, in the router's order. Raises ValueError on another shape."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise ValueError("GET /workers answered without a workers list")
    out = []
    for w in doc["workers"]:
        labels = w.get("labels") or {}
        out.append(Worker(id=str(w.get("id", "")), url=str(w.get("url", "")).rstrip("/"), status=str(w.get("status", "")),
                          healthy=bool(w.get("is_healthy")), load=int(w.get("load") or 0), strategy=_strategy(labels)))
    return out


def serving(workers: list[Worker]) -> list[Worker]:
    """The workers the router sends requests to now."""
    return [w for w in workers if w.healthy and w.status == "ready"]


@dataclass(frozen=True)
class RouterVerdict:
    ready: bool
    reason: str
    missing: tuple[Any, ...] = ()      # declared URLs the router does not list
    unhealthy: tuple[Any, ...] = ()    # listed but not healthy and ready


def judge_router(expected: list[str], workers: Optional[list[Worker]], error: str = "") -> RouterVerdict:
    """Ready when the router answers and routes to every expected worker URL."""
    if workers is None:
        return RouterVerdict(False, f"the router does not answer: {error}" if error else "the router does not answer")
    by_url = {w.url: w for w in workers}
    missing = tuple(u for u in expected if u not in by_url)
    unhealthy = tuple(u for u in expected if u in by_url and by_url[u] not in serving([by_url[u]]))
    if missing or unhealthy:
        parts = []
        if missing:
            parts.append(f"does not list {', '.join(missing)}")
        if unhealthy:
            parts.append(", ".join(f"{u} is {by_url[u].status or 'unknown'}{'' if by_url[u].healthy else ' (unhealthy)'}"
                                   for u in unhealthy))
        return RouterVerdict(False, "the router " + "; ".join(parts), missing, unhealthy)
    return RouterVerdict(True, f"the router routes to all {len(expected)} server(s)")


# $1 the router's environment file (its key, 0600), $2 the admin URL, $3 a python, $4 HTTP_SCRIPT:
# GET /workers with the key read on the router's own host, so it never leaves it (status and the
# drift watch need no secret of the stack).
WORKERS_ON_HOST_SCRIPT = r"""
key=$(sed -n 's/^""" + KEY_VARIABLE + r"""="\{0,1\}[^:]*:[^:]*:admin:\([^"]*\)"\{0,1\}$/\1/p' "$1" 2>/dev/null | head -n 1)
printf '%s\n' "$key" | "$3" -c "$4" GET "$2"
"""


def membership(url: str, workers: Optional[list[Worker]], router: str, error: str = "") -> dict[str, Any]:
    """Whether the router at `router` routes to the server at `url` now: {in_router (None: the
    router was not read), text}. An interrupted roll can leave a ready server out of the router."""
    if workers is None:
        return {"in_router": None, "text": f"the router at {router} was not read: {error or 'no answer'}"}
    mine = [w for w in workers if w.url == url]
    if serving(mine):
        return {"in_router": True, "text": f"in the router at {router}, healthy ({url})"}
    if mine:
        w = mine[0]
        return {"in_router": False, "text": f"the router at {router} lists {url} as {w.status or 'unknown'}"
                                            f"{'' if w.healthy else ', unhealthy'}: it routes nothing to it"}
    listed = ", ".join(w.url for w in workers) or "no worker"
    return {"in_router": False, "text": f"not in the router at {router}: it routes nothing to {url} (it lists {listed})"}


# ---------------------------------------------------------------------------------------------
# In flight on a server (SGLang's Prometheus text, --enable-metrics)

def in_flight(metrics_text: str, attn_tp_size: Optional[int] = None) -> Optional[int]:
    """Requests running plus queued on a server, from its /metrics, each counted once: one series
    per DP group and stage, not one per TP rank (core/server_metrics.py says why); None when it
    reports neither gauge or is not Prometheus' text."""
    try:
        return server_metrics.in_flight(metrics_text, attn_tp_size)
    except ValueError:
        return None


def in_flight_from_load(text: str) -> Optional[int]:
    """Requests running plus waiting on a server, from SGLang's GET /get_load (a list, one entry
    per DP rank: num_reqs, num_waiting_reqs, num_tokens); None for another answer."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not all(isinstance(d, dict) and "num_reqs" in d for d in doc):
        return None
    return sum(int(d.get("num_reqs") or 0) + int(d.get("num_waiting_reqs") or 0) for d in doc)


def local_url(bind: str, port: int) -> str:
    """How a process on the same machine reaches a server bound to `bind`."""
    if bind in ("0.0.0.0", ""):
        return f"http://127.0.0.1:{port}"
    if bind == "::":
        return f"http://[::1]:{port}"
    return worker_url(bind, port)


# A fixed script run on a host with its python (argv: METHOD URL; stdin: the bearer key on the
# first line, or an empty line, then the body). Prints the HTTP status (0: no answer) and the
# body. No proxy: the URL is always the host's own address.
HTTP_SCRIPT = r"""
import sys, urllib.error, urllib.request
method, url = sys.argv[1], sys.argv[2]
key = sys.stdin.readline().strip()
body = sys.stdin.read().encode() or None
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
req = urllib.request.Request(url, data=body, method=method, headers=headers)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(req, timeout=10) as r:
        print(r.status)
        sys.stdout.write(r.read().decode(errors="replace"))
except urllib.error.HTTPError as e:
    print(e.code)
    sys.stdout.write(e.read().decode(errors="replace"))
except Exception as e:
    print(0)
    sys.stdout.write("%s: %s" % (type(e).__name__, e))
"""


def parse_http(stdout: str) -> tuple[int, str]:
    """HTTP_SCRIPT's answer -> (status, body)."""
    first, _, body = stdout.partition("\n")
    try:
        return int(first.strip()), body
    except ValueError:
        return 0, stdout


# ---------------------------------------------------------------------------------------------
# The roll (its order and refusals: core/roll.py)

def switch_notice(hosts: list[str], strategy: str) -> Optional[str]:
    """The line a fleet without a router prints when a switch is planned (components/program.py
    prints it from the first unit that would start or restart, never in a run that switches
    nothing): the hosts that switch stop at once. None for the one-host form. Behind a router the
    line is the roll's order (core/roll.py: notice)."""
    if len(hosts) < 2:
        return None
    # Which hosts really switch is known host by host, after this line is printed (a host
    # already on `strategy`, say after a partial failure, is left alone): the line says so.
    return (f"no router (gpu-serving:router): the hosts whose strategy changes, of {', '.join(hosts)}, stop at once "
            f"and switch to {strategy} together; nothing serves on them until they are ready")


@dataclass
class RollState:
    """Where a roll is: filled as batches run, for the outputs and the failure message."""
    switched: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)
    failed: Optional[str] = None
    reason: str = ""

    def message(self, target: str, previous: dict[str, Any]) -> str:
        if not self.failed:
            return f"rolled {', '.join(self.switched) or 'no host'} to {target}"
        back = previous.get(self.failed) or "its previous strategy"
        left = (f"; {', '.join(self.not_started)} not switched (still serving their strategy)" if self.not_started else "")
        done = f"; already switched: {', '.join(self.switched)}" if self.switched else ""
        return (f"the roll to {target} stopped at host {self.failed}: {self.reason}. {self.failed} was rolled back to {back} "
                f"and put back in the router{done}{left}")
