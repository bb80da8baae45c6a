"""The CUDA toolkit and venv providers against a real rehearsal host (no Pulumi engine: the
providers' create/read/diff/update/delete are called the way the engine calls them, with the
props the components build). Nothing on the host is mocked: apt installs from the signed
stand-in repository, pip from the pushed rehearsal engine wheel."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from components import cuda as cuda_component
from components.core import cuda as C
from components import venv as venv_component
from components.core import venv as V
from components.core.config import CudaSettings, VenvSettings
from components.remote import rehearsal_adapter, ssh
from components.remote.installers import CudaToolkitProvider, PythonVenvProvider

pytestmark = pytest.mark.rehearsal

VENV = "/root/venv-installers-test"
ENGINE = "sglang-rehearsal==0.0.1+rehearsal"
WHEEL = "sglang_rehearsal-0.0.1+rehearsal-py3-none-any.whl"


def sh(info, cmd: str, timeout: float = 120) -> str:
    proc = info.run(cmd, timeout=timeout)
    assert proc.returncode == 0, f"{cmd!r}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def connection(info) -> dict:
    # As host.json gives it, in the shape GpuHost hands the providers.
    return {"host": info.address, "port": info.port, "user": info.user,
            "privateKey": Path(info.private_key).read_text(), "hostKey": info.host_public_key,
            "connectTimeout": 15, "commandTimeout": 600}


def state_of_apt(info) -> str:
    """Everything an apt run would touch: its logs, the lists, the pushed repository and our
    source file and keyring (path, size, mtime)."""
    return sh(info, "for f in /var/log/apt/history.log /var/log/dpkg.log /var/lib/apt/lists/* "
                    f"{rehearsal_adapter.CUDA_REPO_DIR}/* {C.SOURCE_FILE} {rehearsal_adapter.CUDA_KEYRING}; do "
                    "[ -e \"$f\" ] && stat -c '%n %s %Y.%y' \"$f\"; done; true")


# ---------------------------------------------------------------------------------------------
# CUDA toolkit

@pytest.fixture(scope="module")
def cuda_props(rehearsal_host):
    props = {"connection": connection(rehearsal_host),
             **cuda_component.install_props(
                 CudaSettings.model_validate({"version": "13.0", "install": "apt", "aptRepository": "rehearsal"}))}
    # A reused host (GPU_SERVING_TEST_HOST) may have it from an earlier run: start clean.
    rehearsal_host.run("apt-get purge -y -q cuda-toolkit-13-0; rm -rf /usr/local/cuda-13.0 "
                       f"{C.SOURCE_FILE} {rehearsal_adapter.CUDA_KEYRING} {rehearsal_adapter.CUDA_REPO_DIR}", timeout=300)
    return props


@pytest.fixture(scope="module")
def cuda_created(rehearsal_host, cuda_props):
    assert "nvcc" not in rehearsal_host.run("ls /usr/local/cuda-13.0/bin").stdout
    result = CudaToolkitProvider().create(dict(cuda_props))
    return result


def test_cuda_installs_from_the_signed_standin_repository(rehearsal_host, cuda_props, cuda_created):
    info, outs = rehearsal_host, cuda_created.outs
    assert cuda_created.id == f"{info.address}:/usr/local/cuda-13.0"
    assert (outs["version"], outs["nvccRelease"], outs["home"]) == ("13.0", "13.0.88", "/usr/local/cuda-13.0")
    assert "release 13.0, V13.0.88" in sh(info, "/usr/local/cuda-13.0/bin/nvcc --version")
    assert sh(info, "dpkg-query -W -f='${db:Status-Status}' cuda-toolkit-13-0") == "installed"
    history = sh(info, "cat /var/log/apt/history.log")
    assert "Commandline: apt-get -q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends" in history
    # The real path: a signed-by source in its own file, the keyring pinned by sha256.
    line = sh(info, f"grep -v '^#' {C.SOURCE_FILE}").strip()
    assert line == outs["sourceLine"] == rehearsal_adapter.cuda_source().line
    assert sh(info, f"sha256sum {rehearsal_adapter.CUDA_KEYRING}").split()[0] == cuda_props["keyringSha256"]
    assert sh(info, "readlink -f /usr/local/cuda").strip() == "/usr/local/cuda-13.0"
    assert sh(info, "ls /usr/local/cuda-13.0/lib64").strip()


def test_cuda_second_run_runs_no_install(rehearsal_host, cuda_props, cuda_created):
    info, p = rehearsal_host, CudaToolkitProvider()
    before = state_of_apt(info)
    # `up` without refresh: the engine diffs state against the program; nothing to do.
    assert not p.diff(cuda_created.id, cuda_created.outs, dict(cuda_props)).changes
    # Refresh: read asks nvcc; the host as it is equals the declaration.
    read = p.read(cuda_created.id, dict(cuda_created.outs))
    assert read.outs["version"] == "13.0" and read.inputs["version"] == "13.0"
    assert not p.diff(cuda_created.id, read.outs, dict(cuda_props)).changes
    # Even an update (e.g. a new connection) only checks: no apt, no push, no file written.
    again = p.update(cuda_created.id, cuda_created.outs, dict(cuda_props))
    assert again.outs["version"] == "13.0"
    assert state_of_apt(info) == before


def test_cuda_removed_by_hand_is_drift_and_up_reinstalls(rehearsal_host, cuda_props, cuda_created):
    info, p = rehearsal_host, CudaToolkitProvider()
    sh(info, "apt-get remove -y -q cuda-toolkit-13-0", timeout=300)
    read = p.read(cuda_created.id, dict(cuda_created.outs))
    assert read.outs["version"] is None and read.inputs["version"] is None
    assert p.diff(cuda_created.id, read.outs, dict(cuda_props)).changes
    fixed = p.update(cuda_created.id, read.outs, dict(cuda_props))
    assert fixed.outs["version"] == "13.0"
    assert "release 13.0" in sh(info, "/usr/local/cuda-13.0/bin/nvcc --version")


def test_cuda_files_deleted_behind_dpkg_are_reinstalled(rehearsal_host, cuda_props, cuda_created):
    info, p = rehearsal_host, CudaToolkitProvider()
    sh(info, "rm -f /usr/local/cuda-13.0/bin/nvcc")
    read = p.read(cuda_created.id, dict(cuda_created.outs))
    assert read.outs["version"] is None and p.diff(cuda_created.id, read.outs, dict(cuda_props)).changes
    assert p.update(cuda_created.id, read.outs, dict(cuda_props)).outs["version"] == "13.0"
    assert "reinstall" in sh(info, "tail -n 5 /var/log/apt/history.log")


def test_cuda_wrong_keyring_pin_installs_nothing(rehearsal_host, cuda_props, cuda_created):
    info, p = rehearsal_host, CudaToolkitProvider()
    sh(info, "apt-get remove -y -q cuda-toolkit-13-0", timeout=300)
    bad = {**cuda_props, "keyringSha256": "0" * 64}
    with pytest.raises(ssh.RemoteError, match="pins 0000.*not trusted, nothing installed"):
        p.update(cuda_created.id, cuda_created.outs, bad)
    assert info.run("test -e /usr/local/cuda-13.0/bin/nvcc").returncode != 0
    assert p.update(cuda_created.id, cuda_created.outs, dict(cuda_props)).outs["version"] == "13.0"


def test_cuda_verify_only_checks(rehearsal_host, cuda_props, cuda_created):
    p = CudaToolkitProvider()
    verify = {**cuda_props, **cuda_component.install_props(CudaSettings.model_validate({"version": "13.0", "install": "verify"})),
              "connection": cuda_props["connection"]}
    assert p.create(dict(verify)).outs["version"] == "13.0"
    other = {**verify, **cuda_component.install_props(CudaSettings.model_validate({"version": "12.8", "install": "verify"})),
             "connection": cuda_props["connection"]}
    with pytest.raises(ssh.RemoteError, match="cuda.install is verify .* /usr/local/cuda-12.8/bin/nvcc is missing"):
        p.create(dict(other))


def test_cuda_delete_leaves_the_toolkit(rehearsal_host, cuda_created):
    CudaToolkitProvider().delete(cuda_created.id, dict(cuda_created.outs))
    assert "release 13.0" in sh(rehearsal_host, "/usr/local/cuda-13.0/bin/nvcc --version")


# ---------------------------------------------------------------------------------------------
# Python venv

@pytest.fixture(scope="module")
def venv_props(rehearsal_host):
    rehearsal_host.run(f"rm -rf {VENV}")
    return {"connection": connection(rehearsal_host),
            **venv_component.install_props(VenvSettings.model_validate(
                {"path": VENV, "python": "3.11", "packages": [ENGINE], "wheelhouse": "rehearsal"}))}


@pytest.fixture(scope="module")
def venv_created(rehearsal_host, venv_props):
    return PythonVenvProvider().create(dict(venv_props))


def venv_state(info) -> str:
    """What a pip or venv run would change: site-packages, the venv's scripts, the wheelhouse."""
    return sh(info, f"find {VENV} {V.WHEELHOUSE_DIR} -newer /etc/hostname -printf '%p %s %T@\\n' | sort")


def test_venv_created_with_the_rehearsal_wheel(rehearsal_host, venv_props, venv_created):
    info, outs = rehearsal_host, venv_created.outs
    assert venv_created.id == f"{info.address}:{VENV}"
    assert outs["installed"] == {"sglang-rehearsal": "0.0.1+rehearsal"}
    assert outs["python"] == "3.11" and outs["packages"] == [ENGINE] and outs["pythonPath"] == f"{VENV}/bin/python"
    help_text = sh(info, f"{VENV}/bin/python -m sglang.launch_server --help")
    assert "--tp-size" in help_text or "--tensor-parallel-size" in help_text
    assert sh(info, f"sha256sum {V.WHEELHOUSE_DIR}/{shlex.quote(WHEEL)}").split()[0] == venv_props["wheelhouse"]["files"][WHEEL]


def test_venv_second_run_changes_nothing(rehearsal_host, venv_props, venv_created):
    info, p = rehearsal_host, PythonVenvProvider()
    before = venv_state(info)
    assert not p.diff(venv_created.id, venv_created.outs, dict(venv_props)).changes
    read = p.read(venv_created.id, dict(venv_created.outs))
    assert read.outs["installed"] == {"sglang-rehearsal": "0.0.1+rehearsal"} and read.inputs["packages"] == [ENGINE]
    assert not set(V.OUTPUT_KEYS) & set(read.inputs)
    assert not p.diff(venv_created.id, read.outs, dict(venv_props)).changes
    assert p.update(venv_created.id, venv_created.outs, dict(venv_props)).outs["installed"] == venv_created.outs["installed"]
    assert venv_state(info) == before


def test_venv_package_removed_by_hand_is_drift(rehearsal_host, venv_props, venv_created):
    info, p = rehearsal_host, PythonVenvProvider()
    sh(info, f"{VENV}/bin/python -m pip uninstall -y -q sglang-rehearsal")
    read = p.read(venv_created.id, dict(venv_created.outs))
    assert read.inputs["packages"] == ["sglang-rehearsal (not installed)"]
    assert p.diff(venv_created.id, read.outs, dict(venv_props)).changes
    # A second refresh still knows what was declared.
    assert p.read(venv_created.id, dict(read.outs)).inputs["packages"] == ["sglang-rehearsal (not installed)"]
    fixed = p.update(venv_created.id, read.outs, dict(venv_props))
    assert fixed.outs["packages"] == [ENGINE]
    sh(info, f"{VENV}/bin/python -m sglang.launch_server --help")


def test_venv_changed_wheel_is_pushed_and_reinstalled(rehearsal_host, venv_props, venv_created):
    info, p = rehearsal_host, PythonVenvProvider()
    # The host's copy of the wheel differs (as after a rebuild of the engine at the same version).
    sh(info, f"{VENV}/bin/python -c 'import sglang, pathlib; pathlib.Path(sglang.__file__).write_text(\"broken\")'")
    sh(info, f"echo stale > {V.WHEELHOUSE_DIR}/{shlex.quote(WHEEL)}")
    p.update(venv_created.id, venv_created.outs, dict(venv_props))
    assert sh(info, f"sha256sum {V.WHEELHOUSE_DIR}/{shlex.quote(WHEEL)}").split()[0] == venv_props["wheelhouse"]["files"][WHEEL]
    sh(info, f"{VENV}/bin/python -m sglang.launch_server --help")


def test_venv_missing_interpreter_is_a_clear_error(rehearsal_host, venv_props):
    props = {**venv_props, "path": "/root/venv-installers-py39", "python": "3.9"}
    with pytest.raises(ssh.RemoteError, match=r"python3\.9 is not installed on .*the host has Python 3\.11"):
        PythonVenvProvider().create(props)


def test_venv_delete_leaves_the_venv(rehearsal_host, venv_created):
    PythonVenvProvider().delete(venv_created.id, dict(venv_created.outs))
    sh(rehearsal_host, f"{VENV}/bin/python -m sglang.launch_server --help")
