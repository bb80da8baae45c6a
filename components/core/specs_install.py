"""The contracts of the installers' resources (core/specs.py says why a resource's props are a
contract): the CUDA toolkit and the serving venv, which every strategy stack of a host shares."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .specs import Props, _mapping


@dataclass(frozen=True)
class LocalFiles:
    """Files pushed from this machine to the host (a wheelhouse, the rehearsal CUDA repository):
    where they are here, where they go there, and, for a wheelhouse, each file's sha256."""

    local_dir: str
    remote_dir: str
    files: Mapping[str, str] = field(default_factory=dict)
    keyring_file: str = ""  # the rehearsal CUDA repository's keyring, here

    @classmethod
    def from_props(cls, value: Any) -> Optional["LocalFiles"]:
        d = _mapping(value)
        if not d:
            return None
        return cls(local_dir=str(d.get("localDir") or ""), remote_dir=str(d.get("remoteDir") or ""),
                   files=_mapping(d.get("files")), keyring_file=str(d.get("keyringFile") or ""))

    def repository_props(self) -> dict[str, Any]:
        """As the rehearsal CUDA repository is given: the directory, its keyring, where it goes."""
        return {"localDir": self.local_dir, "keyringFile": self.keyring_file, "remoteDir": self.remote_dir}

    def wheelhouse_props(self) -> dict[str, Any]:
        """As a wheelhouse is given: the directory, each wheel's sha256, where they go."""
        return {"localDir": self.local_dir, "files": dict(self.files), "remoteDir": self.remote_dir}


@dataclass(frozen=True)
class CudaSpec:
    """The CUDA toolkit at `home`, at `version` (CudaToolkitInstall): installed from `apt_repository`
    (None: NVIDIA's for the host's OS; "rehearsal"; or a `deb [signed-by=...] URI suite` line) whose
    keyring must have `keyring_sha256`, or only verified (`install` "verify")."""

    version: str
    home: str
    install: str
    apt_package: str
    apt_repository: Optional[str] = None
    keyring_sha256: Optional[str] = None  # None: no pin (a source whose keyring must already be there)
    rehearsal_repo: Optional[LocalFiles] = None
    install_timeout: float = 0.0
    # What the last install used (an output kept across updates).
    source_line: Optional[str] = None

    # What a change of reinstalls (and "home", replaces) the toolkit.
    DIFFED = ("version", "home", "install", "aptPackage", "aptRepository", "keyringSha256", "connection")

    @classmethod
    def from_props(cls, props: Props) -> "CudaSpec":
        return cls(version=str(props.get("version") or ""), home=str(props.get("home") or ""),
                   install=str(props.get("install") or "apt"), apt_package=str(props.get("aptPackage") or ""),
                   apt_repository=props.get("aptRepository") or None, keyring_sha256=props.get("keyringSha256") or None,
                   rehearsal_repo=LocalFiles.from_props(props.get("rehearsalRepo")),
                   install_timeout=float(props.get("installTimeout") or 0), source_line=props.get("sourceLine"))

    def to_props(self) -> dict[str, Any]:
        """The inputs the program registers (with the connection, which the caller adds)."""
        return {"version": self.version, "home": self.home, "install": self.install, "aptPackage": self.apt_package,
                "aptRepository": self.apt_repository, "keyringSha256": self.keyring_sha256,
                "rehearsalRepo": self.rehearsal_repo.repository_props() if self.rehearsal_repo else None,
                "installTimeout": self.install_timeout}


@dataclass(frozen=True)
class VenvSpec:
    """The serving venv at `path` with the pinned `packages` (PythonVenvInstall), from `wheelhouse`
    (pushed from this machine) when there is one, else the host's package index."""

    path: str
    python: str
    packages: tuple[str, ...]
    wheelhouse: Optional[LocalFiles] = None
    install_timeout: float = 0.0
    # The packages the last read compared (states written before them: the declared ones).
    declared_packages: tuple[str, ...] = ()

    DIFFED = ("path", "python", "packages", "connection")

    @classmethod
    def from_props(cls, props: Props) -> "VenvSpec":
        packages = tuple(str(p) for p in props.get("packages") or ())
        return cls(path=str(props.get("path") or ""), python=str(props.get("python") or "3.11"), packages=packages,
                   wheelhouse=LocalFiles.from_props(props.get("wheelhouse")),
                   install_timeout=float(props.get("installTimeout") or 0),
                   declared_packages=tuple(str(p) for p in props.get("declaredPackages") or ()) or packages)

    def to_props(self) -> dict[str, Any]:
        """The inputs the program registers (with the connection, which the caller adds)."""
        return {"path": self.path, "python": self.python, "packages": list(self.packages),
                "wheelhouse": self.wheelhouse.wheelhouse_props() if self.wheelhouse else None,
                "installTimeout": self.install_timeout}
