"""ZeRO-3 with weights gathered on demand (``training.dp_comm_overlap`` false): the weight gathers
block compute, the gradient reduce-scatters hide under backward (``cost.dp_comm``)."""

from __future__ import annotations

import pytest

from optimizer.calibration import DEFAULT
from optimizer.cost import build_context
from optimizer.cost.dp_comm import ZERO3_REDUCE_SHARE, zero3_on_demand_s
from optimizer.specs import JobSpec, PlanRequest


def _ctx(grad_reduce_in_fp32: bool):
    req = PlanRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 4096, "global_batch_size": 64, "dp_comm_overlap": False,
                         "grad_reduce_in_fp32": grad_reduce_in_fp32},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        }
    )  # fmt: skip
    return build_context(JobSpec(model=req.model, training=req.training, cluster=req.cluster))


def test_reduce_share_is_one_of_the_three_collectives() -> None:
    # two weight gathers and one reduce-scatter of as many bytes
    assert ZERO3_REDUCE_SHARE == pytest.approx(1 / 3)


def test_hand_computed_exposure() -> None:
    """3 s of ZeRO-3 collectives, 16-bit gradients: 2 s of gathers block; the 1 s reduce-scatter
    hides under 0.9 x 0.5 s of backward, 0.55 s stays exposed and the hidden 0.45 s costs its
    contention: 2 + 0.92 x 0.55 + 0.08 x 1 = 2.586 s (``overlap_contention`` 0.08)."""
    ctx = _ctx(grad_reduce_in_fp32=False)
    c, ov = DEFAULT.overlap_contention, DEFAULT.dp_overlap
    assert (c, ov) == (0.08, 0.9)
    assert zero3_on_demand_s(ctx, 3.0, 0.5) == pytest.approx(2.0 + (1 - c) * 0.55 + c * 1.0)
    assert zero3_on_demand_s(ctx, 3.0, 0.5) == pytest.approx(2.586)
    # a long backward hides all of it but the contention; none: everything blocks
    assert zero3_on_demand_s(ctx, 3.0, 10.0) == pytest.approx(2.0 + c * 1.0)
    assert zero3_on_demand_s(ctx, 3.0, 0.0) == pytest.approx(3.0)


def test_fp32_gradients_extra_bytes_count_as_blocking() -> None:
    """4 s of collectives with fp32 gradients (2 + 2 units of gather, 2 of reduce-scatter): a
    third hides, the rest blocks; an upper estimate that never falls as gradients widen."""
    ctx = _ctx(grad_reduce_in_fp32=True)
    c = DEFAULT.overlap_contention
    assert zero3_on_demand_s(ctx, 4.0, 10.0) == pytest.approx(4.0 * 2 / 3 + c * 4.0 / 3)
    assert zero3_on_demand_s(ctx, 4.0, 10.0) > zero3_on_demand_s(_ctx(grad_reduce_in_fp32=False), 3.0, 10.0)


@pytest.mark.parametrize("bwd", [0.0, 0.3, 1.0, 5.0])
def test_never_below_the_gathers_nor_above_everything(bwd: float) -> None:
    ctx = _ctx(grad_reduce_in_fp32=False)
    exposed = zero3_on_demand_s(ctx, 3.0, bwd)
    assert 2.0 <= exposed <= 3.0
    assert zero3_on_demand_s(ctx, 3.0, bwd + 0.1) <= exposed  # more backward hides more
