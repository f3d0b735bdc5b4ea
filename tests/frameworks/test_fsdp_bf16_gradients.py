"""Megatron-FSDP (ZeRO-2/3) with bf16 gradients at Megatron-LM 000c4ac2: its 1/dp scaling hits
the accumulated shard instead of the reduced bucket (fixed upstream in ba456fdad9). Dense plans
average in the collective instead (``--ddp-average-in-collective``, no scaling); MoE plans, whose
expert gradients need a factor that averaging drops, run ZeRO-2/3 with fp32 gradients only."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from optimizer.errors import InvalidLayout
from optimizer.launch import MEGATRON_FLAGS
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, PlanRequest

DENSE = {"preset": "llama3-8b"}
MIXTRAL = {"preset": "mixtral-8x7b"}
AVERAGE = "--ddp-average-in-collective"


def _evaluate(model: dict[str, Any], zero_stage: int, **knobs: Any) -> Any:
    return evaluate(EvaluateRequest.model_validate({
        "model": model, "training": {"seq_len": 4096, "global_batch_size": 256, **knobs},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "config": {"tp": 1, "pp": 1, "ep": 8 if model is MIXTRAL else 1, "micro_batch_size": 1,
                   "zero_stage": zero_stage, "recompute": "full"},
    }))  # fmt: skip


@pytest.mark.parametrize(
    ("zero_stage", "knobs", "averaged"),
    [
        (3, {}, True),  # --bf16 --grad-reduce-in-bf16
        (2, {}, True),
        (3, {"grad_reduce_in_fp32": True}, False),  # fp32 gradients: NCCL premul-sum, correct
        (3, {"precision": "fp16"}, False),  # fp16 gradients: premul-sum too
        (1, {}, False),  # the distributed optimizer, not Megatron-FSDP
    ],
)
def test_dense_megatron_fsdp_plans_average_bf16_gradients_in_the_collective(
    zero_stage: int, knobs: dict[str, Any], averaged: bool
) -> None:
    p = _evaluate(DENSE, zero_stage, **knobs)
    assert "megatron-lm" in p.frameworks
    flags = shlex.split(p.launch.megatron)
    assert (AVERAGE in flags) is averaged
    assert AVERAGE in MEGATRON_FLAGS


def test_moe_megatron_fsdp_needs_fp32_gradients() -> None:
    bf16 = _evaluate(MIXTRAL, 3)
    assert "megatron-lm" not in bf16.frameworks
    assert any("ba456fdad9" in n for n in bf16.notes)
    fp32 = _evaluate(MIXTRAL, 3, grad_reduce_in_fp32=True)
    assert "megatron-lm" in fp32.frameworks and AVERAGE not in shlex.split(fp32.launch.megatron)
    # the distributed optimizer (ZeRO-1) is unaffected
    assert "megatron-lm" in _evaluate(MIXTRAL, 1).frameworks


def test_named_megatron_lm_moe_job_plans_no_fsdp_with_bf16_gradients() -> None:
    job = {
        "model": MIXTRAL,
        "training": {"seq_len": 4096, "global_batch_size": 256, "framework": "megatron-lm"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    }
    response = plan(PlanRequest.model_validate({**job, "search": {"top_k": 5}}))
    assert response.plans and all(p.config.zero_stage <= 1 for p in response.plans)
    with pytest.raises(InvalidLayout, match="zero_stage"):
        plan(PlanRequest.model_validate({**job, "search": {"fix": {"zero_stage": 3}}}))
