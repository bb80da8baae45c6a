"""Rendering of the systemd units and the shared environment file.

One unit per strategy (``sglang-<model>-<strategy>.service``), one EnvironmentFile per model
shared by all its strategy units, so no variable is written twice. The shared file holds only the
project's environment (Pulumi.yaml), the same bytes from every stack; what one strategy adds (and
the paths derived from its settings) are `Environment=` lines of its own unit, so no stack can
change what another one runs with. A unit's text depends on its own stack's settings only, never
on which other strategies exist: exclusivity is enforced when switching, from the units the host
has (components/core/switch.py). Output is deterministic (same settings, same bytes): the text is a
Pulumi input, and a stable text is what makes the preview diff show only real changes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TYPE_CHECKING

from . import flags
from .errors import ConfigError, SettingError, shown
from .rules import ENV_KEY, NAMESPACE

if TYPE_CHECKING:  # the provider's process imports this module, and never the settings models
    from .config import StackSettings

# Where the units are written (systemd's directory for the administrator's units).
UNIT_DIR = "/etc/systemd/system"

# A [Unit] key systemd ignores (X- prefix) that marks a unit as a gpu-serving serving unit and names
# its stack: a switch finds every strategy on the host by it (components/core/switch.py).
MARKER_KEY = "X-GpuServing-Stack"
# Another X- key, on a fleet member's unit behind SGLang's router: which router sends it requests
# (`<router unit>:<router port>`). A stack without that router refuses to stop such a unit
# (core/roll.py: stops_a_routed_server): it would take a server out from under the router.
ROUTED_KEY = "X-GpuServing-RoutedBy"
# The unit files of UNIT_DIR that gpu-serving wrote (the marker key, or the header of units written
# before it), as a shell command run in that directory: one name a line.
MANAGED_UNITS_GREP = "grep -l -s -e '^" + MARKER_KEY + "=' -e '^# Managed by gpu-serving [(]stack ' -- *.service"

# Values that systemd's command-line splitting passes through untouched.
_PLAIN = re.compile(r"\A[A-Za-z0-9_./:,+@=-]+\Z", re.ASCII)
# Unit names and paths written bare into a unit line (Conflicts=, EnvironmentFile=, Description=):
# no space (it would split the list), no quote, backslash, % or $, no leading - (optional file).
_BARE = re.compile(r"\A[A-Za-z0-9_./:@+][A-Za-z0-9_./:@+-]*\Z", re.ASCII)
# Characters that would end, escape or expand a double-quoted EnvironmentFile value.
_ENV_UNSAFE = "\"\\$`'"


# ---------------------------------------------------------------------------------------------
# The rendering-time guard. Every value written into a unit, the environment file or the
# ExecStart command line passes here, whatever validated it before: a setting added later, or a
# settings object built without validation, still cannot add a line, continue one, or have
# systemd expand a specifier in it.

def _refuse(where: str, rule: str, fix: str = "") -> None:
    raise ConfigError([SettingError(where, rule, fix)], "the rendered unit")


def _one_line(where: str, value: str, *, secret: bool = False) -> str:
    if not isinstance(value, str):
        _refuse(where, f"must be text to be written to the unit (got {type(value).__name__})")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        what = f"a {len(value):,}-character secret" if secret else shown(value)
        _refuse(where, f"{what} contains a control character ({ascii(bad)}): it would add or break a line of the "
                       "unit or environment file", "remove it")
    return value


def _bare(where: str, value: str) -> str:
    _one_line(where, value)
    if not _BARE.fullmatch(value):
        _refuse(where, f"{shown(value)} cannot be written bare into a unit line (letters, digits, _ . / : @ + -, "
                       "not starting with -)")
    return value


def check_argv(words: list[tuple[str, str]]) -> list[str]:
    """ExecStart's words, each with the setting it comes from: one line each (no control
    character); `systemd_quote` then escapes what systemd would split, unquote or expand."""
    for where, word in words:
        _one_line(where, word)
    if not words or not words[0][1].startswith("/"):
        # A leading @ - : + ! would change how systemd runs the command.
        _refuse(words[0][0] if words else "ExecStart", "the program must be an absolute path")
    return [w for _, w in words]


def _check_emitted(lines: list[str], what: str, *, specifiers: bool = True) -> None:
    """The net under everything: each emitted line is one printable line; every % and $ is
    escaped (doubled) where systemd expands them (`specifiers`: a unit, not an environment
    file); no line continues into the next except ExecStart's own."""
    for n, line in enumerate(lines, 1):
        body = line[:-2] if line.endswith(" \\") and (line.startswith(("ExecStart=", "    "))) else line
        if not body.isprintable() and body != "":
            _refuse(f"{what}, line {n}", "contains a control character")
        if specifiers and ("%" in body.replace("%%", "") or "$" in body.replace("$$", "")):
            _refuse(f"{what}, line {n}", "contains a % specifier or $ variable systemd would expand")
        if body.endswith("\\"):
            _refuse(f"{what}, line {n}", "ends with a backslash (systemd would join the next line to it)")


def systemd_quote(arg: str) -> str:
    """Quote one argv element for an ExecStart= line.

    Validation already limits arguments to plain characters; this keeps rendering correct for
    anything else: systemd splits on whitespace, honours double quotes and backslashes, expands
    ``$VAR`` and ``%`` specifiers, so those are escaped. Control characters are refused by
    `check_argv`, never quoted.
    """
    if _PLAIN.fullmatch(arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def unit_name(settings: StackSettings, strategy: str | None = None) -> str:
    """The one builder of a strategy's unit name (`strategy` None: this stack's own): the
    renderer, Conflicts= and strategy.check_unit_name all ask here."""
    return f"{settings.serving.unit_prefix}-{settings.model.name}-{strategy or settings.strategy_name}.service"


def environment_path(settings: StackSettings) -> str:
    return f"{settings.serving.environment_dir}/{settings.model.name}.env"


@lru_cache(maxsize=1)
def node_networks() -> dict[str, Any]:
    """data/node-networks.json: NCCL's defaults per network between nodes."""
    data = json.loads((Path(__file__).parent / "data" / "node-networks.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def node_network_environment(settings: StackSettings) -> dict[str, str]:
    """A multi-node layout's NCCL defaults (strategy.nodeNetwork, strategy.socketInterface); {}
    for one node."""
    if settings.nnodes <= 1:
        return {}
    s = settings.strategy
    env = dict(node_networks()[s.node_network]["environment"])
    if s.socket_interface:
        env.update(NCCL_SOCKET_IFNAME=s.socket_interface, GLOO_SOCKET_IFNAME=s.socket_interface)
    return env


def environment(settings: StackSettings) -> dict[str, str]:
    """The strategy's whole environment (without secrets): what its server runs with.

    Derived paths come first; a key the user sets in ``serving.environment`` replaces the
    derived value rather than being written a second time. The shared file gives the project's
    part of it, the unit the rest (`unit_environment`).
    """
    cuda, venv = settings.cuda, settings.venv
    site = f"{venv.path}/lib/python{venv.python}/site-packages"
    derived = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(settings.host.gpu_count)),
        "CUDA_HOME": cuda.home,
        "PATH": f"{venv.path}/bin:{cuda.home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        # The CUDA runtime SGLang's wheels bring (nvidia/cu13) first, then the toolkit's.
        "LD_LIBRARY_PATH": f"{site}/nvidia/cu{cuda.major}/lib:{cuda.home}/lib64",
    }
    merged = {**derived, **node_network_environment(settings), **settings.serving.environment}
    return dict(sorted(merged.items()))


def render_environment(env: dict[str, str], secrets: dict[str, str] | None = None) -> str:
    """EnvironmentFile text. Secret values (e.g. HF_TOKEN) are added here and only here; the
    file is written 0600 on the host. Every key and value passes the guard: one line each,
    nothing systemd would unquote or expand; a secret's value is never quoted in a refusal."""
    lines = ["# Managed by gpu-serving: shared by every strategy unit of this model.",
             "# Hand edits are drift (pulumi preview --refresh --expect-no-changes shows them)."]
    for key, value in {**env, **(secrets or {})}.items():
        secret = key in (secrets or {})
        where = f"{NAMESPACE}:hfToken" if secret and key == "HF_TOKEN" else f"environment variable {shown(key)}"
        if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
            _refuse(f"environment variable {shown(key)}", "is not a valid variable name (letters, digits, _)")
        _one_line(where, value, secret=secret)
        if any(c in value for c in _ENV_UNSAFE):
            what = f"the {len(value):,}-character secret" if secret else shown(value)
            _refuse(where, f"{what} contains a quote, backslash, $ or backtick (it would end, escape or expand the "
                           "environment file's value)")
        lines.append(f'{key}="{value}"' if value == "" or not _PLAIN.fullmatch(value) else f"{key}={value}")
    _check_emitted([line for line in lines if not line.startswith("#")], "the environment file", specifiers=False)
    return "\n".join(lines) + "\n"


def _argv(settings: StackSettings) -> list[tuple[str, str]]:
    """ExecStart's words, each with the setting it comes from (named in a refusal): the
    interpreter, the flags of the flag table (flags.py), then serving.extraArgs."""
    words = [(f"{NAMESPACE}:venv.path", f"{settings.venv.path}/bin/python"),
             ("ExecStart", "-m"), ("ExecStart", "sglang.launch_server")]
    words += flags.words(settings, NAMESPACE)
    words += [(f"{NAMESPACE}:serving.extraArgs[{i}]", arg) for i, arg in enumerate(settings.serving.extra_args)]
    return words


def exec_start(settings: StackSettings) -> list[str]:
    """The argv of ExecStart: the engine with canonical ``--*-size`` flags and every setting,
    each word through the rendering guard."""
    return check_argv(_argv(settings))


def _exec_lines(argv: list[str]) -> list[str]:
    """ExecStart split one flag per line (systemd joins backslash-continued lines), so a preview
    diff between two strategies shows exactly the flags that change."""
    head = " ".join(systemd_quote(a) for a in argv[:3])
    groups: list[list[str]] = []
    for arg in argv[3:]:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    lines = [f"ExecStart={head}"]
    lines += ["    " + " ".join(systemd_quote(a) for a in g) for g in groups]
    return [line + " \\" for line in lines[:-1]] + [lines[-1]]


@dataclass(frozen=True)
class RenderedUnit:
    name: str
    text: str
    exec_start: list[str]
    conflicts: list[str]
    environment_path: str


def unit_environment(env: dict[str, str], shared: dict[str, str]) -> dict[str, str]:
    """What the unit itself sets: every variable of the strategy's environment `env` that the
    shared file (`shared`, the project's) does not give. systemd lets EnvironmentFile= win over
    Environment=, so a project-level key is never set here too."""
    return {k: v for k, v in env.items() if k not in shared}


def routed_by(settings: StackSettings) -> str:
    """The ROUTED_KEY value of a fleet behind a router: the router's unit and port."""
    router = settings.declared_router
    return f"{router.unit_name}:{router.port}"


def render_unit(settings: StackSettings, conflicts_with: list[str] | None = None,
                own_environment: dict[str, str] | None = None) -> RenderedUnit:
    """The strategy's unit file. `conflicts_with` (strategy names, the explicit
    `serving.conflictsWith`) go into Conflicts=; without it the unit names no other strategy.
    `own_environment`: the variables this unit sets itself (`unit_environment`)."""
    name = unit_name(settings)
    conflicts = sorted({unit_name(settings, s) for s in conflicts_with or []} - {name})
    argv = exec_start(settings)
    s = settings.serving
    layout = settings.strategy
    # Every value written bare into a unit line, named by where it comes from.
    _bare(f"{NAMESPACE}:model.servedName", settings.model.served_name)
    _bare(f"{NAMESPACE}:strategy.name", settings.strategy_name)
    _bare("the stack name", settings.stack)
    _bare(f"{NAMESPACE}:serving.environmentDir", environment_path(settings))
    for unit in [name, *conflicts]:
        _bare(f"{NAMESPACE}:serving.conflictsWith", unit)
    lines = [
        f"# Managed by gpu-serving (stack {settings.stack}); hand edits are drift.",
        "[Unit]",
        f"Description=SGLang {settings.model.served_name} {settings.strategy_name} "
        f"(tp {layout.tp_size}, pp {layout.pp_size}, ep {layout.ep_size}, dp {layout.dp_size}) on port {s.port}"
        + (f", node rank {settings.node.rank} of {settings.node.nnodes}" if settings.node else "")
        + (f", {settings.role.role} server" if settings.role else ""),
        f"{MARKER_KEY}={settings.stack}",
        *([f"{ROUTED_KEY}={routed_by(settings)}"] if settings.router is not None else []),
        "After=network-online.target",
        "Wants=network-online.target",
    ]
    if conflicts:
        lines.append("Conflicts=" + " ".join(conflicts))
        # Conflicts= alone lets systemd start this unit while the sibling is still shutting down
        # (and holding the port and the GPUs); any ordering between the two makes the sibling's
        # stop finish first.
        lines.append("After=" + " ".join(conflicts))
    lines += [
        # Three failed loads within an hour and systemd stops retrying: a model that cannot
        # load should wait for an operator, not thrash the GPUs for ever.
        "StartLimitIntervalSec=3600",
        "StartLimitBurst=3",
        "",
        "[Service]",
        "Type=simple",
        f"EnvironmentFile={environment_path(settings)}",
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in sorted((own_environment or {}).items())),
        *_exec_lines(argv),
        # A crash after a good start is restarted; a clean stop (a switch) is not.
        "Restart=on-failure",
        f"RestartSec={s.restart_sec}",
        # Loading hundreds of GB of weights takes many minutes; readiness is judged by
        # gpu-serving's ReadinessCheck, this only stops systemd from giving up first.
        f"TimeoutStartSec={s.timeout_start_sec}",
        # Releasing GPU memory and NCCL communicators takes a while.
        "TimeoutStopSec=120",
        "KillMode=control-group",
        "LimitNOFILE=1048576",
        "LimitMEMLOCK=infinity",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    _check_emitted(lines, f"the unit {shown(name)}")
    return RenderedUnit(name, "\n".join(lines) + "\n", argv, conflicts, environment_path(settings))


# Where `systemctl edit` (and `edit --runtime`, `set-property`) put a unit's drop-ins: a directory
# named after the unit under /etc or /run. Such a file is a hand edit of the unit as much as an
# edit of its file (the declared unit is the whole unit), and a restart would bring it back: the
# switch removes it, and a failed switch puts it back with the other files it replaced.
DROP_IN_ROOTS = ("/etc/systemd/", "/run/systemd/")


def own_drop_ins(unit: str, drop_in_paths: str) -> list[str]:
    """The drop-ins among `systemctl show -p DropInPaths` that belong to `unit` alone (its
    `<unit>.d` directory under /etc or /run); drop-ins for every service, or shipped with the
    OS, are not the unit's."""
    out = set()
    for path in drop_in_paths.split():
        parent, _, name = path.rpartition("/")
        if path.startswith(DROP_IN_ROOTS) and parent.rpartition("/")[2] == f"{unit}.d" and name.endswith(".conf") \
                and not any(part in ("", ".", "..") for part in path[1:].split("/")):
            out.add(path)
    return sorted(out)
