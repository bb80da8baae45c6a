"""Dynamic providers that install what every strategy stack of a host shares: the CUDA toolkit
and the Python venv with the serving engine.

Why providers and not `pulumi_command.remote.Command`: an install must be visible as what it
left on the host. Command has no read (refresh never looks), so a removed toolkit or a broken
venv would stay "created" forever. Here `read` asks the host (``nvcc --version``; the venv's
python and ``pip list``), `diff` compares that with the declaration, and create/update change
the host only where it differs, so a second `up` changes nothing. `delete` is a no-op for both:
the toolkit and the venv belong to the host, not to one strategy stack.

Every remote command goes through `ssh.run` (argv lists, quoted) with a timeout; files travel
by SFTP, and only the ones whose sha256 differs. Installs take a host-wide lock (flock), so two
stacks converging the same host at once install one after the other.
"""
from __future__ import annotations

import hashlib
import posixpath
from pathlib import Path

from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from ..core import cuda as C
from ..core import reads
from ..core import venv as V
from ..core.reads import PROBE_TIMEOUT
from ..core.specs_install import CudaSpec, VenvSpec
from . import identity, rehearsal_adapter, ssh
from .common import changed as _changed
from .common import progress as _progress
from .common import require_target as _target
from .common import resource_id

INSTALL_LOCK = "/run/lock/gpu-serving-install.lock"
LOCK_WAIT = 1800  # seconds to wait for another stack's install on the same host


def _locked(argv: list[str]) -> list[str]:
    return ["flock", "-w", str(LOCK_WAIT), INSTALL_LOCK, *argv]


def parse_sha256sum(text: str) -> dict[str, str]:
    """``sha256sum FILE...`` -> {basename: digest}."""
    out = {}
    for line in text.splitlines():
        digest, sep, path = line.partition("  ")
        if sep and len(digest) == 64:
            out[posixpath.basename(path.strip())] = digest
    return out


def remote_digests(t: ssh.Target, directory: str) -> dict[str, str]:
    res = ssh.run(t, ["find", directory, "-maxdepth", "1", "-type", "f", "-exec", "sha256sum", "{}", "+"],
                  purpose=f"listing {directory}", timeout=PROBE_TIMEOUT, check=False, read=True)
    return parse_sha256sum(res.stdout) if res.rc == 0 else {}


def sync_files(t: ssh.Target, files: dict[str, Path], remote_dir: str, mode: int = 0o644) -> list[str]:
    """Push the local files whose sha256 differs from the copy in `remote_dir` (by SFTP, each
    written atomically). Returns the names pushed."""
    have = remote_digests(t, remote_dir)
    pushed = []
    for name, local in sorted(files.items()):
        data = local.read_bytes()
        if have.get(name) != hashlib.sha256(data).hexdigest():
            ssh.write_file(t, f"{remote_dir}/{name}", data, mode)
            pushed.append(name)
    return pushed


# ---------------------------------------------------------------------------------------------
@identity.guarded
class CudaToolkitProvider(ResourceProvider):
    """The CUDA toolkit (props: CudaSpec). Outputs: version (what nvcc reports; None when
    absent), nvccRelease, sourceLine (the apt source used by the last install).
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.cuda_toolkit(props)

    def _probe(self, t: ssh.Target, props: dict) -> C.CudaObserved:
        request, = self.read_requests(props)
        return C.parse_cuda_probe(ssh.fetch(t, request).stdout)

    def _source(self, spec: CudaSpec, observed: C.CudaObserved) -> C.AptSource:
        repo = spec.apt_repository
        if repo == C.REHEARSAL:
            return rehearsal_adapter.cuda_source()
        if repo:
            return C.parse_apt_line(repo)
        try:
            return C.nvidia_repository(observed.os_release, observed.dpkg_arch)
        except ValueError as exc:
            raise ssh.RemoteError(f"gpu-serving:cuda: {exc}") from None

    def _keyring(self, t: ssh.Target, spec: CudaSpec, source: C.AptSource) -> None:
        """Put the pinned keyring at the source's signed-by path (nothing when it is there)."""
        path, pin = source.keyring, spec.keyring_sha256
        if path is None:  # cuda.parse_apt_line refuses a line without one, and the built-in sources name theirs
            raise ssh.RemoteError(f"the apt source {source.line} names no signed-by keyring: add [signed-by=/path]")
        current = ssh.read_file(t, path)
        if current is not None and hashlib.sha256(current).hexdigest() == pin:
            return
        rehearsal = spec.rehearsal_repo
        if rehearsal:
            data = Path(rehearsal.keyring_file).read_bytes()
            origin = rehearsal.keyring_file
        else:
            url = source.keyring_url
            if url is None:
                raise ssh.RemoteError(f"the keyring {path} on {t.label} is missing or does not match gpu-serving:cuda.keyringSha256, "
                                      f"and {source.uri} is not an http(s) repository to fetch it from: put the keyring there")
            tmp = f"{path}.gpu-serving-download"
            _progress(f"cuda: fetching the repository keyring {url}")
            ssh.run(t, ["mkdir", "-p", posixpath.dirname(path)], purpose="creating the keyring directory", timeout=60)
            ssh.run(t, ["curl", "-fsSL", "--max-time", "120", "--retry", "2", "-o", tmp, url],
                    purpose=f"downloading {url}", timeout=300)
            data = ssh.read_file(t, tmp) or b""
            ssh.remove_file(t, tmp)
            origin = url
        got = hashlib.sha256(data).hexdigest()
        if got != pin:
            raise ssh.RemoteError(f"the CUDA repository keyring from {origin} has sha256 {got}, but gpu-serving:cuda.keyringSha256 "
                                  f"pins {pin}: not trusted, nothing installed. Check the key (gpg --show-keys) and update the pin "
                                  "only if it is really the repository's key.")
        ssh.write_file(t, path, data, 0o644)

    def _install(self, t: ssh.Target, spec: CudaSpec, observed: C.CudaObserved, action: C.CudaAction) -> str:
        source = self._source(spec, observed)
        rehearsal = spec.rehearsal_repo
        if rehearsal:
            local = Path(rehearsal.local_dir)
            if not local.is_dir():
                raise ssh.RemoteError(rehearsal_adapter.cuda_repo_gone(str(local)))
            pushed = sync_files(t, {p.name: p for p in local.iterdir() if p.is_file()}, rehearsal.remote_dir)
            if pushed:
                _progress(f"cuda: pushed {len(pushed)} file(s) of the rehearsal repository to {rehearsal.remote_dir}")
        self._keyring(t, spec, source)
        text = C.render_source_file(source).encode()
        if ssh.read_file(t, C.SOURCE_FILE) != text:
            ssh.write_file(t, C.SOURCE_FILE, text, 0o644)
        apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-o", "DPkg::Lock::Timeout=600"]
        # Only our source: no other repository is contacted, and List-Cleanup=0 keeps the others' lists.
        _progress(f"cuda: apt-get update ({source.uri})")
        ssh.run(t, _locked([*apt, "-o", f"Dir::Etc::sourcelist={C.SOURCE_FILE}", "-o", "Dir::Etc::sourceparts=-",
                            "-o", "APT::Get::List-Cleanup=0", "update"]),
                purpose=f"apt-get update of {source.uri}", timeout=LOCK_WAIT + 600)
        _progress(f"cuda: {action.reason}")
        try:
            ssh.run(t, _locked([*apt, "install", "-y", "--no-install-recommends",
                                "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
                                *(["--reinstall"] if action.action == "reinstall" else []), *action.packages]),
                    purpose=f"apt-get install {' '.join(action.packages)}",
                    timeout=LOCK_WAIT + (spec.install_timeout or C.INSTALL_TIMEOUT))
        except ssh.RemoteError as exc:
            raise ssh.RemoteError(f"{exc}\n(only the CUDA source was updated; if a dependency from the distribution is "
                                  f"missing or gives 404, run apt-get update on {t.label} once and `up` again)") from None
        return source.line

    def _converge(self, props: dict) -> dict:
        t, spec = _target(props), CudaSpec.from_props(props)
        observed = self._probe(t, props)
        action = C.cuda_action(version=spec.version, home=spec.home, install=spec.install, package=spec.apt_package,
                               observed=observed)
        source_line = spec.source_line
        if action.action == "fail":
            raise ssh.RemoteError(f"{t.label}: {action.reason}")
        if action.action != "none":
            source_line = self._install(t, spec, observed, action)
            observed = self._probe(t, props)
            if observed.nvcc_version != spec.version:
                found = f"reports {observed.nvcc_version}" if observed.nvcc_version else "is still missing"
                raise ssh.RemoteError(f"{t.label}: apt-get installed {' '.join(action.packages)} but {spec.home}/bin/nvcc {found}; "
                                      "check gpu-serving:cuda.home and cuda.aptPackage")
        else:
            _progress(f"cuda: {action.reason}; nothing to do")
        return {**props, "version": observed.nvcc_version, "nvccRelease": observed.nvcc_release, "sourceLine": source_line}

    def create(self, props):
        return CreateResult(id_=resource_id(props, CudaSpec.from_props(props).home), outs=self._converge(props))

    def update(self, id, olds, news):
        return UpdateResult(outs=self._converge({**news, "sourceLine": olds.get("sourceLine")}))

    def read(self, id, props):
        """What nvcc says now: a toolkit removed or changed by hand reads as another version."""
        observed = self._probe(_target(props), props)
        outs = {**props, "version": observed.nvcc_version, "nvccRelease": observed.nvcc_release}
        inputs = {k: v for k, v in outs.items() if k not in ("nvccRelease", "sourceLine")}
        return ReadResult(id_=id, outs=outs, inputs=inputs)

    def diff(self, id, olds, news):
        changed = _changed(olds, news, list(CudaSpec.DIFFED))
        return DiffResult(changes=bool(changed), replaces=["home"] if "home" in changed else [], stables=[],
                          delete_before_replace=False)

    def delete(self, id, props):
        """Nothing: the toolkit stays for the host's other strategy stacks."""


# ---------------------------------------------------------------------------------------------
@identity.guarded
class PythonVenvProvider(ResourceProvider):
    """The serving venv with the pinned packages (props: VenvSpec). Outputs: python and packages
    as the host has them (read back), installed ({name: version}), pythonPath.
    """

    @staticmethod
    def read_requests(props: dict) -> list[dict]:
        return reads.python_venv(props)

    def _probe(self, t: ssh.Target, props: dict) -> V.VenvObserved:
        request, = self.read_requests(props)
        return V.parse_venv_probe(ssh.fetch(t, request).stdout)

    def _host_python(self, t: ssh.Target, python: str) -> str:
        exe = f"python{python}"
        res = ssh.run(t, ["sh", "-c", 'command -v "$1" || { echo "@@missing"; python3 --version 2>&1; }', "sh", exe],
                      purpose=f"looking for {exe}", timeout=PROBE_TIMEOUT, check=False, read=True)
        if "@@missing" in res.stdout or res.rc != 0:
            have = res.stdout.replace("@@missing", "").strip() or "no python3"
            raise ssh.RemoteError(f"{exe} is not installed on {t.label} (gpu-serving:venv.python is {python}; the host has {have}): "
                                  f"install it (apt-get install {exe} {exe}-venv) or set venv.python to the host's version")
        return res.stdout.strip().splitlines()[0]

    def _outs(self, props: dict, observed: V.VenvObserved) -> dict:
        spec = VenvSpec.from_props(props)
        return {**props, **V.observed_view(list(spec.packages), observed), "pythonPath": f"{spec.path}/bin/python"}

    def _converge(self, props: dict) -> dict:
        t, spec = _target(props), VenvSpec.from_props(props)
        path, python, packages = spec.path, spec.python, list(spec.packages)
        observed = self._probe(t, props)
        refuse = V.venv_plan(python=python, packages=packages, observed=observed, rebuilt_wheels=[]).refuse
        if refuse:
            raise ssh.RemoteError(f"{t.label}: {refuse}")
        wheelhouse = spec.wheelhouse
        pushed: list[str] = []
        if wheelhouse:
            local = Path(wheelhouse.local_dir)
            missing = [n for n in wheelhouse.files if not (local / n).is_file()]
            if missing:
                raise ssh.RemoteError(f"the wheelhouse {local} no longer has {', '.join(missing)}: run the preview again")
            pushed = sync_files(t, {n: local / n for n in wheelhouse.files}, wheelhouse.remote_dir)
            if pushed:
                _progress(f"venv: pushed {', '.join(pushed)} to {wheelhouse.remote_dir}")
        plan = V.venv_plan(python=python, packages=packages, observed=observed, rebuilt_wheels=pushed if wheelhouse else [])
        if not (plan.create or plan.install or plan.force_reinstall):
            _progress(f"venv: {path} has python {observed.python} and {', '.join(packages)}; nothing to do")
            return self._outs(props, observed)
        if plan.create:
            exe = self._host_python(t, python)
            _progress(f"venv: {plan.reason}")
            res = ssh.run(t, _locked([exe, "-m", "venv", *(["--clear"] if plan.clear else []), path]),
                          purpose=f"creating the venv {path}", timeout=LOCK_WAIT + 600, check=False)
            if res.rc != 0:
                hint = f" (Debian/Ubuntu: apt-get install python{python}-venv)" if "ensurepip" in res.stdout + res.stderr else ""
                raise ssh.RemoteError(f"creating the venv {path} with {exe} on {t.label} failed{hint}:\n"
                                      + "\n".join((res.stderr or res.stdout).strip().splitlines()[-10:]))
        pip = [f"{path}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
        if wheelhouse:
            pip += ["--no-index", "--find-links", wheelhouse.remote_dir]
        timeout = LOCK_WAIT + (spec.install_timeout or V.INSTALL_TIMEOUT)
        if plan.install or plan.create:
            _progress(f"venv: installing {', '.join(packages)} ({plan.reason})")
            ssh.run(t, _locked([*pip, *packages]), purpose=f"pip install into {path}", timeout=timeout)
        if plan.force_reinstall:
            # Same version, new wheel (the rehearsal engine rebuilt): pip would keep the old files.
            _progress(f"venv: reinstalling {', '.join(plan.force_reinstall)} from the changed wheel(s)")
            ssh.run(t, _locked([*pip, "--force-reinstall", "--no-deps", *plan.force_reinstall]),
                    purpose=f"pip reinstall into {path}", timeout=timeout)
        observed = self._probe(t, props)
        left = V.venv_plan(python=python, packages=packages, observed=observed, rebuilt_wheels=[])
        if left.create or left.install:
            raise ssh.RemoteError(f"{t.label}: after pip install the venv {path} still differs: {left.reason}")
        return self._outs(props, observed)

    def create(self, props):
        return CreateResult(id_=resource_id(props, VenvSpec.from_props(props).path), outs=self._converge(props))

    def update(self, id, olds, news):
        return UpdateResult(outs=self._converge(news))

    def read(self, id, props):
        """The venv as it is: python version and the declared packages' installed versions."""
        declared = list(VenvSpec.from_props(props).declared_packages)
        observed = self._probe(_target(props), props)
        outs = {**props, **V.observed_view(declared, observed)}
        inputs = {k: v for k, v in outs.items() if k not in V.OUTPUT_KEYS}
        return ReadResult(id_=id, outs=outs, inputs=inputs)

    def diff(self, id, olds, news):
        changed = _changed(olds, news, list(VenvSpec.DIFFED))
        if V.wheelhouse_key(olds.get("wheelhouse")) != V.wheelhouse_key(news.get("wheelhouse")):
            changed.append("wheelhouse")
        return DiffResult(changes=bool(changed), replaces=["path"] if "path" in changed else [], stables=[],
                          delete_before_replace=False)

    def delete(self, id, props):
        """Nothing: the venv stays for the host's other strategy stacks."""
