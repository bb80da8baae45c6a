"""Helpers for the stand-in tests: paths, loopback HTTP, and processes of the simulated tools."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "rehearsal" / "gpu"
NVIDIA_SMI = GPU_DIR / "nvidia_smi.py"
NVCC = GPU_DIR / "nvcc"
PROFILES = GPU_DIR / "profiles"
ENGINE_SRC = REPO / "rehearsal" / "engine"
MODELS = REPO / "rehearsal" / "models"
CAPTURE = REPO / "tests" / "data" / "nvidia" / "h200-1gpu"

# The founding scenario's EP8 command line (shared/notes/sglang.md), on loopback.
EP8_FLAGS = ["--tp-size", "8", "--ep-size", "8", "--mem-fraction-static", "0.88", "--context-length", "32768",
             "--max-running-requests", "64", "--attention-backend", "triton", "--trust-remote-code",
             "--grammar-backend", "none", "--host", "127.0.0.1"]


def model_dir(model: str) -> Path:
    """What an engine loads: the model's stand-in checkpoint (rehearsal/checkpoint.py: the real
    config.json, the index and small shards), as a rehearsal host mounts it at /models/<model>."""
    if "/" in model:
        return Path(model)  # a directory the test made (or did not), used as given
    from rehearsal.checkpoint import standin
    return standin(model)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http(method: str, port: int, path: str, body=None, headers=None, timeout=5.0):
    """(status, parsed JSON or text) for a request to the engine on loopback."""
    data = None
    headers = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode()


def smi(profile: str, *args, env=None) -> subprocess.CompletedProcess:
    full = {**os.environ, "REHEARSAL_GPU_PROFILE": str(PROFILES / f"{profile}.json"),
            "REHEARSAL_GPU_STATE_DIR": "/nonexistent-rehearsal-state", **(env or {})}
    return subprocess.run([sys.executable, str(NVIDIA_SMI), *args], capture_output=True, text=True,
                          env=full, timeout=30)


class Engine:
    """One rehearsal engine process; its combined output goes to a log file."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path):
        self.proc, self.port, self.log_path = proc, port, log_path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 15.0) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.log:
                return True
            if self.proc.poll() is not None:
                return text in self.log
            time.sleep(0.05)
        return False

    def wait_ready(self, timeout: float = 15.0):
        assert self.wait_log("The server is fired up and ready to roll!", timeout), self.log

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout=timeout)

    def get(self, path, **kw):
        return http("GET", self.port, path, **kw)

    def post(self, path, body=None, **kw):
        return http("POST", self.port, path, body=body, **kw)

    def terminate(self, timeout: float = 10.0) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)


def run_engine(env: dict, *flags, model="kimi-k2.6", timeout=30) -> subprocess.CompletedProcess:
    """Run an engine that is expected to exit on its own (a refused start)."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir(model)), *flags]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
