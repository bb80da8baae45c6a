"""A signed stand-in of NVIDIA's CUDA apt repository, built offline on the operator's machine.

The rehearsal host has no Internet, but the CudaToolkit component should still run its REAL
install path there: keyring pinned by sha256, a ``deb [signed-by=...]`` source, ``apt-get
update`` and ``apt-get install cuda-toolkit-<M>-<m>``. So this builds a small flat apt
repository with the same shape as NVIDIA's (``deb [signed-by=KEYRING] URI /``) holding one
stand-in package, signed by a local key:

    ${GPU_SERVING_CACHE:-/var/cache/gpu-serving}/rehearsal/cuda-repo-<version>/
        gnupg/          the signing key (never leaves this machine; kept across rebuilds,
                        so the keyring's sha256 stays the same)
        keyring.gpg     its public keyring (binary, like NVIDIA's cuda-archive-keyring.gpg)
        keyring.sha256  the pin of keyring.gpg
        repo/           what is pushed to the host: the .deb, Packages(.gz), Release,
                        InRelease, Release.gpg
        build.json      stamp: what the repo was built from

The package ``cuda-toolkit-<M>-<m>`` installs ``/usr/local/cuda-<version>/bin/nvcc`` (the stand-in
from rehearsal/gpu/nvcc, which answers ``nvcc --version`` in the real format and reads the
version from ``version.json`` beside bin/, as real toolkits ship it), ``version.json`` and
``lib64/``; its maintainer scripts register ``/usr/local/cuda`` with update-alternatives the way
NVIDIA's cuda-toolkit-config-common does.

Tools: dpkg-deb (dpkg), apt-ftparchive (apt-utils), gpg and gpgconf (gnupg). Nothing is
downloaded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Optional

# Bump when the layout of the package or the repository changes (the stamp then differs and the
# repository is rebuilt; the signing key is kept).
BUILDER_VERSION = 1

NVCC_STANDIN = Path(__file__).resolve().parents[1] / "gpu" / "nvcc"
# nvcc's own version (the "V13.0.88" of `nvcc --version`) for the toolkit versions we rehearse;
# other versions get <version>.0.
NVCC_RELEASES = {"13.0": "13.0.88"}
KEY_UID = "gpu-serving rehearsal CUDA repository (stand-in, not NVIDIA) <cuda-rehearsal@gpu-serving.invalid>"
# Debian packages that provide the tools, for the error message.
TOOLS = {"dpkg-deb": "dpkg", "apt-ftparchive": "apt-utils", "gpg": "gnupg", "gpgconf": "gnupg"}
VERSION_RE = re.compile(r"^\d{1,2}\.\d{1,2}$")


class RepoBuildError(RuntimeError):
    """The stand-in repository could not be built; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class RepoInfo:
    version: str            # toolkit version, "13.0"
    package: str            # "cuda-toolkit-13-0"
    package_version: str    # Debian version of the stand-in package
    nvcc_release: str       # "13.0.88"
    root: Path              # cuda-repo-<version>/
    repo_dir: Path          # the directory to serve (push to the host)
    keyring: Path           # binary public keyring of the signing key
    keyring_sha256: str
    fingerprint: str

    def as_dict(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


def cache_root() -> Path:
    return Path(os.environ.get("GPU_SERVING_CACHE") or "/var/cache/gpu-serving") / "rehearsal"


def repo_root(version: str) -> Path:
    return cache_root() / f"cuda-repo-{version}"


def package_name(version: str) -> str:
    return "cuda-toolkit-" + version.replace(".", "-")


def _require_tools() -> None:
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise RepoBuildError(
            "building the rehearsal CUDA apt repository needs " + ", ".join(
                f"{t} ({p})" for t, p in TOOLS.items() if p in missing)
            + f": apt-get install {' '.join(missing)} (scripts/install-host-deps)")


def _run(argv: list[str], *, cwd: Optional[Path] = None, stdout=None, timeout: float = 120) -> bytes:
    try:
        proc = subprocess.run(argv, cwd=cwd, stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RepoBuildError(f"{argv[0]} did not finish within {timeout:g} s while building the rehearsal CUDA repository") from None
    if proc.returncode != 0:
        raise RepoBuildError(f"{' '.join(argv[:3])} ... failed ({proc.returncode}) while building the rehearsal "
                             f"CUDA repository:\n{proc.stderr.decode(errors='replace').strip()[-2000:]}")
    return proc.stdout or b""


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _gpg(home: Path, *args: str, timeout: float = 120) -> bytes:
    return _run(["gpg", "--homedir", str(home), "--batch", "--no-tty", "--pinentry-mode", "loopback",
                 "--passphrase", "", *args], timeout=timeout)


def _stop_agent(home: Path) -> None:
    # gpg starts a gpg-agent for this home directory; it is ours, stop it (by its home).
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=30, check=False)


def _ensure_key(root: Path) -> tuple[Path, str]:
    """The signing key's home and fingerprint; generated once (an unprotected key: it signs a
    stand-in repository on this machine, nothing else)."""
    home = root / "gnupg"
    fpr_file = root / "fingerprint"
    if fpr_file.is_file() and (home / "pubring.kbx").is_file():
        return home, fpr_file.read_text().strip()
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(mode=0o700)
    try:
        _gpg(home, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    finally:
        _stop_agent(home)
    fprs = re.findall(r"^fpr:+([0-9A-F]{40}):", listing, flags=re.M)
    if not fprs:
        raise RepoBuildError(f"gpg generated no key in {home}")
    fpr_file.write_text(fprs[0] + "\n")
    return home, fprs[0]


def _control(version: str, package_version: str, arch: str) -> str:
    return (f"Package: {package_name(version)}\n"
            f"Version: {package_version}\n"
            f"Architecture: {arch}\n"
            "Maintainer: gpu-serving rehearsal <cuda-rehearsal@gpu-serving.invalid>\n"
            "Depends: python3\n"
            "Section: devel\n"
            "Priority: optional\n"
            f"Description: CUDA Toolkit {version} (gpu-serving rehearsal stand-in)\n"
            " Installs a stand-in nvcc that answers --version like the real one. It compiles\n"
            " nothing; it lets the rehearsal host exercise the real apt install path.\n")


def _maintainer_scripts(version: str) -> dict[str, str]:
    home = f"/usr/local/cuda-{version}"
    major, minor = version.split(".")
    priority = str(int(major) * 100 + int(minor))  # newer toolkits win /usr/local/cuda
    return {
        "postinst": ("#!/bin/sh\nset -e\n"
                     'if [ "$1" = configure ]; then\n'
                     f"  update-alternatives --install /usr/local/cuda cuda {home} {priority}\n"
                     f"  update-alternatives --install /usr/local/cuda-{major} cuda-{major} {home} {priority}\n"
                     "fi\n"),
        "prerm": ("#!/bin/sh\nset -e\n"
                  'if [ "$1" = remove ] || [ "$1" = deconfigure ]; then\n'
                  f"  update-alternatives --remove cuda {home}\n"
                  f"  update-alternatives --remove cuda-{major} {home}\n"
                  "fi\n"),
    }


def _build_deb(work: Path, out_dir: Path, version: str, package_version: str, nvcc_release: str, arch: str) -> Path:
    stage = work / "pkg"
    home = stage / f"usr/local/cuda-{version}"
    (home / "bin").mkdir(parents=True)
    (home / "lib64").mkdir()
    (stage / "DEBIAN").mkdir()
    shutil.copyfile(NVCC_STANDIN, home / "bin/nvcc")
    os.chmod(home / "bin/nvcc", 0o755)
    (home / "version.json").write_text(json.dumps({
        "cuda": {"name": "CUDA SDK", "version": f"{version}.0"},
        "cuda_nvcc": {"name": "CUDA NVCC", "version": nvcc_release},
    }, indent=2) + "\n")
    (home / "lib64/REHEARSAL-STAND-IN.txt").write_text(
        "The rehearsal CUDA toolkit ships no libraries; this directory exists as it does in a real toolkit.\n")
    (stage / "DEBIAN/control").write_text(_control(version, package_version, arch))
    for name, text in _maintainer_scripts(version).items():
        (stage / "DEBIAN" / name).write_text(text)
        os.chmod(stage / "DEBIAN" / name, 0o755)
    for d in [stage, *stage.rglob("*")]:
        if d.is_dir():
            os.chmod(d, 0o755)
    deb = out_dir / f"{package_name(version)}_{package_version}_{arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)], timeout=300)
    return deb


def _index_and_sign(repo: Path, home: Path, fpr: str, version: str, arch: str) -> None:
    packages = _run(["apt-ftparchive", "packages", "."], cwd=repo)
    (repo / "Packages").write_bytes(packages)
    with open(repo / "Packages.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(packages)
    release = _run(["apt-ftparchive",
                    "-o", "APT::FTPArchive::Release::Origin=gpu-serving rehearsal",
                    "-o", f"APT::FTPArchive::Release::Label=CUDA {version} stand-in",
                    "-o", f"APT::FTPArchive::Release::Architectures={arch}",
                    "-o", "APT::FTPArchive::Release::Description=Stand-in of NVIDIA's CUDA repository for rehearsal hosts",
                    "release", "."], cwd=repo)
    (repo / "Release").write_bytes(release)
    try:
        _gpg(home, "--yes", "--local-user", fpr, "--digest-algo", "SHA256", "--clearsign",
             "--output", str(repo / "InRelease"), str(repo / "Release"))
        _gpg(home, "--yes", "--local-user", fpr, "--digest-algo", "SHA256", "--armor", "--detach-sign",
             "--output", str(repo / "Release.gpg"), str(repo / "Release"))
    finally:
        _stop_agent(home)


def _inputs_digest(version: str, arch: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"builder": BUILDER_VERSION, "version": version, "arch": arch,
                         "nvcc_release": NVCC_RELEASES.get(version)}, sort_keys=True).encode())
    h.update(NVCC_STANDIN.read_bytes())
    return h.hexdigest()


def _info(root: Path, stamp: dict) -> RepoInfo:
    return RepoInfo(version=stamp["version"], package=stamp["package"], package_version=stamp["package_version"],
                    nvcc_release=stamp["nvcc_release"], root=root, repo_dir=root / "repo",
                    keyring=root / "keyring.gpg", keyring_sha256=stamp["keyring_sha256"],
                    fingerprint=stamp["fingerprint"])


# Debian's names for the common machines: every `pulumi up` on a rehearsal stack builds (or
# finds) the repository, and asking dpkg costs a process each time.
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _debian_arch() -> str:
    import platform
    known = _DEBIAN_ARCH.get(platform.machine())
    if known:
        return known
    return _run(["dpkg", "--print-architecture"]).decode().strip() if shutil.which("dpkg") else "amd64"


def build_repo(version: str = "13.0", *, force: bool = False) -> RepoInfo:
    """Build (or reuse from the cache) the signed stand-in repository for CUDA `version`."""
    if not VERSION_RE.match(version):
        raise RepoBuildError(f"CUDA version {version!r} is not like 13.0")
    if not NVCC_STANDIN.is_file():
        raise RepoBuildError(f"the stand-in nvcc is missing: {NVCC_STANDIN}")
    root = repo_root(version)
    arch = _debian_arch()
    digest = _inputs_digest(version, arch)
    with _locked(root):
        stamp_path = root / "build.json"
        try:
            stamp = json.loads(stamp_path.read_text())
        except (OSError, ValueError):
            stamp = {}
        keyring = root / "keyring.gpg"
        if (not force and stamp.get("inputs") == digest and (root / "repo/InRelease").is_file()
                and keyring.is_file() and hashlib.sha256(keyring.read_bytes()).hexdigest() == stamp.get("keyring_sha256")):
            return _info(root, stamp)
        _require_tools()
        home, fpr = _ensure_key(root)
        try:
            public = _gpg(home, "--export", fpr)
        finally:
            _stop_agent(home)
        if not public:
            raise RepoBuildError(f"gpg exported an empty keyring for {fpr}")
        nvcc_release = NVCC_RELEASES.get(version, f"{version}.0")
        package_version = f"{version}.0-1"
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
            work = Path(tmp)
            new_repo = work / "repo"
            new_repo.mkdir()
            _build_deb(work, new_repo, version, package_version, nvcc_release, arch)
            _index_and_sign(new_repo, home, fpr, version, arch)
            for p in [new_repo, *new_repo.iterdir()]:
                os.chmod(p, 0o755 if p.is_dir() else 0o644)
            old = root / "repo"
            if old.exists():
                shutil.rmtree(old)
            os.rename(new_repo, old)
        tmp_keyring = root / ".keyring.gpg.tmp"
        tmp_keyring.write_bytes(public)
        os.chmod(tmp_keyring, 0o644)
        os.replace(tmp_keyring, keyring)
        sha = hashlib.sha256(public).hexdigest()
        (root / "keyring.sha256").write_text(f"{sha}  keyring.gpg\n")
        stamp = {"inputs": digest, "version": version, "package": package_name(version),
                 "package_version": package_version, "nvcc_release": nvcc_release, "arch": arch,
                 "keyring_sha256": sha, "fingerprint": fpr}
        stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
        return _info(root, stamp)
