"""Megatron-Bridge v0.1.0rc4 refuses DeepEP off Ampere and Hopper (``training/deepep.py``
``validate_deepep``): named, the job is a 422 at ``training.moe_dispatcher``; not named, its plans
on Blackwell do not list Bridge, while Megatron-LM (no such check) still runs them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from optimizer.service import plan
from optimizer.specs import PlanRequest


def _job(cluster: str, framework: str | None) -> dict[str, Any]:
    # fp32 gradient reduction: Bridge's bf16 recipe runs it, so it is a target with no framework named
    training: dict[str, Any] = {
        "seq_len": 4096, "global_batch_size": 512, "moe_dispatcher": "deepep", "grad_reduce_in_fp32": True,
    }  # fmt: skip
    if framework is not None:
        training["framework"] = framework
    return {
        "model": {"preset": "qwen3-30b-a3b"},
        "training": training,
        "cluster": {"preset": cluster, "num_gpus": 64},
        "search": {"top_k": 1, "fix": {"ep": 8, "zero_stage": 1}},
    }


def test_named_bridge_with_deepep_on_blackwell_is_a_422(client: TestClient) -> None:
    r = client.post("/plan", json=_job("dgx-b200", "megatron-bridge"))
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "training", "moe_dispatcher"]
    assert "ampere and hopper GPUs only" in err["msg"] and "blackwell" in err["msg"]
    assert client.post("/plan", json=_job("dgx-h100", "megatron-bridge")).status_code == 200


def test_unnamed_deepep_plans_on_blackwell_leave_bridge_out() -> None:
    blackwell = plan(PlanRequest.model_validate(_job("dgx-b200", None))).plans[0]
    assert "megatron-lm" in blackwell.frameworks and "megatron-bridge" not in blackwell.frameworks
    assert blackwell.launch.nemo == ""
    hopper = plan(PlanRequest.model_validate(_job("dgx-h100", None))).plans[0]
    assert {"megatron-lm", "megatron-bridge"} <= set(hopper.frameworks)
