"""A real server for the robustness suite: ``python -m api.server`` on a loopback port.

Its limits are set low (``SERVER_ENV``) so that every bound is reached within seconds; the
tests assert the bounds these settings promise.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

MAX_TIME_LIMIT_S = 3.0
GRACE_S = 2.0
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 1000
SEARCH_MEMORY_MIB = 64
SERVER_ENV = {
    "PPLAN_MAX_TIME_LIMIT_S": str(MAX_TIME_LIMIT_S),
    "PPLAN_DEFAULT_TIME_LIMIT_S": "2",
    "PPLAN_TIME_LIMIT_GRACE_S": str(GRACE_S),
    "PPLAN_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "PPLAN_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    "PPLAN_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "PPLAN_SEARCH_MEMORY_MIB": str(SEARCH_MEMORY_MIB),
    "PPLAN_SOLVER_WORKERS": "1",
    "PPLAN_MAX_QUEUE": "8",
    "PPLAN_LOG_LEVEL": "info",
}


@dataclass
class Server:
    url: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def rss_bytes(self) -> int:
        """Resident memory of the server process (from /proc)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "stderr.log"
    env = {**os.environ, **SERVER_ENV, "PPLAN_HOST": "127.0.0.1", "PPLAN_PORT": str(port)}
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "api.server"], cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield Server(url, "127.0.0.1", port, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture()
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
