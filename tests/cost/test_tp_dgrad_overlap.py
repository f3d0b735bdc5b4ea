"""``training.tp_dgrad_overlap``: the backward's column-parallel TP collectives under the GEMMs, as
Megatron-Core's linear layers run them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.calibration import DEFAULT
from optimizer.cost.layer_comm import dgrad_overlap_s
from tests.cost.cost_helpers import _scored

C = DEFAULT.overlap_contention


class _Ctx:
    cal = DEFAULT


def test_dgrad_overlap_hand_example() -> None:
    """An all-reduce of 1 ms under a 0.3 ms GEMM: 0.7 ms exposed, the hidden 0.3 ms at the
    contention share, 0.92 x 0.7 + 0.08 x 1.0 = 0.724 ms. With sequence parallelism a re-gather
    and a reduce-scatter of 0.5 ms each, each under its own 0.3 ms GEMM: 2 x (0.92 x 0.2 + 0.08 x
    0.5) = 0.448 ms. A window longer than the collective leaves only the contention share."""
    ctx = _Ctx()
    assert dgrad_overlap_s(ctx, 1e-3, False, 0.3e-3) == pytest.approx(0.724e-3)  # type: ignore[arg-type]
    assert dgrad_overlap_s(ctx, 1e-3, True, 0.3e-3) == pytest.approx(0.448e-3)  # type: ignore[arg-type]
    assert dgrad_overlap_s(ctx, 1e-3, False, 5e-3) == pytest.approx(C * 1e-3)  # type: ignore[arg-type]
    assert dgrad_overlap_s(ctx, 1e-3, True, 0.0) == pytest.approx(1e-3)  # type: ignore[arg-type]


@given(
    per_ar=st.floats(1e-6, 1e-1),
    window=st.floats(0.0, 1e-1),
    longer=st.floats(0.0, 1e-1),
    sp=st.booleans(),
)
def test_dgrad_overlap_is_bounded_and_falls_with_the_window(
    per_ar: float, window: float, longer: float, sp: bool
) -> None:
    ctx = _Ctx()
    t = dgrad_overlap_s(ctx, per_ar, sp, window)  # type: ignore[arg-type]
    assert C * per_ar * (1 - 1e-9) <= t <= per_ar * (1 + 1e-9)
    assert dgrad_overlap_s(ctx, per_ar, sp, window + longer) <= t * (1 + 1e-12)  # type: ignore[arg-type]


def _breakdown(sp: bool, overlap: bool, recompute: str = "none") -> dict[str, float]:
    return _scored(
        "llama3-70b",
        "dgx-h100",
        64,
        {"seq_len": 8192, "global_batch_size": 64, "tp_dgrad_overlap": overlap},
        tp=8,
        pp=1,
        micro_batch_size=1,
        zero_stage=1,
        sequence_parallel=sp,
        recompute=recompute,
    )[1].breakdown_s


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_without_sequence_parallel_it_hides_backward_all_reduces_and_nothing_else(recompute: str) -> None:
    """Without SP the forward's two all-reduces (and full recompute's two more) stay blocking and
    the backward's two run under GEMMs: the TP time falls, by at most the backward's share
    (less the contention share), and no other term moves."""
    off, on = _breakdown(False, False, recompute), _breakdown(False, True, recompute)
    count = 4 + (2 if recompute == "full" else 0)
    per_block = off["tp_comm"] / count  # one all-reduce, in step seconds
    assert off["tp_comm"] - 2 * (1 - C) * per_block <= on["tp_comm"] * (1 + 1e-9)
    assert on["tp_comm"] < off["tp_comm"]
    assert {k: v for k, v in on.items() if k != "tp_comm"} == pytest.approx(
        {k: v for k, v in off.items() if k != "tp_comm"}
    )


def test_with_sequence_parallel_the_gradient_gathers_still_block() -> None:
    """With SP the row-parallel output's gradient all-gather (half an all-reduce per block) blocks,
    and the re-gather Megatron adds runs under the input-gradient GEMM: never less than the
    forward's and that gather, 2.5 all-reduce equivalents of 4."""
    off, on = _breakdown(True, False), _breakdown(True, True)
    per_block = off["tp_comm"] / 4
    assert on["tp_comm"] >= 3 * per_block * (1 - 1e-9)
    assert on["tp_comm"] <= 3 * per_block + 2 * per_block * (1 + 1e-9)
