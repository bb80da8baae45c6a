"""CudaToolkit: the declared CUDA toolkit on the host, converged once and then left alone.

Two methods (``gpu-serving:cuda.install``):

- ``apt``: NVIDIA's apt repository, keyring pinned by sha256 (``cuda.keyringSha256``), package
  ``cuda-toolkit-<M>-<m>``. The repository line NVIDIA documents (network repo install) is, for
  Debian 12 and Ubuntu 24.04 on x86_64 (arm64 servers use ``sbsa`` instead of ``x86_64``),
  with ``<distro>`` ``debian12`` or ``ubuntu2404``::

      deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] <repos>/<distro>/x86_64/ /
      <repos> = https://developer.download.nvidia.com/compute/cuda/repos

  and the keyring is ``<repository>/cuda-archive-keyring.gpg`` (the file NVIDIA's cuda-keyring
  package installs). With no ``cuda.aptRepository`` the line is chosen from the host's
  /etc/os-release and dpkg architecture; the keyring is downloaded on the host, and used only
  when its sha256 equals the pin. ``aptRepository: rehearsal`` installs from a signed stand-in
  of that repository built on this machine (rehearsal/cuda/) and pushed to the host.
- ``verify``: the host comes with CUDA; only ``<home>/bin/nvcc --version`` is checked.

Already installed at the declared version (``<home>/bin/nvcc --version``) means nothing to do.
Destroying a strategy stack never uninstalls the toolkit: the other strategy stacks of the host
use it. docs/cuda.md tells the operator's side.

This module holds the pure parts (repository lines, what the probe says, what to do), tested
with data under tests/data/installers/; components/remote/installers.py does the talking and
components/cuda.py is the Pulumi component.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, TYPE_CHECKING

from .errors import SettingError, shown
from .facts import parse_nvcc, parse_os_release, split_sections

if TYPE_CHECKING:  # not imported at run time: the providers import this module (and pydantic
    # models cost the provider process ~0.1 s at every start, before its first read)
    from .config import CudaSettings

# The special value of cuda.aptRepository that installs from the local stand-in repository.
REHEARSAL = "rehearsal"

NVIDIA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
NVIDIA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
# The file name of the keyring NVIDIA publishes at the top of each repository.
KEYRING_FILE = "cuda-archive-keyring.gpg"
# Our own source file: one line, ours alone (a cuda-keyring install's cuda-<distro>-<arch>.list
# may sit beside it; both name the same signed-by keyring, so apt accepts the pair).
SOURCE_FILE = "/etc/apt/sources.list.d/gpu-serving-cuda.list"
# dpkg architecture -> the architecture directory of NVIDIA's repositories.
NVIDIA_ARCH = {"amd64": "x86_64", "arm64": "sbsa"}
# A real toolkit is several GB of packages; the install step gets an hour, not the default 10 min.
INSTALL_TIMEOUT = 3600

_OPTION = r"[a-z][a-z-]*=[A-Za-z0-9_./:,+-]+"
APT_LINE = re.compile(rf"\Adeb \[({_OPTION}(?: {_OPTION})*)\] ((?:https?|file):[A-Za-z0-9_./:~+-]+) ([A-Za-z0-9_./-]+)((?: [a-z0-9_-]+)*)\Z", re.ASCII)  # noqa: E501 - one literal


@dataclass(frozen=True)
class AptSource:
    """One ``deb [options] URI suite [components]`` line."""

    uri: str
    suite: str
    options: dict[str, Any] = field(default_factory=dict)
    components: tuple[Any, ...] = ()

    @property
    def keyring(self) -> Optional[str]:
        return self.options.get("signed-by")

    @property
    def line(self) -> str:
        opts = " ".join(f"{k}={v}" for k, v in self.options.items())
        return " ".join(["deb", f"[{opts}]", self.uri, self.suite, *self.components])

    @property
    def keyring_url(self) -> Optional[str]:
        """Where the repository publishes its keyring (NVIDIA's layout), for http(s) sources."""
        if not self.uri.startswith(("https://", "http://")):
            return None
        return self.uri.rstrip("/") + "/" + KEYRING_FILE


def parse_apt_line(line: str) -> AptSource:
    """A one-line apt source with a ``signed-by=`` keyring; ValueError says what is wrong."""
    line = line.strip()
    m = APT_LINE.fullmatch(line)
    if not m:
        raise ValueError(f"{shown(line)} is not a one-line apt source like "
                         f"'deb [signed-by={NVIDIA_KEYRING}] {NVIDIA_REPOS}/debian12/x86_64/ /' "
                         "(only letters, digits and . _ / : , + - ~ are allowed)")
    options = dict(o.split("=", 1) for o in m.group(1).split())
    if not options.get("signed-by", "").startswith("/"):
        raise ValueError(f"{shown(line)} names no signed-by=/path keyring: the keyring is what is pinned")
    return AptSource(uri=m.group(2), suite=m.group(3), options=options, components=tuple(m.group(4).split()))


def nvidia_repository(os_release: dict[str, Any], dpkg_arch: str) -> AptSource:
    """NVIDIA's repository for the host's distribution (debian12, ubuntu2404, ...)."""
    os_id, version_id = os_release.get("ID", ""), os_release.get("VERSION_ID", "")
    if os_id not in ("debian", "ubuntu") or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", version_id):
        raise ValueError(f"NVIDIA's CUDA apt repositories are for Debian and Ubuntu; the host runs "
                         f"{os_release.get('PRETTY_NAME') or os_id or 'an unknown system'}: set cuda.install: verify "
                         "and install CUDA another way, or set cuda.aptRepository")
    arch = NVIDIA_ARCH.get(dpkg_arch)
    if arch is None:
        raise ValueError(f"NVIDIA's CUDA apt repositories have no {dpkg_arch or 'unknown'} architecture "
                         f"(known: {', '.join(NVIDIA_ARCH)}); set cuda.aptRepository")
    distro = os_id + version_id.replace(".", "")
    return AptSource(uri=f"{NVIDIA_REPOS}/{distro}/{arch}/", suite="/", options={"signed-by": NVIDIA_KEYRING})


def local_repository(directory: str, keyring: str) -> AptSource:
    """A repository pushed to the host's `directory`, signed by the keyring at `keyring` there
    (the rehearsal stand-in: remote/rehearsal_adapter.py names both)."""
    return AptSource(uri=f"file:{directory}/", suite="/", options={"signed-by": keyring})


def render_source_file(source: AptSource) -> str:
    return ("# Managed by gpu-serving (CudaToolkit): the CUDA toolkit's apt repository.\n"
            "# Edits are overwritten on the next install; remove gpu-serving:cuda to stop managing it.\n"
            f"{source.line}\n")


def settings_problems(cuda: CudaSettings) -> list[SettingError]:
    """What must be right before anything touches a host (reported at preview)."""
    errors: list[SettingError] = []
    repo = cuda.apt_repository
    if cuda.install != "apt":
        return errors
    if repo not in (None, REHEARSAL):
        try:
            parse_apt_line(repo)
        except ValueError as exc:
            errors.append(SettingError("gpu-serving:cuda.aptRepository", str(exc),
                                       f"or leave it out for NVIDIA's repository, or {REHEARSAL!r} for the rehearsal host"))
    if repo != REHEARSAL and not cuda.keyring_sha256:
        errors.append(SettingError(
            "gpu-serving:cuda.keyringSha256", "is required with cuda.install: apt (the repository keyring is trusted only by its pin)",
            f"on a trusted machine: curl -fsSL {NVIDIA_REPOS}/debian12/x86_64/{KEYRING_FILE} | sha256sum "
            "(use your distribution's directory; docs/cuda.md), or cuda.install: verify"))
    return errors


# --------------------------------------------------------------------------------------------
# What the host has, and what to do about it

# One SSH round trip, read-only. Arguments: $1 = toolkit home, $2 = apt package name.
PROBE_SCRIPT = r"""
echo '@@nvcc'; "$1/bin/nvcc" --version 2>&1 || echo "@@rc=$?"
echo '@@package'; dpkg-query -W -f='${db:Status-Status} ${Version}\n' "$2" 2>/dev/null || echo "@@rc=$?"
echo '@@owner'; dpkg-query -S "$1/bin/nvcc" 2>/dev/null || echo "@@rc=$?"
echo '@@os'; cat /etc/os-release 2>/dev/null
echo '@@arch'; dpkg --print-architecture 2>/dev/null || echo "@@rc=$?"
"""


@dataclass(frozen=True)
class CudaObserved:
    nvcc_version: Optional[str]         # "13.0" from <home>/bin/nvcc --version, None when absent
    nvcc_release: Optional[str] = None  # "13.0.88"
    package_installed: bool = False     # dpkg says the apt package is installed
    package_version: Optional[str] = None
    nvcc_owners: tuple[Any, ...] = ()             # packages that own <home>/bin/nvcc (dpkg -S)
    os_release: dict[str, Any] = field(default_factory=dict)
    dpkg_arch: str = ""


def _clean(section: str) -> str:
    return "" if "@@rc=" in section else section.strip()


def parse_cuda_probe(text: str) -> CudaObserved:
    s = split_sections(text)
    nvcc = _clean(s.get("nvcc", ""))
    release = re.search(r"release [0-9]+\.[0-9]+, V([0-9.]+)", nvcc)
    status, _, version = _clean(s.get("package", "")).partition(" ")
    owners: list[str] = []
    for line in _clean(s.get("owner", "")).splitlines():
        names, sep, _path = line.rpartition(": ")
        if sep:
            owners += [n.split(":")[0].strip() for n in names.split(",") if n.strip()]
    return CudaObserved(
        nvcc_version=parse_nvcc(nvcc) if nvcc else None,
        nvcc_release=release.group(1) if release else None,
        package_installed=status == "installed",
        package_version=version.strip() or None if status == "installed" else None,
        nvcc_owners=tuple(dict.fromkeys(owners)),
        os_release=parse_os_release(s.get("os", "")),
        dpkg_arch=_clean(s.get("arch", "")),
    )


@dataclass(frozen=True)
class CudaAction:
    action: str          # "none" | "install" | "reinstall" | "fail"
    reason: str
    packages: tuple[Any, ...] = ()  # what apt-get installs (reinstall: also the packages owning nvcc)


def cuda_action(*, version: str, home: str, install: str, package: str, observed: CudaObserved) -> CudaAction:
    """The decision: nothing, install, reinstall (dpkg has it but the files are gone or wrong),
    or fail (install: verify and the host does not have it)."""
    nvcc = f"{home}/bin/nvcc"
    if observed.nvcc_version == version:
        return CudaAction("none", f"{nvcc} reports CUDA {version}" + (f" (V{observed.nvcc_release})" if observed.nvcc_release else ""))
    found = f"reports CUDA {observed.nvcc_version}" if observed.nvcc_version else "is missing"
    if install == "verify":
        return CudaAction("fail", f"cuda.install is verify (the host comes with CUDA {version}) but {nvcc} {found}: "
                                  f"install CUDA {version} at {home}, fix cuda.home/cuda.version, or set cuda.install: apt")
    name = package.split("=", 1)[0]
    if observed.package_installed:
        extra = tuple(o for o in observed.nvcc_owners if o != name)
        return CudaAction("reinstall", f"{name} is installed but {nvcc} {found}: reinstalling it", (package, *extra))
    return CudaAction("install", f"{nvcc} {found}: installing {package}", (package,))
