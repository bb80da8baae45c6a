"""The one seam between the product and its test double, the rehearsal host (rehearsal/).

The rest of components/ knows "a host reached over SSH with these facts" and the settings words
(`host.rehearsal`, `cuda.aptRepository: rehearsal`, `venv.wheelhouse: rehearsal`). Everything
about how a rehearsal host is found, built and named lives here, and only here
(tests/test_layers.py refuses it anywhere else):

- how a running one is found: the record `python -m rehearsal up` writes on this machine
  (`RUN/<name>/host.json`), read for its address, login and host key, and for a connection
  labelled with its name (`connection_now`: the host as it is now, not the state's copy);
- what is built on this machine for it: the signed stand-in CUDA repository and the rehearsal
  engine's wheel (the `rehearsal` package is imported inside those functions only, so importing
  the product never loads the test host);
- the host-side paths of that CUDA repository (their bytes are written into deployed state and
  onto hosts: they do not change);
- the sentences that tell the operator which `python -m rehearsal` command fixes what.

It imports nothing of components/remote, so the transport (ssh.py) can ask it.
"""
from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..core import cuda as C

# The rehearsal hosts' own record of how to reach them (`python -m rehearsal up` writes it).
RUN = "/run/gpu-serving/rehearsal"
# Where the stand-in CUDA repository and its keyring go on the host (written into the hosts'
# apt source file and the CudaToolkit state: the bytes stay).
CUDA_REPO_DIR = "/var/lib/gpu-serving/apt/cuda"
CUDA_KEYRING = "/usr/share/keyrings/gpu-serving-rehearsal-cuda.gpg"


# ---------------------------------------------------------------------------------------------
# Finding a running rehearsal host


def host_record(name: str) -> Optional[dict]:
    """The running rehearsal host `name` as its host.json says (address, keys), or None."""
    try:
        with open(posixpath.join(RUN, name, "host.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("state") == "running" and info.get("address") else None


def addresses() -> dict[str, str]:
    """Every running rehearsal host's address by name."""
    out: dict[str, str] = {}
    try:
        names = os.listdir(RUN)
    except OSError:
        return out
    for name in names:
        info = host_record(name)
        if info and isinstance(info.get("address"), str):
            out[name] = info["address"]
    return out


def machine(name: str) -> Optional[dict]:
    """Which machine the running rehearsal host `name` is, as two connections are compared
    (`host`, `hostKey`: ssh.another_machine), without reading its login key; or None."""
    info = host_record(name)
    return None if info is None else {"host": info["address"], "hostKey": info.get("host_public_key") or ""}


def connection(name: str) -> Optional[dict]:
    """How to reach the running rehearsal host `name` (the providers' connection keys `host`,
    `port`, `user`, `privateKey`, `hostKey`), or None when it is not running or its record names
    no keys to reach it with."""
    info = host_record(name)
    if info is None or not info.get("host_public_key") or not info.get("private_key"):
        return None
    try:
        key = Path(info["private_key"]).read_text()
    except OSError:
        return None
    return {"host": info["address"], "port": int(info.get("port", 22)), "user": info.get("user", "root"),
            "privateKey": key, "hostKey": info["host_public_key"]}


def connection_now(c: dict[str, Any]) -> dict[str, Any]:
    """A connection labelled with a rehearsal host's name (`rehearsal`), as that host says now.
    Its record on this machine is the declaration (the program builds the connection from it), so
    a rehearsal host rebuilt since the last up, with a new host key, address or login key, is read
    as it is now rather than through the state's stale copy. Any other connection as it is."""
    now = connection(c["rehearsal"]) if isinstance(c.get("rehearsal"), str) else None
    return c if now is None else {**c, **now}


# ---------------------------------------------------------------------------------------------
# What the operator is told


def key_from(name: str) -> str:
    """Where a rehearsal host's pinned key comes from, for messages (the connection's `keyFrom`
    label: the same bytes as ever, so a deployed stack sees no change)."""
    return f"the rehearsal host {name!r} (the key it printed, in its host.json)"


def not_running(name: str, entry: str = "gpu-serving:host") -> str:
    return f"the rehearsal host {name!r} is not running: start it with `python -m rehearsal up {name}` (or set {entry}.address)"


def boot_it(name: str) -> str:
    """The command that boots the rehearsal host `name`, for a sentence that says why."""
    return f"python -m rehearsal up {name}"


def stale_record_fix(name: str) -> str:
    """What to do when the host presents another key than its record on this machine says."""
    return (f"The rehearsal host's own record is stale: `python -m rehearsal restart {name}` boots it "
            "with the key it printed, or rebuild it (down, up) and run `pulumi up` again.")


# ---------------------------------------------------------------------------------------------
# What is built on this machine for it


class BuildFailed(Exception):
    """A stand-in could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class LocalCudaRepo:
    """The signed stand-in of NVIDIA's CUDA repository, built on this machine."""

    directory: str        # the repository to push to the host (at CUDA_REPO_DIR there)
    keyring: str          # its signing key's public keyring
    keyring_sha256: str
    package: str          # the only toolkit package it holds ("cuda-toolkit-13-0")


def cuda_repo(version: str) -> LocalCudaRepo:
    """Build (or take from the cache) the stand-in CUDA repository for toolkit `version`."""
    from rehearsal.cuda import RepoBuildError, build_repo
    try:
        info = build_repo(version)
    except RepoBuildError as exc:
        raise BuildFailed(str(exc)) from None
    return LocalCudaRepo(directory=str(info.repo_dir), keyring=str(info.keyring),
                         keyring_sha256=info.keyring_sha256, package=info.package)


def cuda_source() -> C.AptSource:
    """The apt source of the stand-in repository on the host (CudaToolkit writes it there)."""
    return C.local_repository(CUDA_REPO_DIR, CUDA_KEYRING)


def cuda_repo_gone(directory: str) -> str:
    return f"the rehearsal CUDA repository {directory} is gone: run python -m rehearsal.cuda, then up again"


def bench_client_requirements() -> str:
    """The pins of the serving benchmark's client installed on a rehearsal host (benchmark.client:
    rehearsal): SGLang's own wheel and what its benchmark module imports."""
    import rehearsal
    return (Path(rehearsal.__file__).parent / "bench_client.txt").read_text()


def engine_wheel(cache: Path) -> Path:
    """The rehearsal engine's wheel, built into the cache `cache` (its own folder per content)."""
    from rehearsal.engine_wheel import build
    return build(cache / "rehearsal" / "wheelhouse", by_content=True)
