"""PythonVenv: the venv that runs the serving engine, with the pinned packages, shared by every
strategy stack of the host.

- The venv is made with the pinned interpreter (``python<venv.python>``, e.g. python3.11); a host
  without it is a clear error, never a silent other version.
- Packages are pinned ``name==version`` (config.py refuses anything else) and installed with
  pip only when the venv's ``pip list`` differs from them.
- Offline hosts: ``venv.wheelhouse`` is a local directory of wheels; the files whose sha256
  differs on the host are pushed by SFTP to WHEELHOUSE_DIR and installed with ``pip install
  --no-index --find-links``. The special value ``rehearsal`` builds the rehearsal engine's wheel
  (rehearsal/engine_wheel.py) into the cache and uses that.
- Destroying a strategy stack never removes the venv (the other stacks run from it).

This module holds the pure parts (requirement and ``pip list`` parsing, the plan), tested with
data under tests/data/installers/; components/remote/installers.py does the talking and
components/venv.py is the Pulumi component (with the wheelhouse it reads on this machine).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, TYPE_CHECKING

from .errors import SettingError, shown
from .facts import split_sections

if TYPE_CHECKING:  # not imported at run time: the providers import this module (and pydantic
    # models cost the provider process ~0.1 s at every start, before its first read)
    pass

REHEARSAL = "rehearsal"
# Where pushed wheels live on the host (one wheelhouse per host, shared by the stacks).
WHEELHOUSE_DIR = "/var/lib/gpu-serving/wheelhouse"
DIST_SUFFIXES = (".whl", ".tar.gz", ".zip")
# sglang[all] pulls torch and CUDA wheels (GBs): the install step gets an hour.
INSTALL_TIMEOUT = 3600
# Outputs of the venv resource that are not inputs (left out of the inputs a read reports).
OUTPUT_KEYS = ("installed", "pythonPath", "declaredPackages")

REQUIREMENT = re.compile(r"\A([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==([A-Za-z0-9.+!_-]+)\Z", re.ASCII)


def normalize(name: str) -> str:
    """PEP 503 project name: lower case, runs of - _ . as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(spec: str) -> tuple[str, str, str]:
    """``name[extras]==version`` -> (name, "[extras]" or "", version)."""
    m = REQUIREMENT.fullmatch(spec)
    if not m:
        raise ValueError(f"{shown(spec)} is not pinned as name==version")
    return m.group(1), m.group(2) or "", m.group(3)


def same_version(a: Optional[str], b: Optional[str]) -> bool:
    if a is None or b is None:
        return False
    return a.strip().lower().lstrip("v") == b.strip().lower().lstrip("v")


def distribution_of(filename: str) -> Optional[tuple[str, str]]:
    """(normalized project, version) of a wheel (PEP 427 name) or sdist file name."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (normalize(parts[0]), parts[1]) if len(parts) >= 5 else None
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            name, sep, version = filename[: -len(suffix)].rpartition("-")
            return (normalize(name), version) if sep and name else None
    return None


# --------------------------------------------------------------------------------------------
# What the host has

# One SSH round trip, read-only. $1 = venv path. One start of the venv's python reads its version
# and its installed distributions (importlib.metadata: what `pip list` reports, in the same JSON,
# without starting pip, which costs ~0.3 s on every refresh); pip must still import.
PROBE_SCRIPT = r"""
p="$1"
if [ ! -e "$p" ] || { [ -d "$p" ] && [ -z "$(ls -A "$p")" ]; }; then echo '@@state'; echo absent; exit 0; fi
if [ ! -f "$p/pyvenv.cfg" ]; then echo '@@state'; echo not-a-venv; exit 0; fi
echo '@@state'; echo venv
echo '@@python'
"$p/bin/python" -c '
import json, sys
print("%d.%d.%d" % sys.version_info[:3])
print("@@pip")
try:
    import pip
    import importlib.metadata as md
    seen = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = {"name": name, "version": d.version}
    print(json.dumps(list(seen.values())))
except Exception as exc:
    print("%s: %s" % (type(exc).__name__, exc))
    print("@@rc=1")
' 2>&1 || { rc=$?; echo "@@rc=$rc"; echo '@@pip'; echo "@@rc=$rc"; }
"""


@dataclass(frozen=True)
class VenvObserved:
    state: str                      # "absent" | "not-a-venv" | "venv"
    python: Optional[str] = None    # "3.11.2"; None when the venv's interpreter does not run
    pip_ok: bool = False
    packages: dict[str, Any] = field(default_factory=dict)  # normalized name -> version

    @property
    def python_minor(self) -> Optional[str]:
        return ".".join(self.python.split(".")[:2]) if self.python else None


def parse_pip_list(text: str) -> dict[str, str]:
    """``pip list --format=json`` (one JSON line) -> {normalized name: version}."""
    for line in text.splitlines():
        if line.strip().startswith("["):
            return {normalize(i["name"]): str(i["version"]) for i in json.loads(line)}
    raise ValueError("pip list printed no JSON list")


def parse_venv_probe(text: str) -> VenvObserved:
    s = split_sections(text)
    state = s.get("state", "").strip() or "absent"
    if state != "venv":
        return VenvObserved(state=state)
    py = s.get("python", "").strip()  # a failed interpreter leaves its error and "@@rc=N" here
    python = py if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", py) else None
    pip = s.get("pip", "")
    packages, pip_ok = {}, False
    if python and "@@rc=" not in pip:
        try:
            packages, pip_ok = parse_pip_list(pip), True
        except (ValueError, KeyError, TypeError):
            pass
    return VenvObserved(state="venv", python=python, pip_ok=pip_ok, packages=packages)


def observed_view(declared: list[str], observed: VenvObserved) -> dict[str, Any]:
    """The venv as the resource's state shows it: ``python`` (major.minor), ``packages`` (the
    declared list with each entry rewritten to what is installed: equal to the declaration
    when it is satisfied, so a diff names exactly the package that differs), ``installed``
    ({name: version or None}) and ``declaredPackages``."""
    live, installed = [], {}
    for spec in declared:
        name, extras, version = parse_requirement(spec)
        have = observed.packages.get(normalize(name))
        installed[name] = have
        if same_version(have, version):
            live.append(spec)
        elif have is None:
            live.append(f"{name}{extras} (not installed)")
        else:
            live.append(f"{name}{extras}=={have}")
    return {"python": observed.python_minor, "packages": live, "installed": installed, "declaredPackages": list(declared)}


@dataclass(frozen=True)
class VenvPlan:
    create: bool = False        # run python<ver> -m venv
    clear: bool = False         # ... with --clear (wrong or broken interpreter)
    install: bool = False       # pip install the declared packages
    force_reinstall: tuple[Any, ...] = () # specs whose wheel changed at the same version
    refuse: Optional[str] = None
    reason: str = ""


def venv_plan(*, python: str, packages: list[str], observed: VenvObserved, rebuilt_wheels: list[str]) -> VenvPlan:
    """What to do so the venv has `python` and `packages`; nothing when it already has them."""
    if observed.state == "not-a-venv":
        return VenvPlan(refuse="the venv path exists but is not a venv (no pyvenv.cfg): move it away or set gpu-serving:venv.path")
    if observed.state == "absent":
        return VenvPlan(create=True, install=True, reason=f"no venv yet: creating it with python{python}")
    if observed.python is None:
        return VenvPlan(create=True, clear=True, install=True, reason="the venv's python does not run: recreating it")
    if observed.python_minor != python:
        return VenvPlan(create=True, clear=True, install=True,
                        reason=f"the venv has python {observed.python}, declared {python}: recreating it")
    declared = [(spec, *parse_requirement(spec)) for spec in packages]
    differ = [f"{name} {observed.packages.get(normalize(name)) or 'missing'} -> {version}"
              for _, name, _, version in declared if not same_version(observed.packages.get(normalize(name)), version)]
    rebuilt = {distribution_of(w) for w in rebuilt_wheels} - {None}
    force = tuple(spec for spec, name, _, version in declared
                  if (normalize(name), version) in rebuilt and same_version(observed.packages.get(normalize(name)), version))
    if not observed.pip_ok:
        return VenvPlan(create=True, install=True, reason="pip does not run in the venv: restoring it")
    if differ:
        return VenvPlan(install=True, force_reinstall=force, reason="; ".join(differ))
    if force:
        return VenvPlan(force_reinstall=force, reason="a wheel changed at the same version")
    return VenvPlan(reason="up to date")


def wheelhouse_key(wheelhouse: Optional[dict[str, Any]]) -> Optional[tuple[Any, tuple[tuple[str, Any], ...]]]:
    """What of a wheelhouse matters to a diff: where it goes and the files' digests (not where
    it sits on the operator's machine)."""
    if not wheelhouse:
        return None
    return (wheelhouse.get("remoteDir"), tuple(sorted((wheelhouse.get("files") or {}).items())))


def wheelhouse_problems(packages: list[str], files: list[str], where: str) -> list[SettingError]:
    """Every declared package needs its pinned version in the wheelhouse (pip runs --no-index)."""
    have = {d for d in map(distribution_of, files) if d is not None}
    errors = []
    for i, spec in enumerate(packages):
        name, _, version = parse_requirement(spec)
        if (normalize(name), version) not in have:
            versions = sorted(v for n, v in have if n == normalize(name))
            errors.append(SettingError(f"gpu-serving:venv.packages[{i}]", f"{spec} has no wheel in the wheelhouse {where}",
                                       f"it has {name} {', '.join(versions)}" if versions else
                                       f"add {name}-{version} to it (pip download --no-deps {spec} -d {where})"))
    return errors
