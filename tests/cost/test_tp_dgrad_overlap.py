"""``training.tp_dgrad_overlap``: the backward's column-parallel TP collectives under the GEMMs, as
Megatron-Core's linear layers run them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.calibration import DEFAULT
from optimizer.cost import Estimate, build_context
from optimizer.cost.comm import hierarchical_allreduce_time_s
from optimizer.cost.context import JobContext
from optimizer.cost.layer import column_share_attention
from optimizer.cost.layer_comm import dgrad_overlap_s, tp_block_widths, tp_blocks, tp_comm_s
from optimizer.cost.rules import Dims
from optimizer.cost.topology import group_geometry
from optimizer.specs import JobSpec
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


def _tp8(model: str, num_gpus: int, sp: bool, overlap: bool, recompute: str = "none") -> Estimate:
    """``model`` at TP8 without pipelines on ``num_gpus`` H100, one sequence of 8,192 tokens a GPU."""
    training = {"seq_len": 8192, "global_batch_size": num_gpus, "tp_dgrad_overlap": overlap}
    layout = {"tp": 8, "pp": 1, "micro_batch_size": 1, "zero_stage": 1}
    return _scored(model, "dgx-h100", num_gpus, training, **layout, sequence_parallel=sp, recompute=recompute)[1]


def _breakdown(sp: bool, overlap: bool, recompute: str = "none") -> dict[str, float]:
    return _tp8("llama3-70b", 64, sp, overlap, recompute).breakdown_s


def _context(preset: str, **training: object) -> JobContext:
    """The cost context of ``preset`` on 64 H100 (4,096-token sequences)."""
    job = JobSpec(model={"preset": preset}, training={"seq_len": 4096, "global_batch_size": 64, **training},
                  cluster={"preset": "dgx-h100", "num_gpus": 64})  # fmt: skip
    return build_context(job)


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


def test_userbuffers_deferred_wgrad_and_op_recompute() -> None:
    """With GEMM/collective overlap hiding half (``hidden`` 0.5, exposed share 1 - 0.5 x 0.92 =
    0.54) and no window, each collective costs the smaller of the two: 0.54 of it. With the
    weight-gradient GEMM deferred (``--delay-wgrad-compute``) the input-gradient collective has no
    window: exposed whole without SP, the re-gather alone hidden with it. Without the re-gather
    (op recompute re-runs the forward all-gathers) only the reduce-scatter is left."""
    ctx = _Ctx()
    ub = 1 - 0.5 * (1 - C)
    assert dgrad_overlap_s(ctx, 1e-3, True, 0.0, hidden=0.5) == pytest.approx(ub * 1e-3)  # type: ignore[arg-type]
    assert dgrad_overlap_s(ctx, 1e-3, False, 5e-3, wgrad_deferred=True) == pytest.approx(1e-3)  # type: ignore[arg-type]
    # SP, long window: re-gather hidden (0.08 x 0.5 ms), reduce-scatter exposed (0.5 ms)
    sp_deferred = dgrad_overlap_s(ctx, 1e-3, True, 5e-3, wgrad_deferred=True)  # type: ignore[arg-type]
    assert sp_deferred == pytest.approx(C * 0.5e-3 + 0.5e-3)
    assert dgrad_overlap_s(ctx, 1e-3, True, 0.0, regather=False) == pytest.approx(0.5e-3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("preset", "share"), [("deepseek-v3", 0.291), ("llama3-70b", 80 / 144)])
def test_column_share_of_attention(preset: str, share: float) -> None:
    """Llama 3 70B: q (64 heads) and k, v (8 heads each) against the output projection (64 heads),
    80 : 64 of 128-wide heads. DeepSeek-V3 (MLA): the up-projections, 54.5M of 187.1M attention
    parameters (its down-projections are not tensor-split, the output projection is row-parallel)."""
    ctx = _context(preset)
    assert column_share_attention(ctx, ctx.kinds[-1]) == pytest.approx(share, abs=1e-3)


def test_op_recompute_with_sequence_parallel_costs_no_regather() -> None:
    """op re-runs the forward all-gathers, whose output backward uses: with no GEMM window the
    Megatron backward then moves as much as the blocking one (5 all-reduce units a layer)."""

    def tp_s(overlap: bool) -> float:
        ctx = _context("llama3-8b", tp_dgrad_overlap=overlap)
        return tp_comm_s(
            ctx, ctx.kinds[0], Dims(8, 1, 1, 1, True, "op"), group_geometry(ctx.topology, 1, 8), (0.0, 0.0)
        )

    assert tp_s(True) == pytest.approx(tp_s(False))


@pytest.mark.parametrize(("preset", "moe_blocks"), [("deepseek-v3", 2), ("mixtral-8x7b", 1)])
def test_shared_experts_are_a_tensor_parallel_block(preset: str, moe_blocks: int) -> None:
    """DeepSeek-V3's shared expert is a tensor-parallel MLP (Megatron-Core ``SharedExpertMLP``):
    its MoE layers have two TP blocks, like a dense layer; Mixtral's (routed experts only) one."""
    ctx = _context(preset)
    assert [tp_blocks(k) for k in ctx.kinds if k.is_moe] == [moe_blocks]
    assert all(tp_blocks(k) == 2 for k in ctx.kinds if not k.is_moe)


def test_dtensor_tp_keeps_the_gathered_inputs() -> None:
    """Without recompute, a DTensor TP stack (``tp_dgrad_overlap`` false, torchtitan) keeps the
    attention's and the MLP's gathered inputs at full width, where Megatron-Core keeps the
    sequence-parallel shards: 2 x h x (1 - 1/tp) elements more a token and layer, bf16."""

    def activations(overlap: bool) -> float:
        return _tp8("llama3-8b", 8, True, overlap).memory[0].activations_bytes

    extra = 32 * 2 * 4096 * (1 - 1 / 8) * 2 * 8192  # layers x inputs x h(1 - 1/tp) x bytes x tokens
    assert activations(False) - activations(True) == pytest.approx(extra)


def test_mla_gathers_its_latents_not_the_hidden_state() -> None:
    """DeepSeek-V3's attention block: the up-projections take the query latent (1,536), the
    key-value latent (512) and the shared rotary key (64), 2,112 elements a token against the
    7,168-wide output projection: without sequence parallelism and without the overlap, forward's
    all-reduce is at 7,168 and backward's at 2,112 (all-reduce time is affine in the bytes)."""
    ctx = _context("deepseek-v3", tp_dgrad_overlap=False)
    moe = next(k for k in ctx.kinds if k.is_moe)
    assert tp_block_widths(ctx, moe) == ((2112.0, 7168.0), (7168.0, 7168.0))
    geo = group_geometry(ctx.topology, 1, 8)
    ar = [hierarchical_allreduce_time_s(4096 * w * 2, geo.levels) for w in (2112, 7168)]
    got = tp_comm_s(ctx, moe, Dims(8, 1, 1, 1, False, "none"), geo)
    assert got == pytest.approx(ar[1] + ar[0] + 2 * ar[1])  # attention, then the shared experts
