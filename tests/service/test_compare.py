"""POST /compare and `pplan compare`: one job under several layouts, each scored as /evaluate
scores it, with per-category deltas against the first layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.cli import main as pplan
from api.main import create_app
from api.settings import Settings
from optimizer.specs import MAX_COMPARE_LAYOUTS

JOB: dict[str, Any] = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_size": 1536},
    "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
}
MINE = {"tp": 8, "pp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "core_attn"}
"""Megatron-Core's selective recompute (the cost model's ``selective`` runs on no framework)."""
YOURS = {"tp": 4, "pp": 8, "vpp": 12, "micro_batch_size": 2, "zero_stage": 1, "recompute": "none"}
"""The planner's best layout with ``fix.vpp: 12`` (ZeRO-1: no framework runs ZeRO-2 with pipelines)."""


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def test_each_layout_is_what_evaluate_gives_and_deltas_are_against_the_first(client: TestClient) -> None:
    response = client.post("/compare", json={**JOB, "layouts": [MINE, YOURS, MINE]})
    assert response.status_code == 200, response.text
    entries = response.json()["entries"]
    assert len(entries) == 3
    for entry, layout in zip(entries, [MINE, YOURS, MINE], strict=True):
        alone = client.post("/evaluate", json={**JOB, "config": layout}).json()
        assert entry["plan"] == alone
    first, second, again = entries
    assert first["step_time_delta_s"] == 0 and first["time_deltas_s"] == {} and first["memory_deltas_gib"] == {}
    assert again["step_time_delta_s"] == 0 and again["time_deltas_s"] == {}
    assert "the same step time as layout 0" in again["summary"]
    a, b = first["plan"], second["plan"]
    assert second["step_time_delta_s"] == pytest.approx(b["step_time_s"] - a["step_time_s"])
    assert second["step_time_delta_s"] == pytest.approx(17.090 - 19.682, abs=2e-3)
    assert second["mfu_delta"] == pytest.approx(b["mfu"] - a["mfu"])
    ta, tb = a["time_breakdown_s"], b["time_breakdown_s"]
    assert second["time_deltas_s"] == pytest.approx({k: tb[k] - ta[k] for k in ta if abs(tb[k] - ta[k]) >= 1e-4})
    assert sum(second["time_deltas_s"].values()) == pytest.approx(second["step_time_delta_s"])
    assert second["memory_deltas_gib"]["total"] == pytest.approx(b["memory_gib"]["total"] - a["memory_gib"]["total"])
    # "why is my layout slower than yours": TP 8 pays tensor-parallel traffic, VPP 1 a larger bubble
    assert "faster than layout 0, mostly tp_comm -0.962 s, pp_bubble -0.912 s" in second["summary"]


@pytest.mark.parametrize("count", [1, MAX_COMPARE_LAYOUTS + 1])
def test_layout_count_is_bounded(client: TestClient, count: int) -> None:
    response = client.post("/compare", json={**JOB, "layouts": [MINE] * count})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "layouts"]


def test_invalid_layout_is_422_at_its_index_and_field(client: TestClient) -> None:
    response = client.post("/compare", json={**JOB, "layouts": [MINE, {**YOURS, "tp": 3}]})
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["loc"] == ["body", "layouts", 1, "tp"] and item["type"] == "invalid_layout"
    assert "does not divide num_gpus = 1024" in item["msg"]


def test_compare_is_in_the_openapi_schema(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/compare"]["post"]
    assert operation["operationId"] == "compare"


def test_pplan_compare_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({**JOB, "layouts": [MINE, YOURS]}))
    assert pplan(["compare", str(path), "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "delta_s" in out.splitlines()[0]
    assert "-2.592" in out and "layout 1 (TP4 PP8 DP32 VPP12" in out
    assert "24.7/79.0" in out  # memory against usable memory (80 GiB less headroom)
    assert pplan(["compare", str(path)]) == 0
    assert len(json.loads(capsys.readouterr().out)["entries"]) == 2


def test_a_job_error_is_located_at_the_job_not_a_layout(client: TestClient) -> None:
    job = {**JOB, "training": {**JOB["training"], "precision": "fp4"}}
    response = client.post("/compare", json={**job, "layouts": [MINE, YOURS]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "training", "precision"]


def test_openapi_example_is_a_valid_request(client: TestClient) -> None:
    from api.openapi_examples import COMPARE_EXAMPLES

    for example in COMPARE_EXAMPLES.values():
        response = client.post("/compare", json=example["value"])
        assert response.status_code == 200, response.text
        entries = response.json()["entries"]
        # interleaving 5 chunks a stage cuts the bubble of TP8 PP4
        assert entries[1]["time_deltas_s"]["pp_bubble"] < 0


def test_costs_and_reliability_reach_each_layout(client: TestClient) -> None:
    """/compare rebuilt the job from model, training and cluster only: a price, PUE and failure
    figures given with it were ignored (the catalog's 3.99 USD and 600 s restarts came back)."""
    extra = {
        "training": {**JOB["training"], "total_tokens": 1e12},
        "costs": {"price_per_gpu_hour_usd": 7.5, "pue": 2.0},
        "reliability": {"gpu_mtbf_hours": 50000, "restart_s": 900, "checkpoint_write_s": 100},
    }
    body = {**JOB, **extra}
    compared = client.post("/compare", json={**body, "layouts": [MINE, YOURS]})
    assert compared.status_code == 200, compared.text
    for layout, entry in zip((MINE, YOURS), compared.json()["entries"], strict=True):
        alone = client.post("/evaluate", json={**body, "config": layout}).json()
        plan = entry["plan"]
        assert plan["time_to_train"]["price_per_gpu_hour_usd"] == 7.5
        assert plan["time_to_train"]["pue"] == 2.0
        assert plan["goodput"]["restart_s"] == 900
        assert plan["time_to_train"] == alone["time_to_train"] and plan["goodput"] == alone["goodput"]


def test_evaluate_and_compare_take_the_plans_memory_headroom(client: TestClient) -> None:
    """/plan with search.memory_headroom_gib 0 returned a layout that /evaluate, with no way to
    say the same, judged out of memory (its 1 GiB default); both now take memory_headroom_gib."""
    job = {"model": {"preset": "gpt3-175b"}, "training": {"seq_len": 2048, "global_batch_size": 512},
           "cluster": {"preset": "dgx-h100", "num_gpus": 256}}  # fmt: skip
    fix = {"tp": 2, "pp": 16, "vpp": 5, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}
    planned = client.post("/plan", json={**job, "search": {"memory_headroom_gib": 0, "fix": fix}}).json()
    plan = planned["plans"][0]
    assert plan["fits_memory"] and plan["memory_gib"]["total"] > plan["memory_gib"]["capacity"] - 1.0
    layout = {k: plan["config"][k] for k in ("tp", "pp", "vpp", "micro_batch_size", "zero_stage", "recompute")}
    default = client.post("/evaluate", json={**job, "config": layout}).json()
    assert default["memory_gib"]["headroom"] == 1.0 and not default["fits_memory"]
    same = client.post("/evaluate", json={**job, "config": layout, "memory_headroom_gib": 0}).json()
    assert same["memory_gib"]["headroom"] == 0.0 and same["fits_memory"]
    assert same["step_time_s"] == plan["step_time_s"]
    compared = client.post("/compare", json={**job, "layouts": [layout, layout], "memory_headroom_gib": 0}).json()
    assert all(e["plan"]["fits_memory"] for e in compared["entries"])
