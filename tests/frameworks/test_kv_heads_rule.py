"""Tensor parallelism splits key/value heads, never replicates them: Megatron-Core (and the Bridge
models built on it) raise when ``num_query_groups`` is not a multiple of the TP size, and
torchtitan's column-wise ``wk`` / ``wv`` cannot be viewed as heads when TP exceeds them. The
layout rules (and so ``/evaluate``) still accept a TP that is a multiple of the key/value heads;
such a layout runs on no framework and says so."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import app
from optimizer.frameworks import FRAMEWORK_IDS, profile
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, PlanRequest

KV4 = {
    "name": "kv4",
    "num_layers": 40,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_kv_heads": 4,
    "ffn_hidden_size": 28672,
    "vocab_size": 128256,
}
JOB = {
    "model": KV4,
    "training": {"seq_len": 4096, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
}


@pytest.mark.parametrize("fid", FRAMEWORK_IDS)
def test_every_framework_needs_tp_to_divide_the_kv_heads(fid: str) -> None:
    prof = profile(fid)
    assert prof.heads_problem(4, 8) is not None and "num_kv_heads (4)" in prof.heads_problem(4, 8)
    assert prof.heads_problem(4, 4) is None and prof.heads_problem(4, 2) is None
    assert prof.heads_problem(None, 16) is None  # MLA: no key/value heads to split


@pytest.mark.parametrize("framework", [None, "megatron-lm", "torchtitan"])
def test_plans_keep_tp_within_the_kv_heads(framework: str | None) -> None:
    training = {**JOB["training"], **({"framework": framework} if framework else {})}
    response = plan(PlanRequest.model_validate({**JOB, "training": training, "search": {"top_k": 5}}))
    assert response.status == "optimal" and response.plans
    for p in response.plans:
        assert 4 % p.config.tp == 0 and p.frameworks, (p.config.tp, p.frameworks)


def test_a_layout_replicating_kv_heads_is_scored_and_runs_nowhere() -> None:
    est = evaluate(EvaluateRequest.model_validate({**JOB, "config": {"tp": 8, "pp": 1, "micro_batch_size": 1}}))
    assert est.frameworks == []
    assert any("to divide num_kv_heads (4)" in n for n in est.notes)


@pytest.mark.parametrize("framework", [None, "megatron-bridge"])
def test_a_pinned_tp_no_framework_runs_is_a_422_at_its_field(framework: str | None) -> None:
    training = {"seq_len": 8192, "global_batch_size": 32, **({"framework": framework} if framework else {})}
    body = {"model": {"preset": "llama3-8b"}, "training": training, "cluster": {"preset": "dgx-h100", "num_gpus": 16}}
    response = TestClient(app).post("/plan", json={**body, "search": {"fix": {"tp": 16}}})
    assert response.status_code == 422, response.text
    item = response.json()["detail"][0]
    assert item["loc"] == ["body", "search", "fix", "tp"]
    assert "needs tp (16) to divide num_kv_heads (8)" in item["msg"]
    allowed = TestClient(app).post("/plan", json={**body, "search": {"allow": {"tp": [16]}}})
    assert allowed.status_code == 422 and allowed.json()["detail"][0]["loc"] == ["body", "search", "allow", "tp"]
