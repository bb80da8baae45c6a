"""Fixtures for the stand-in tests: the simulated nvidia-smi and the rehearsal engine, for real.

Every engine runs as a real process on loopback, on a port chosen at run time, and is killed
(by its own PID) when the test ends. Nothing is mocked.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins.helpers import ENGINE_SRC, NVIDIA_SMI, PROFILES, Engine, free_port, model_dir


@pytest.fixture
def state_dir(tmp_path) -> Path:
    d = tmp_path / "gpu-state"
    d.mkdir()
    return d


@pytest.fixture
def engine_env(state_dir):
    """The environment a rehearsal host gives the engine, pointed at this test's files."""
    def make(profile: str = "rtx-pro-6000-8", **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REHEARSAL_", "CUDA_VISIBLE", "SGLANG_"))}
        env.update({
            "PYTHONPATH": str(ENGINE_SRC),
            "REHEARSAL_NVIDIA_SMI": str(NVIDIA_SMI),
            "REHEARSAL_GPU_PROFILE": str(PROFILES / f"{profile}.json"),
            "REHEARSAL_GPU_STATE_DIR": str(state_dir),
            "REHEARSAL_LOAD_SECONDS": "0",
            "REHEARSAL_WARMUP_SECONDS": "0.2",
        })
        env.update({k: str(v) for k, v in extra.items()})
        return env
    return make


@pytest.fixture
def launch(tmp_path, engine_env):
    """Start engines; every one still running at teardown is killed by its PID."""
    started: list[Engine] = []

    def start(*flags, model="kimi-k2.6", python=sys.executable, env=None, port=None, with_port=True) -> Engine:
        port = port or free_port()
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(model_dir(model)), *flags]
        if with_port:
            argv += ["--port", str(port)]
        log_path = tmp_path / f"engine-{len(started)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env or engine_env(),
                                    cwd=str(tmp_path))
        engine = Engine(proc, port, log_path)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        if engine.proc.poll() is None:
            engine.proc.kill()
            engine.proc.wait(timeout=10)
