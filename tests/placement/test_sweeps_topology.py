"""Sweeps and the CLI table with ``cluster.topology``: points plan on the free nodes (or are a 422
naming the field), and ``pplan plan --format table`` prints the assignment and capacity lines."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_topology_placement import blocks_racks, job

from api import cli
from api.main import create_app
from api.settings import Settings

TIMEOUT_S = 120.0
TOPOLOGY = blocks_racks(1, 2, 4, busy={"gpu000"})  # 7 wholly free nodes, 56 GPUs
FREE = {n["name"] for n in TOPOLOGY["nodes"] if n["free_gpus"] == 8}


def topo_job(num_gpus: int | None) -> dict:
    body = copy.deepcopy(job(TOPOLOGY, num_gpus))
    body["training"]["total_tokens"] = 10**11
    body["search"] = {"time_limit_s": 20}
    return body


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(sweep_workers=1, max_sweeps_running=1))) as c:
        yield c


def run_sweep(client: TestClient, body: dict) -> dict:
    r = client.post("/sweeps", json=body)
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        status = client.get(f"/sweeps/{sweep_id}").json()
        if status["status"] != "running":
            return status
        time.sleep(0.2)
    raise AssertionError(f"sweep {sweep_id} still running after {TIMEOUT_S} s")


def test_sweep_over_counts_plans_on_the_free_nodes(client: TestClient) -> None:
    body = run_sweep(client, {"job": topo_job(16), "vary": {"num_gpus": [16, 32, 64]}})
    assert body["status"] == "done" and body["done"] == 3
    sixteen, thirty_two, sixty_four = body["results"]
    for res, n in ((sixteen, 16), (thirty_two, 32)):
        assert res["status"] == "done"
        nodes = res["plan"]["assignment"]["nodes"]
        assert len(nodes) == n // 8 and set(nodes) <= FREE
        # the point's plan is what /plan answers for the same job
        direct = client.post("/plan", json=topo_job(n)).json()["plans"][0]
        assert res["plan"]["step_time_s"] == direct["step_time_s"]
        assert res["plan"]["assignment"]["nodes"] == direct["assignment"]["nodes"]
    assert sixty_four["status"] == "infeasible"
    assert "asked for 64 GPUs; only 56 are free" in sixty_four["explanation"]
    assert {e["num_gpus"] for e in body["pareto"]} <= {16, 32}


def test_sweep_with_count_omitted_chooses_the_count_per_point(client: TestClient) -> None:
    """No GPU count in the job: no 500 (the price needs none); each point chooses its nodes."""
    body = run_sweep(client, {"job": topo_job(None), "vary": {"global_batch_size": [128, 256]}})
    assert body["status"] == "done", body
    for res, gbs in zip(body["results"], (128, 256), strict=True):
        assert res["status"] == "done"
        direct = copy.deepcopy(topo_job(None))
        direct["training"]["global_batch_size"] = gbs
        plan = client.post("/plan", json=direct).json()["plans"][0]
        assert res["plan"]["assignment"]["nodes"] == plan["assignment"]["nodes"]
        assert res["plan"]["tokens_per_s"] == pytest.approx(plan["tokens_per_s"])
    assert body["pareto"] and all(e["cost_usd"] > 0 for e in body["pareto"])


def test_sweep_over_a_cluster_the_nodes_do_not_fit_is_a_422(client: TestClient) -> None:
    r = client.post("/sweeps", json={"job": topo_job(16), "vary": {"cluster": ["dgx-h100", "gb200-nvl72"]}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "vary", "cluster", 1]  # the preset the topology does not fit
    assert "gb200-nvl72" in detail["msg"] and "topology.nodes" in detail["msg"] and "gpu001" in detail["msg"]


def test_a_sweep_keeps_a_bounded_number_of_node_assignments(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each point's plan keeps its assignment: points x nodes is bounded (a 422 at vary, before
    any point is validated)."""
    from optimizer.capacity import sweep

    monkeypatch.setattr(sweep, "MAX_SWEEP_NODE_ENTRIES", 3 * len(TOPOLOGY["nodes"]))
    r = client.post("/sweeps", json={"job": topo_job(None), "vary": {"global_batch_size": [64, 128, 256, 512]}})
    assert r.status_code == 422
    [detail] = r.json()["detail"]
    assert detail["loc"] == ["body", "vary"]
    n = len(TOPOLOGY["nodes"])
    assert detail["msg"].startswith(f"4 points on up to {n} of the {n} nodes each: each point's plan keeps")
    # a point's plan lists at most one node a GPU: 4 points of 4 GPUs fit the same bound
    small = sweep.SweepRequest(job=topo_job(4), vary={"global_batch_size": [64, 128, 256, 512]})
    assert small.node_entries_problem() is None


def _plan_table(tmp_path: Path, body: dict, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(body))
    code = cli.main(["plan", str(path), "--format", "table"])
    return code, capsys.readouterr().out


def test_plan_table_for_a_topology_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _plan_table(tmp_path, topo_job(None), capsys)
    assert code == 0
    lines = out.splitlines()
    nodes = next(x for x in lines if x.startswith("nodes (plan 1, rank order): "))
    assert set(nodes.split(": ", 1)[1].split()) <= FREE
    assert any(x.startswith("slurm: ") and "--nodelist=" in x for x in lines)
    capacity = next(x for x in lines if x.startswith("best plan: checkpoint"))
    assert "goodput 9" in capacity and " days, " in capacity and " USD" in capacity
    # a free set bounds the count: no suggested counts
    assert not any(x.startswith("suggestion:") for x in lines)


def test_plan_table_for_an_infeasible_topology_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _plan_table(tmp_path, topo_job(64), capsys)
    assert code != 0
    assert "status: infeasible" in out and "only 56 are free" in out
    assert "best plan:" not in out
