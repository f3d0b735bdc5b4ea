"""The MoE dispatch, overlap-contention, residual-stream and sliding-window terms of the cost model:
hand-computed examples and invariants."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.calibration import DEFAULT
from optimizer.cost import build_context
from optimizer.cost.comm import Level
from optimizer.cost.dispatch import dispatch_time_s, distinct_other_groups
from optimizer.cost.flops import mean_context
from optimizer.cost.layer import (
    RESIDUAL_STREAM_BYTES,
    Dims,
    contended,
    elementwise_bytes_fwd,
    ep_comm_s,
    expert_gemm_times_s,
    exposed_fraction,
)
from optimizer.cost.topology import GroupGeometry
from optimizer.specs import JobSpec, ModelSpec

NVLINK = Level(8, 100e9, 1e-6, own_links=True)
IB = Level(2, 40e9, 3e-6, own_links=False)


def _moe_job(num_experts: int = 64, **training: object) -> JobSpec:
    return JobSpec.model_validate({
        "model": {
            "name": "moe-test", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
            "num_kv_heads": 4, "vocab_size": 32000,
            "moe": {"num_experts": num_experts, "top_k": 4, "expert_ffn_hidden_size": 1024},
        },
        "training": {"seq_len": 4096, "global_batch_size": 64, **training},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    })  # fmt: skip


# ------------------------------------------------------------------------------- dispatch volumes


def test_distinct_destinations_hand_computed() -> None:
    # two experts over four groups: 3 other groups, each missed by both with (3/4)^2
    assert distinct_other_groups(2, 4) == pytest.approx(3 * (1 - 0.75**2))  # 1.3125
    assert distinct_other_groups(1, 8) == pytest.approx(7 / 8)  # one copy: no de-duplication
    assert distinct_other_groups(8, 1) == 0.0
    # Qwen3-235B (top-8) at EP32 over 4 nodes: 2.70 remote nodes against the all-to-all's 6 copies
    assert distinct_other_groups(8, 4) == pytest.approx(2.6997, abs=1e-4)


def test_alltoall_dispatch_hand_computed() -> None:
    """1,000 tokens of width 1,000, top-2, 8 ranks on one 100 GB/s level: each rank sends
    2 x 1e6 elements x 2 B x 7/8 = 3.5 MB, spread over 7 peers on its own links."""
    disp, comb = dispatch_time_s("alltoall", 1000, 1000, 2, (NVLINK,))
    assert disp == comb == pytest.approx(1e-6 + 3.5e6 / 100e9)


def test_allgather_dispatch_hand_computed() -> None:
    """Each of 8 ranks gathers the group's 8 x 1e6 elements (2 B): a ring of 7/8 x 16 MB."""
    disp, _ = dispatch_time_s("allgather", 1000, 1000, 2, (NVLINK,))
    assert disp == pytest.approx(7 / 8 * 16e6 / 100e9 + 7 * 1e-6)


def test_deepep_inside_one_node_sends_once_per_destination_rank() -> None:
    """One level of 8 ranks: 7 x (1 - (7/8)^2) = 1.64 distinct other ranks a token, not 1.75 copies,
    bf16 both ways (Megatron-Core dispatches bf16 rows in FP8 training too)."""
    copies = 7 * (1 - (7 / 8) ** 2)
    bf16, comb = dispatch_time_s("deepep", 1000, 1000, 2, (NVLINK,))
    assert bf16 == comb == pytest.approx(1e-6 + 1e6 * 2 * copies / 100e9)


def test_deepep_across_nodes_hand_computed() -> None:
    """16 ranks on 2 nodes of 8, top-4, 1e6 elements of bf16 rows: over InfiniBand a token goes
    once to the other node if any of its experts is there, (1 - (1/2)^4) = 0.9375 of the time;
    over NVLink the copies for this node's ranks and the forwarded ones for the rail peer's."""
    row = 1e6 * 2.0
    outer = 3e-6 + row * (1 - 0.5**4) / 40e9
    other_ranks = 15 * (1 - (15 / 16) ** 4)
    share = 7 / 15 + 8 / 15 * 7 / 8
    inner = 1e-6 + row * other_ranks * share / 100e9
    disp, _ = dispatch_time_s("deepep", 1000, 1000, 4, (NVLINK, IB))
    assert disp == pytest.approx(max(inner, outer))
    plain, _ = dispatch_time_s("alltoall", 1000, 1000, 4, (NVLINK, IB))
    assert inner > outer  # here the NVLink forwarding stage is the slower one
    assert disp < plain  # 0.94 copies over the NIC instead of 2


def test_unknown_dispatcher_is_an_error() -> None:
    with pytest.raises(ValueError, match="dispatcher"):
        dispatch_time_s("magic", 1000, 1000, 2, (NVLINK,))


@settings(max_examples=60, deadline=None)
@given(top_k=st.integers(1, 32), groups=st.integers(1, 512))
def test_deduplicated_copies_never_exceed_the_routed_copies(top_k, groups) -> None:
    d = distinct_other_groups(top_k, groups)
    assert 0.0 <= d <= top_k * (groups - 1) / groups + 1e-12
    assert d <= groups - 1
    assert distinct_other_groups(top_k + 1, groups) >= d


# ------------------------------------------------------------------------ the layer's MoE terms


@settings(max_examples=25, deadline=None)
@given(experts=st.sampled_from([8, 16, 32, 64, 128, 256]), mbs=st.sampled_from([1, 2, 4]))
def test_more_experts_per_gpu_are_never_faster_at_equal_tokens(experts, mbs) -> None:
    """The same routed tokens on a GPU split over more local experts: smaller GEMMs, more of them."""
    d = Dims(1, 1, 8, mbs, False, "none")
    times = []
    for e in (experts, 2 * experts):
        ctx = build_context(_moe_job(e))
        kind = next(k for k in ctx.kinds if k.is_moe)
        times.append(max(expert_gemm_times_s(ctx, kind, d)))
    assert times[1] >= times[0]


def test_ep_time_is_all_exposed_without_batch_overlap_and_deepep_is_cheaper() -> None:
    d = Dims(1, 1, 8, 1, False, "none")
    geo = GroupGeometry(8, (NVLINK,), "nvlink")
    results = {}
    for dispatcher in ("alltoall", "deepep"):
        for precision in ("bf16", "fp8"):
            ctx = build_context(_moe_job(64, moe_dispatcher=dispatcher, precision=precision))
            kind = next(k for k in ctx.kinds if k.is_moe)
            results[dispatcher, precision] = ep_comm_s(ctx, kind, d, geo)
    ctx = build_context(_moe_job(64))
    kind = next(k for k in ctx.kinds if k.is_moe)
    disp, comb = dispatch_time_s("alltoall", 4096, 2048, 4, (NVLINK,))
    assert results["alltoall", "bf16"] == pytest.approx(disp + 3 * comb)  # dispatch, combine, 2 mirrors
    assert results["alltoall", "fp8"] == results["alltoall", "bf16"]  # bf16 all-to-all either way
    # DeepEP sends fewer copies, bf16 in FP8 runs too (Megatron-Core's fused_a2a, 0.14.0 and 000c4ac2)
    assert results["deepep", "fp8"] == results["deepep", "bf16"] < results["alltoall", "bf16"]
    batched = build_context(_moe_job(64, ep_comm_overlap=True))
    hidden = ep_comm_s(batched, kind, d, geo)
    share = exposed_fraction(batched, DEFAULT.ep_comm_overlap_batched)
    assert hidden == pytest.approx(results["alltoall", "bf16"] * share)


# --------------------------------------------------------------------------- contention, elementwise


def test_contention_charges_its_share_of_the_hidden_time() -> None:
    ctx = build_context(_moe_job())
    c = ctx.cal.overlap_contention
    assert contended(ctx, 2.0, 10.0) == pytest.approx(2.0 + c * 8.0)  # 8 s hidden cost c each
    assert contended(ctx, 10.0, 10.0) == pytest.approx(10.0)  # nothing hidden, nothing extra
    assert exposed_fraction(ctx, 0.5) == pytest.approx(1 - 0.5 * (1 - c))
    free = dataclasses.replace(DEFAULT, overlap_contention=0.0)
    assert contended(build_context(_moe_job(), free), 2.0, 10.0) == 2.0


@settings(max_examples=60, deadline=None)
@given(exposed=st.floats(0, 100), extra=st.floats(0, 100), c=st.floats(0, 1))
def test_contended_time_lies_between_exposed_and_total(exposed, extra, c) -> None:
    ctx = build_context(_moe_job(), dataclasses.replace(DEFAULT, overlap_contention=c))
    t = contended(ctx, exposed, exposed + extra)
    assert exposed - 1e-9 <= t <= exposed + extra + 1e-9


def test_residual_stream_bytes_are_split_only_by_sequence_parallelism() -> None:
    """100 tokens, hidden 10, TP4, 30 FFN units: 22 B x 10 on the residual stream (split by SP
    only), (26 x 10 + 8 x 30) / 4 on TP-split tensors."""
    ctx = build_context(_moe_job())
    assert RESIDUAL_STREAM_BYTES == 22.0 and ctx.cal.elementwise_bytes_per_token_hidden == 48.0
    h = float(ctx.job.model.hidden_size or 0)
    no_sp = elementwise_bytes_fwd(ctx, 100, 4, 1, 30)
    sp = elementwise_bytes_fwd(ctx, 100, 4, 4, 30)
    assert no_sp == pytest.approx(100 * (22 * h + (26 * h + 8 * 30) / 4))
    assert sp == pytest.approx(100 * (48 * h + 8 * 30) / 4)  # everything over TP, as before
    assert elementwise_bytes_fwd(ctx, 100, 1, 1, 30) == pytest.approx(100 * (48 * h + 8 * 30))


# ------------------------------------------------------------------------------------ sliding window


def test_gpt_oss_mean_context_hand_computed() -> None:
    """36 layers at 4,096 tokens, 128-key window on every second layer: 18 x 128 (1 - 128/8192)
    + 18 x 2,048 over 36 = 1,087 keys a query."""
    model = ModelSpec(preset="gpt-oss-120b")
    assert (model.sliding_window, model.sliding_window_every) == (128, 2)
    assert mean_context(model, 4096) == pytest.approx((18 * 126.0 + 18 * 2048.0) / 36)
    full = model.model_copy(update={"sliding_window": None})
    assert mean_context(full, 4096) == 2048.0


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 1 << 16), seq=st.integers(2, 1 << 16), every=st.integers(1, 4))
def test_a_window_never_adds_attention_work(window, seq, every) -> None:
    model = ModelSpec(
        num_layers=8, hidden_size=512, num_attention_heads=8, vocab_size=1000,
        sliding_window=window, sliding_window_every=every,
    )  # fmt: skip
    c = mean_context(model, seq)
    assert 0 < c <= seq / 2.0
    wider = model.model_copy(update={"sliding_window": window + 1})
    assert mean_context(wider, seq) >= c - 1e-9


# ------------------------------------------------------------------------- router and capacity


def test_router_bytes_hand_computed() -> None:
    """64 experts, 21 bytes per token and expert: 1,000 tokens move 1.344 MB forward."""
    from optimizer.cost.routing import ROUTER_BYTES_PER_EXPERT, router_bytes_fwd

    ctx = build_context(_moe_job(64))
    assert ROUTER_BYTES_PER_EXPERT == 4 + 4 + 4 + 1 + 4 + 4  # score r/w, top-k, map, probs, aux loss
    assert router_bytes_fwd(ctx, 1000) == pytest.approx(1000 * 64 * 21.0)


def test_capacity_factor_pads_every_expert_to_its_capacity() -> None:
    """Capacity factor 1.5 with padding: 1.5x the routed copies in the expert GEMMs, permutations
    and dispatch; dropless (null) is the balanced mean."""
    from optimizer.cost.layer import routed_tokens_per_gpu
    from optimizer.cost.routing import routing_load

    d = Dims(1, 1, 8, 1, False, "none")
    geo = GroupGeometry(8, (NVLINK,), "nvlink")
    base = build_context(_moe_job(64))
    padded = build_context(_moe_job(64, moe_capacity_factor=1.5))
    assert routing_load(base) == 1.0 and routing_load(padded) == 1.5
    assert routed_tokens_per_gpu(padded, d) == pytest.approx(1.5 * routed_tokens_per_gpu(base, d))
    assert routed_tokens_per_gpu(base, d) == 4096 * 4
    kind = next(k for k in base.kinds if k.is_moe)
    assert ep_comm_s(padded, kind, d, geo) > ep_comm_s(base, kind, d, geo)


@settings(max_examples=20, deadline=None)
@given(factor=st.floats(1.0, 4.0), more=st.floats(0.0, 2.0))
def test_a_larger_capacity_factor_is_never_faster(factor, more) -> None:
    from optimizer.cost import best_estimate, resolve_layout
    from optimizer.specs import Layout

    times = []
    for f in (factor, factor + more):
        job = _moe_job(64, moe_capacity_factor=f)
        lay = resolve_layout(job, Layout(tp=1, pp=1, dp=64, ep=8, micro_batch_size=1, recompute="none"))
        times.append(best_estimate(build_context(job), lay).step_time_s)
    assert times[1] >= times[0] * (1 - 1e-12)
