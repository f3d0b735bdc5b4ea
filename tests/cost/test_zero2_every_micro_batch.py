"""ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters every micro-batch's
(Megatron-FSDP ``optim_grads``, DeepSpeed stage 2); ZeRO-1 reduces once per step
(``cost.dp_comm.gradient_exposed_s``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.calibration import DEFAULT
from optimizer.cost import build_context
from optimizer.cost.dp_comm import gradient_exposed_s
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec, PlanRequest

LLAMA_8B_64: dict = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 512},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
}


def _ctx():
    req = PlanRequest.model_validate(LLAMA_8B_64)
    return build_context(JobSpec(model=req.model, training=req.training, cluster=req.cluster))


def test_hand_computed_exposure() -> None:
    """A 0.5 s reduce-scatter pass, 4 micro-batches of 0.3 s compute (0.2 s of it backward):
    ZeRO-1 hides 0.9 x 0.2 s of its one pass, 0.32 s exposed, plus the contention of the hidden
    0.18 s: 0.92 x 0.32 + 0.08 x 0.5 = 0.3344 s. ZeRO-2 queues 4 passes (2 s) under
    0.9 x (3 x 0.3 + 0.2) = 0.99 s of compute: 1.01 s exposed, 0.92 x 1.01 + 0.08 x 2 = 1.0892 s."""
    ctx = _ctx()
    c, ov = DEFAULT.overlap_contention, DEFAULT.dp_overlap
    assert (c, ov) == (0.08, 0.9)
    assert gradient_exposed_s(ctx, 1, 4, 0.5, 0.0, 0.3, 0.2) == pytest.approx(0.3344)
    assert gradient_exposed_s(ctx, 2, 4, 0.5, 0.0, 0.3, 0.2) == pytest.approx(1.0892)
    # one micro-batch: the same single pass
    assert gradient_exposed_s(ctx, 2, 1, 0.5, 0.0, 0.3, 0.2) == pytest.approx(0.3344)
    # long compute hides all but the contention, and the last pass still needs its own backward
    assert gradient_exposed_s(ctx, 2, 4, 0.5, 0.0, 10.0, 0.2) == pytest.approx((1 - c) * 0.32 + c * 2.0)


@given(
    m=st.integers(1, 64),
    t_b=st.floats(0.0, 5.0),
    unhidden=st.floats(0.0, 0.1),
    fwd=st.floats(0.0, 2.0),
    bwd=st.floats(0.0, 4.0),
)
def test_zero2_never_below_zero1_nor_above_blocking(
    m: int, t_b: float, unhidden: float, fwd: float, bwd: float
) -> None:
    ctx = _ctx()
    unhidden = min(unhidden, t_b)
    z1 = gradient_exposed_s(ctx, 1, m, t_b, unhidden, fwd + bwd, bwd)
    z2 = gradient_exposed_s(ctx, 2, m, t_b, unhidden, fwd + bwd, bwd)
    assert z1 - 1e-12 <= z2 <= m * t_b + 1e-12
    assert gradient_exposed_s(ctx, 2, m + 1, t_b, unhidden, fwd + bwd, bwd) >= z2 - 1e-12


def _step_s(zero_stage: int, global_batch_size: int) -> float:
    job = {**LLAMA_8B_64, "training": {**LLAMA_8B_64["training"], "global_batch_size": global_batch_size}}
    config = {"tp": 1, "pp": 1, "dp": 64, "micro_batch_size": 1, "zero_stage": zero_stage, "recompute": "none"}
    return evaluate(EvaluateRequest.model_validate({**job, "config": config})).step_time_s


def test_layouts_differ_only_with_several_micro_batches() -> None:
    """Llama 3 8B on 64 H100, DP64: with one micro-batch ZeRO-1 and ZeRO-2 step alike; with 8
    the eight reduce-scatters of 16 GB of bf16 gradients cost ZeRO-2 time ZeRO-1 does not pay."""
    assert _step_s(2, 64) == pytest.approx(_step_s(1, 64), rel=1e-9)
    assert _step_s(2, 512) > _step_s(1, 512) * 1.01
