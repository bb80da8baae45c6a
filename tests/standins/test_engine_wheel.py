"""The rehearsal engine builds into a wheel offline, installs into a fresh venv, and serves EP8 from it."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.standins.helpers import ENGINE_SRC, EP8_FLAGS, REPO, port_open, smi

sys.path.insert(0, str(REPO))
from rehearsal.engine_wheel import build  # noqa: E402


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with the engine wheel installed from a local directory only (no index)."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build(root / "dist")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--quiet", str(wheel)], check=True,
                   timeout=120)
    return python, wheel


def test_wheel_is_reproducible_and_complete(tmp_path):
    first, second = build(tmp_path / "a"), build(tmp_path / "b")
    assert first.name == "sglang_rehearsal-0.0.1+rehearsal-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert "sglang/launch_server.py" in names and "sglang/_rehearsal/rules.py" in names
    assert "sglang_rehearsal-0.0.1+rehearsal.dist-info/RECORD" in names


def test_installed_engine_reports_rehearsal(venv):
    python, _ = venv
    out = subprocess.run([str(python), "-c", "import sglang; print(sglang.__version__, sglang.__file__)"],
                         capture_output=True, text=True, cwd="/", check=True).stdout
    assert out.startswith("0.0.1+rehearsal ") and "site-packages" in out
    show = subprocess.run([str(python), "-m", "pip", "show", "sglang-rehearsal"], capture_output=True, text=True).stdout
    assert "Version: 0.0.1+rehearsal" in show


def test_ep8_from_the_venv_reaches_ready(venv, launch, engine_env, state_dir):
    """The founding scenario's EP8 flags on 8 x RTX PRO 6000: closed port, 503 warmup, then ready."""
    python, _ = venv
    env = engine_env("rtx-pro-6000-8", REHEARSAL_LOAD_SECONDS="1.5", REHEARSAL_WARMUP_SECONDS="1.5")
    del env["PYTHONPATH"]  # the installed wheel, not the source tree
    engine = launch(*EP8_FLAGS, python=str(python), env=env)

    assert engine.wait_log("Load weight begin"), engine.log
    assert not port_open(engine.port), "the port must stay closed while loading"
    assert engine.wait_log("rehearsal: HTTP server listening"), engine.log
    status, _ = engine.get("/health")
    assert status == 503, "health must answer 503 during warmup"
    engine.wait_ready()
    assert engine.get("/health")[0] == 200 and engine.get("/health_generate")[0] == 200

    status, info = engine.get("/server_info")
    assert status == 200
    assert (info["tp_size"], info["ep_size"], info["pp_size"], info["dp_size"]) == (8, 8, 1, 1)
    assert info["mem_fraction_static"] == 0.88 and info["context_length"] == 32768
    assert info["max_running_requests"] == 64 and info["attention_backend"] == "triton"
    assert info["grammar_backend"] == "none" and info["enable_dp_attention"] is False
    assert "rehearsal" in info["version"] and info["max_total_num_tokens"] > 0
    assert info["rehearsal"]["layout"]["num_local_experts"] == 48  # 384 experts / EP8

    # The simulated nvidia-smi sees the engine's memory.
    used = smi("rtx-pro-6000-8", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
               env={"REHEARSAL_GPU_STATE_DIR": str(state_dir)}).stdout.split()
    assert len(used) == 8 and all(int(u) > 80000 for u in used)

    assert engine.terminate() == 0
    assert not list(state_dir.iterdir()), "the usage record goes away with the engine"


def test_pip_wheel_builds_the_same_package(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ENGINE_SRC, src)  # pip builds in place; keep the work tree clean
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", str(src), "-w", str(tmp_path / "out")], check=True, timeout=300)
    (built,) = (tmp_path / "out").glob("*.whl")
    ours = build(tmp_path / "ours")
    assert built.name == ours.name
    def code(wheel):
        return sorted(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py"))
    assert code(built) == code(ours)
