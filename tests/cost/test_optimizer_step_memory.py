"""The optimizer step's fp32 copy of 16-bit gradients (``memory.step_grad_copy_bytes``).

Adam steps fp32 master weights with fp32 gradients: with 16-bit gradients Megatron-Core's
optimizers make ``main_grad.float()`` of the shard they update (DeepSpeed's ZeRO-1/2 casts its
partition the same way), after the activations are freed. The peak is the larger of the two."""

from __future__ import annotations

import pytest

from optimizer import service
from optimizer.specs import EvaluateRequest, PlanRequest

LLAMA70B_16 = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 4096, "global_batch_size": 32, "framework": "megatron-lm"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
}
CONFIG = {"tp": 8, "pp": 2, "micro_batch_size": 1, "zero_stage": 0, "recompute": "full"}


def _stages(fp32_grads: bool, zero_stage: int = 0, recompute: str = "full", num_gpus: int = 16):
    """Every pipeline stage's memory (GiB) of the layout, and the plan's peak."""
    plan = service.evaluate(EvaluateRequest.model_validate({
        **LLAMA70B_16,
        "training": {**LLAMA70B_16["training"], "grad_reduce_in_fp32": fp32_grads},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "config": {**CONFIG, "zero_stage": zero_stage, "recompute": recompute},
    }))  # fmt: skip
    return plan.memory_gib.per_stage, plan.memory_gib.total


def test_zero0_bf16_gradients_step_copy_is_twice_the_weights_less_the_activations() -> None:
    """ZeRO-0: the step copies every gradient of the stage to fp32, 4 bytes a parameter, twice the
    bf16 weights' 2; the freed activations (full recompute: a few GiB) take part of its place."""
    stages, peak = _stages(fp32_grads=False)
    for mem in stages:
        assert mem.optimizer_step == pytest.approx(2 * mem.weights - mem.activations)
        assert mem.optimizer_step > 10  # GiB: 70B / 16 GPUs is 4.4 G parameters a GPU
    # the bf16 gradients with their step copy need more than fp32 gradients used in place
    assert peak > _stages(fp32_grads=True)[1]


def test_fp32_gradients_need_no_step_copy() -> None:
    for mem in _stages(fp32_grads=True)[0]:
        assert mem.optimizer_step == 0.0


def test_distributed_optimizer_copies_only_its_shard() -> None:
    """ZeRO-1 over dp = 4 (TP8 PP2 on 64 GPUs): the copy is 4 bytes per parameter of the 1/4
    shard, a third of its 12 bytes of state, and smaller than the activations without recompute."""
    stages, _ = _stages(fp32_grads=False, zero_stage=1, recompute="full", num_gpus=64)
    # stage 0: 4.41 G parameters (8.215 GiB of bf16 weights) over 4 ranks, 4 bytes each: 4.107 GiB,
    # less its 0.756 GiB of activations
    assert (stages[0].weights, stages[0].activations) == pytest.approx((8.215, 0.756), abs=5e-4)
    assert stages[0].optimizer_step == pytest.approx(8.215 / 2 - 0.756, abs=1e-3)
    none, _ = _stages(fp32_grads=False, zero_stage=1, recompute="none", num_gpus=64)
    assert all(m.optimizer_step == 0.0 for m in none)


def test_infeasible_answer_names_the_step_copy_and_fp32_gradients_fit() -> None:
    """Llama 3 70B on 16 H100 under Megatron-LM: 16 + 4 bytes a parameter at dp = 1 with bf16
    gradients do not fit in 80 GB; with fp32 gradients (18 bytes) the full-recompute plan does."""
    bf16 = service.plan(PlanRequest.model_validate({**LLAMA70B_16, "search": {"top_k": 1}}))
    assert bf16.status == "infeasible"
    assert "the optimizer step's fp32 copy of the 16-bit gradients needs 5.6 GiB of it beyond" in (
        bf16.explanation or ""
    )
    # the smallest layout without recompute; with fp32 gradients and full recompute it fits
    assert "with fp32 gradients (training.grad_reduce_in_fp32) and full recompute the same layout needs 77.9 GiB" in (
        bf16.explanation or ""
    )
    fp32 = service.plan(PlanRequest.model_validate({
        **LLAMA70B_16,
        "training": {**LLAMA70B_16["training"], "grad_reduce_in_fp32": True},
        "search": {"top_k": 1},
    }))  # fmt: skip
    assert fp32.status == "optimal" and fp32.plans[0].fits_memory
    assert fp32.plans[0].memory_gib.optimizer_step == 0.0


def test_the_fp32_hint_is_given_only_where_it_fits() -> None:
    """ZeRO-1 over 4 ranks on 36 GiB: fp32 gradients (2 more bytes a parameter, unsharded) would
    need more than the 4 / 4 bytes of the copy, so the answer names the copy only."""
    answer = service.plan(PlanRequest.model_validate({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "framework": "megatron-lm"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64, "gpu_memory_gib": 36},
        "search": {"fix": {"tp": 8, "pp": 2}},
    }))  # fmt: skip
    assert answer.status == "infeasible"
    assert "fp32 copy of the 16-bit gradients needs 2.6 GiB" in (answer.explanation or "")
    assert "with fp32 gradients" not in (answer.explanation or "")


def _deepspeed_stage0(num_gpus: int, zero_stage: int) -> float:
    """The first stage's optimizer_step (GiB) of Llama 3 70B on DeepSpeed, TP8 PP1 and seq 1024
    (activations under 1 GiB with full recompute, so the copy shows almost whole)."""
    plan = service.evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 1024, "global_batch_size": 64, "framework": "deepspeed"},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "config": {"tp": 8, "pp": 1, "micro_batch_size": 1, "zero_stage": zero_stage, "recompute": "full"},
    }))  # fmt: skip
    mem = plan.memory_gib.per_stage[0]
    return mem.optimizer_step + mem.activations, mem.weights


def test_deepspeed_zero2_casts_its_whole_partition() -> None:
    """DeepSpeed ZeRO-1/2 casts its whole partition to fp32 at once: 4 B a parameter of the shard
    (dp 2: half of the stage's 8.8 G parameters)."""
    for zero_stage in (1, 2):
        held, weights = _deepspeed_stage0(num_gpus=16, zero_stage=zero_stage)
        assert held == pytest.approx(weights / 2 / 2 * 4, rel=1e-6)


def test_deepspeed_zero3_copies_one_sub_group_at_a_time() -> None:
    """ZeRO-3 on 16 GPUs (dp 2): the shard is 70.6 G / 8 / 2 = 4.41 G parameters, but the step
    casts one 1e9-element sub group at a time: 4e9 bytes (3.73 GiB), not 4 x 4.41e9 (Megatron-FSDP's
    copy of its whole shard)."""
    held, weights = _deepspeed_stage0(num_gpus=16, zero_stage=3)
    assert weights * 2**30 / 2 > 4e9  # the shard's bf16 weights: over 4 G parameters
    assert held == pytest.approx(4e9 / 2**30, rel=1e-6)
