"""A named framework that runs no job of the model (an MoE model on DeepSpeed or, without shared
experts, on torchtitan; fp16 on torchtitan) is a 422 at ``training.framework`` or
``training.precision`` from /plan and sweeps: no plan could name it. /evaluate still scores a
layout and says in its notes that no framework runs it."""

from __future__ import annotations

from fastapi.testclient import TestClient

MIXTRAL = {
    "model": {"preset": "mixtral-8x22b"},
    "training": {"seq_len": 4096, "global_batch_size": 256, "framework": "deepspeed"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
}


def test_plan_of_a_model_the_framework_runs_none_of_is_a_422(client: TestClient) -> None:
    r = client.post("/plan", json=MIXTRAL)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "training", "framework"]
    assert item["msg"].startswith("DeepSpeed does not run an MoE model: its MoE layer gates top-1 or top-2 only")
    assert item["msg"].endswith("name another framework, or none")
    # with no framework named the same job plans on Megatron
    free = client.post("/plan", json={**MIXTRAL, "training": {**MIXTRAL["training"], "framework": None}})
    assert free.status_code == 200 and free.json()["plans"][0]["frameworks"]


def test_a_precision_the_framework_runs_no_job_in_is_a_422_at_the_precision(client: TestClient) -> None:
    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64,
           "framework": "torchtitan", "precision": "fp16"}, "cluster": {"preset": "dgx-h100", "num_gpus": 8}}  # fmt: skip
    r = client.post("/plan", json=job)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "training", "precision"]
    assert "torchtitan does not run training.precision 'fp16'" in item["msg"]


def test_a_sweep_of_it_is_a_422_and_evaluate_still_scores(client: TestClient) -> None:
    r = client.post("/sweeps", json={"job": MIXTRAL, "vary": {"num_gpus": [64, 128]}})
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "job", "training", "framework"]
    one = client.post("/evaluate", json={**MIXTRAL, "config": {"tp": 1, "pp": 1, "ep": 8, "zero_stage": 1}})
    assert one.status_code == 200, one.text
    assert one.json()["frameworks"] == []
    assert any("gates top-1 or top-2 only" in n for n in one.json()["notes"])


def test_a_topology_sweep_that_chooses_its_gpu_count_is_a_422_too(client: TestClient) -> None:
    """A topology job without num_gpus (the planner chooses the count) still cannot name the
    framework at any count: the sweep is refused as /plan refuses the job."""
    import json
    from pathlib import Path

    body = json.loads((Path(__file__).parents[2] / "examples" / "scheduler" / "plan-on-kueue.json").read_text())
    body["model"] = {"preset": "mixtral-8x7b"}
    body["training"] = {**body["training"], "framework": "deepspeed"}
    body["cluster"].pop("num_gpus", None)
    body.pop("search", None)
    r = client.post("/sweeps", json={"job": body, "vary": {"global_batch_size": [64, 128]}})
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    assert item["loc"] == ["body", "job", "training", "framework"]
