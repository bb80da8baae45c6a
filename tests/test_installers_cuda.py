"""CUDA toolkit install: the pure parts, one JSON file a case (tests/data/installers/), and the
stand-in repository builder (local, no host)."""
import hashlib
import subprocess

import pytest

from components import cuda as cuda_component
from components.core import cuda as C
from components.core.config import CudaSettings
from components.remote import rehearsal_adapter

from .casedata import cases


def _ids(x):
    return x if isinstance(x, str) else ""


@pytest.mark.parametrize("name,case", cases("installers/apt-source"), ids=_ids)
def test_apt_source(name, case):
    if "error" in case:
        with pytest.raises(ValueError) as info:
            if "line" in case:
                C.parse_apt_line(case["line"])
            else:
                C.nvidia_repository(case["os_release"], case["arch"])
        assert case["error"] in str(info.value)
        return
    if case.get("rehearsal"):
        source = rehearsal_adapter.cuda_source()
    elif "line" in case:
        source = C.parse_apt_line(case["line"])
    else:
        source = C.nvidia_repository(case["os_release"], case["arch"])
    expect = case["expect"]
    assert source.line == expect["line"]
    assert source.keyring == expect["keyring"]
    assert source.keyring_url == expect["keyring_url"]
    # What is written to the host: our header, then exactly that one line; and it parses back.
    text = C.render_source_file(source)
    assert text.startswith("# Managed by gpu-serving") and text.endswith(expect["line"] + "\n")
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == [expect["line"]]
    assert C.parse_apt_line(source.line) == source


@pytest.mark.parametrize("name,case", cases("installers/cuda-settings"), ids=_ids)
def test_cuda_settings(name, case):
    problems = C.settings_problems(CudaSettings.model_validate(case["cuda"]))
    assert [p.setting for p in problems] == [e["setting"] for e in case["errors"]]
    for problem, expected in zip(problems, case["errors"]):
        assert expected["contains"] in str(problem)


@pytest.mark.parametrize("name,case", cases("installers/cuda-probe"), ids=_ids)
def test_cuda_probe_and_action(name, case):
    observed = C.parse_cuda_probe("\n".join(case["output"]) + "\n")
    for key, value in case.get("observed", {}).items():
        got = getattr(observed, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    d = case["declared"]
    action = C.cuda_action(version=d["version"], home=d["home"], install=d["install"], package=d["package"], observed=observed)
    assert action.action == case["expect"]["action"], action.reason
    assert list(action.packages) == case["expect"]["packages"]
    if "reason_contains" in case["expect"]:
        assert case["expect"]["reason_contains"] in action.reason


def test_probe_script_parses_real_nvcc_capture():
    # The nvcc part of the real H200 capture (tests/data/nvidia/h200-1gpu/cuda.txt).
    from .casedata import DATA
    capture = (DATA / "nvidia/h200-1gpu/cuda.txt").read_text().split("lrwxrwxrwx")[0]
    observed = C.parse_cuda_probe("@@nvcc\n" + capture + "@@package\n@@rc=1\n")
    assert (observed.nvcc_version, observed.nvcc_release) == ("13.0", "13.0.88")


def test_probe_script_runs_locally(tmp_path):
    """The probe is plain sh: run it here against a fake toolkit home."""
    home = tmp_path / "cuda-13.0"
    (home / "bin").mkdir(parents=True)
    (home / "bin/nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (home / "bin/nvcc").chmod(0o755)
    out = subprocess.run(["sh", "-c", C.PROBE_SCRIPT, "sh", str(home), "cuda-toolkit-13-0-not-a-package"],
                         capture_output=True, text=True, timeout=60).stdout
    observed = C.parse_cuda_probe(out)
    assert observed.nvcc_version == "13.0" and not observed.package_installed and observed.os_release.get("ID")
    missing = C.parse_cuda_probe(subprocess.run(["sh", "-c", C.PROBE_SCRIPT, "sh", str(tmp_path / "none"), "x"],
                                                capture_output=True, text=True, timeout=60).stdout)
    assert missing.nvcc_version is None


def test_install_props_nvidia_and_verify():
    props = cuda_component.install_props(CudaSettings.model_validate({"version": "13.0", "keyringSha256": "c" * 64}))
    assert props["aptPackage"] == "cuda-toolkit-13-0" and props["home"] == "/usr/local/cuda-13.0"
    assert props["rehearsalRepo"] is None and props["keyringSha256"] == "c" * 64 and props["aptRepository"] is None
    assert cuda_component.install_props(CudaSettings.model_validate({"install": "verify"}))["install"] == "verify"


# ---------------------------------------------------------------------------------------------
# The stand-in repository (built here, offline)

@pytest.fixture(scope="module")
def standin_repo(tmp_path_factory):
    from rehearsal.cuda import build_repo
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPU_SERVING_CACHE", str(cache))
    try:
        yield build_repo("13.0")
    finally:
        mp.undo()


def test_standin_repo_is_signed_and_pinned(standin_repo):
    info = standin_repo
    assert hashlib.sha256(info.keyring.read_bytes()).hexdigest() == info.keyring_sha256
    names = {p.name for p in info.repo_dir.iterdir()}
    debs = {n for n in names if n.endswith(".deb")}
    assert len(debs) == 1 and next(iter(debs)).startswith(f"cuda-toolkit-13-0_{info.package_version}_")
    assert names - debs == {"InRelease", "Packages", "Packages.gz", "Release", "Release.gpg"}
    # apt's own check: gpgv with exactly the pinned keyring accepts InRelease and Release.gpg.
    for argv in (["gpgv", "--keyring", str(info.keyring), str(info.repo_dir / "InRelease")],
                 ["gpgv", "--keyring", str(info.keyring), str(info.repo_dir / "Release.gpg"), str(info.repo_dir / "Release")]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    packages = (info.repo_dir / "Packages").read_text()
    assert "Package: cuda-toolkit-13-0\n" in packages and "Filename: ./cuda-toolkit-13-0_" in packages


def test_standin_package_installs_nvcc_in_the_real_format(standin_repo, tmp_path):
    deb = next(standin_repo.repo_dir.glob("*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True, timeout=60)
    nvcc = tmp_path / "usr/local/cuda-13.0/bin/nvcc"
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    assert "Cuda compilation tools, release 13.0, V13.0.88" in out
    assert C.parse_cuda_probe("@@nvcc\n" + out).nvcc_version == "13.0"
    assert (tmp_path / "usr/local/cuda-13.0/lib64").is_dir()


def test_standin_repo_is_cached_and_keeps_its_key(standin_repo, monkeypatch):
    from rehearsal.cuda import build_repo
    monkeypatch.setenv("GPU_SERVING_CACHE", str(standin_repo.root.parents[1]))
    stamp = (standin_repo.root / "build.json").stat().st_mtime_ns
    again = build_repo("13.0")
    assert again == standin_repo and (standin_repo.root / "build.json").stat().st_mtime_ns == stamp
    rebuilt = build_repo("13.0", force=True)
    # Rebuilt repository, same signing key: the pin users recorded stays valid.
    assert rebuilt.keyring_sha256 == standin_repo.keyring_sha256


def test_install_props_rehearsal_pins_the_built_keyring(standin_repo, monkeypatch):
    monkeypatch.setenv("GPU_SERVING_CACHE", str(standin_repo.root.parents[1]))
    props = cuda_component.install_props(CudaSettings.model_validate({"version": "13.0", "install": "apt", "aptRepository": "rehearsal"}))
    assert props["keyringSha256"] == standin_repo.keyring_sha256
    assert props["rehearsalRepo"] == {"localDir": str(standin_repo.repo_dir), "keyringFile": str(standin_repo.keyring),
                                      "remoteDir": rehearsal_adapter.CUDA_REPO_DIR}
    from components.core.errors import ConfigError
    with pytest.raises(ConfigError, match="does not match the rehearsal repository's keyring"):
        cuda_component.install_props(CudaSettings.model_validate({"aptRepository": "rehearsal", "keyringSha256": "d" * 64}))
