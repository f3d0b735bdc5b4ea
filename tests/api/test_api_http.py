"""The API over real HTTP: ``uvicorn api.main:app`` in a subprocess on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs import LLAMA3_70B_ON_1024_H100, job_copy

ROOT = Path(__file__).resolve().parents[2]

JOB: dict[str, Any] = job_copy(LLAMA3_70B_ON_1024_H100)
SMALL_JOB: dict[str, Any] = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 256, "precision": "bf16"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    "search": {"top_k": 3, "time_limit_s": 20},
}

# A server whose planner is a one-second stand-in, to make pool saturation deterministic.
SLOW_SERVER = textwrap.dedent(
    """
    import sys, time
    import uvicorn
    from optimizer import service
    from optimizer.results import PlanResponse, SolverInfo

    def slow_plan(request):
        time.sleep(1.0)
        return PlanResponse(
            status="infeasible", plans=[], solver=SolverInfo(), explanation="stand-in"
        )

    service.plan = slow_plan
    from api.main import create_app
    uvicorn.run(create_app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=False)
    """
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def running_server(tmp_path: Path, env: dict[str, str], command: list[str] | None = None) -> Iterator[str]:
    """Start a server process, wait for /healthz, yield its base URL, stop it."""
    port = _free_port()
    argv = command or [
        sys.executable,
        "-m",
        "uvicorn",
        "api.main:app",
        "--host",
        "127.0.0.1",
        "--port",
    ]
    log_path = tmp_path / f"server-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*argv, str(port)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    pytest.fail(f"server exited with {process.returncode}:\n{log_path.read_text()}")
                try:
                    if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"server did not come up:\n{log_path.read_text()}")
                time.sleep(0.1)
            yield base_url
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {"PPLAN_SOLVER_WORKERS": "2", "PPLAN_MAX_QUEUE": "32", "PPLAN_LOG_LEVEL": "info"}
    with running_server(tmp_path_factory.mktemp("server"), env) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=300) as client:
        yield client


def test_healthz_and_request_id(http: httpx.Client) -> None:
    response = http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["X-Request-ID"]


def test_version(http: httpx.Client) -> None:
    body = http.get("/version").json()
    assert set(body) == {"version", "catalog_version"}
    assert body["version"] and body["catalog_version"]


@pytest.mark.parametrize(
    ("catalog", "entry_id"),
    [
        ("gpus", "h100-sxm-80gb"),
        ("networks", "ib-ndr-400"),
        ("clusters", "gb200-nvl72"),
        ("models", "deepseek-v3"),
    ],
)
def test_catalogs(http: httpx.Client, catalog: str, entry_id: str) -> None:
    listed = http.get(f"/{catalog}")
    assert listed.status_code == 200
    assert entry_id in {entry["id"] for entry in listed.json()}
    one = http.get(f"/{catalog}/{entry_id}")
    assert one.status_code == 200 and one.json()["id"] == entry_id
    missing = http.get(f"/{catalog}/nope")
    assert missing.status_code == 404
    assert entry_id in missing.json()["detail"]


def test_openapi_and_docs(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    assert schema["paths"]["/plan"]["post"]["operationId"] == "plan"
    assert http.get("/docs").status_code == 200


def test_invalid_request_is_422(http: httpx.Client) -> None:
    response = http.post("/plan", json={**JOB, "model": {"preset": "nope"}})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "model"]
    assert "valid ids" in response.json()["detail"][0]["msg"]


def test_declared_body_over_the_limit_is_413(http: httpx.Client) -> None:
    response = http.post(
        "/plan",
        content=b"{" + b" " * (8 << 20) + b"}",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413


def test_streamed_body_over_the_limit_is_413(http: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(144):  # 9 MiB, over the 8 MiB default
            yield b" " * (64 << 10)

    response = http.post("/plan", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_saturated_pool_answers_503_with_retry_after(tmp_path: Path) -> None:
    env = {"PPLAN_SOLVER_WORKERS": "1", "PPLAN_MAX_QUEUE": "0"}
    with (
        running_server(tmp_path, env, [sys.executable, "-c", SLOW_SERVER]) as base_url,
        httpx.Client(base_url=base_url, timeout=60) as client,
    ):
        with ThreadPoolExecutor(max_workers=6) as threads:
            responses = list(threads.map(lambda _: client.post("/plan", json=JOB), range(6)))
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 503}, statuses
        assert statuses.count(200) >= 1 and statuses.count(503) >= 1
        assert all(r.headers["Retry-After"] == "1" for r in responses if r.status_code == 503)
        assert client.post("/plan", json=JOB).status_code == 200  # the slot was given back


class TestRealService:
    """Through ``optimizer.service`` itself (no stand-ins)."""

    def test_evaluate(self, http: httpx.Client) -> None:
        config = {
            "tp": 8,
            "pp": 4,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "selective",
        }
        response = http.post("/evaluate", json={**JOB, "config": config})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["step_time_s"] > 0 and 0 < body["mfu"] < 1

    def test_evaluate_invalid_layout_is_422(self, http: httpx.Client) -> None:
        response = http.post("/evaluate", json={**JOB, "config": {"tp": 3, "pp": 4}})
        assert response.status_code == 422, response.text
        assert any("config" in item["loc"] for item in response.json()["detail"])

    def test_plan(self, http: httpx.Client) -> None:
        response = http.post("/plan", json=SMALL_JOB)
        assert response.status_code == 200, response.text
        assert response.json()["status"] in {"optimal", "feasible"}

    def test_twenty_simultaneous_plans_agree(self, http: httpx.Client) -> None:
        with ThreadPoolExecutor(max_workers=20) as threads:
            responses = list(threads.map(lambda _: http.post("/plan", json=SMALL_JOB), range(20)))
        assert [r.status_code for r in responses] == [200] * 20, [r.text for r in responses if r.status_code != 200]
        bodies = [r.json() for r in responses]
        assert bodies[0]["plans"]
        assert all(body["plans"] == bodies[0]["plans"] for body in bodies)
        assert len({r.headers["X-Request-ID"] for r in responses}) == 20
