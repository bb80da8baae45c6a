"""A real Prometheus (Debian's, scripts/install-host-deps) for one test: on loopback, a port of its
own, its own data directory, started and stopped by its PID."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, config: Path, workdir: Path):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run scripts/install-host-deps (Debian's prometheus package)")
        self.port = _free_port()
        self.log_path = workdir / "prometheus.log"
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir))

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, **params) -> dict:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with _NO_PROXY.open(self.url(path + query), timeout=10) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                with _NO_PROXY.open(self.url("/-/ready"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"prometheus not ready in {timeout} s: {self.log()[-2000:]}")

    def query(self, expr: str) -> list[dict]:
        doc = self.get("/api/v1/query", query=expr)
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def wait_series(self, expr: str, timeout: float = 90) -> list[dict]:
        """The query's result once it has a series (scrapes run every scrape_interval)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(1)

    def targets(self) -> list[dict]:
        return self.get("/api/v1/targets")["data"]["activeTargets"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode
