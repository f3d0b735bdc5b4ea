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


def test_named_bridge_with_deepep_on_blackwell_runs_nowhere_as_costed(client: TestClient) -> None:
    """Like a stack knob the framework cannot select: planned within its layouts, no plan with
    an expert group claims to run on it, a note says why and the answer warns."""
    r = client.post("/plan", json=_job("dgx-b200", "megatron-bridge"))
    assert r.status_code == 200
    body = r.json()
    (top,) = body["plans"]
    assert top["config"]["ep"] == 8 and top["frameworks"] == [] and top["launch"]["nemo"] == ""
    assert any("runs moe_dispatcher 'deepep' on ampere and hopper GPUs only" in n for n in top["notes"])
    assert any(w.startswith("no framework's stack runs the job's model and training.* knobs") for w in body["warnings"])
    hopper = client.post("/plan", json=_job("dgx-h100", "megatron-bridge")).json()
    assert hopper["plans"][0]["frameworks"] == ["megatron-bridge"] and not hopper["warnings"]


def test_without_an_expert_group_deepep_is_not_launched_and_bridge_runs_it() -> None:
    """ep x etp = 1: the launch asks for the all-to-all dispatcher, which Bridge runs anywhere."""
    job = _job("dgx-b200", "megatron-bridge")
    job["search"]["fix"]["ep"] = 1
    top = plan(PlanRequest.model_validate(job)).plans[0]
    assert top.config.ep == 1 and top.frameworks == ["megatron-bridge"]


def test_a_sweep_over_hopper_and_blackwell_answers_each_point(client: TestClient) -> None:
    r = client.post("/sweeps", json={"job": {k: v for k, v in _job("dgx-h100", "megatron-bridge").items()
                                             if k != "search"}, "vary": {"cluster": ["dgx-h100", "dgx-b200"]}})  # fmt: skip
    assert r.status_code in (200, 201, 202), r.text


def test_unnamed_deepep_plans_on_blackwell_leave_bridge_out() -> None:
    blackwell = plan(PlanRequest.model_validate(_job("dgx-b200", None))).plans[0]
    assert "megatron-lm" in blackwell.frameworks and "megatron-bridge" not in blackwell.frameworks
    assert blackwell.launch.nemo == ""
    hopper = plan(PlanRequest.model_validate(_job("dgx-h100", None))).plans[0]
    assert {"megatron-lm", "megatron-bridge"} <= set(hopper.frameworks)
