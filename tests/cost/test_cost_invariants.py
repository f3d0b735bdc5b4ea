"""Properties the cost model must satisfy on every valid layout (hypothesis).

Layouts are drawn from divisors of the GPU count for real presets (llama3-8b, llama3-70b,
mixtral-8x7b on dgx-h100 and gb200-nvl72); layouts the validity rules reject are skipped.
Every property goes through ``optimizer.service.evaluate``, the entry point clients use, except
where a per-stage number is needed that a ``Plan`` does not carry (then the same cost-model
path ``evaluate`` takes is used).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from optimizer.cost import (
    Estimate,
    JobContext,
    best_estimate,
    build_context,
    estimate,
    resolve_layout,
)
from optimizer.cost.context import clear_context_cache
from optimizer.cost.topology import clear_geometry_cache
from optimizer.errors import InvalidLayout
from optimizer.results import Plan
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec, Layout
from optimizer.units import GIB

MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3")
RECOMPUTE_LEVELS = {
    "llama3-8b": ("none", "selective", "full"),
    "llama3-70b": ("none", "selective", "full"),
    "mixtral-8x7b": ("none", "selective", "moe", "full"),  # moe: the whole MoE block recomputed
    "deepseek-v3": ("none", "selective", "moe", "full"),  # MLA: selective also re-makes q, k, v
}
"""Recompute policies in order of increasing recompute, per model."""
NUM_EXPERTS = {"mixtral-8x7b": 8, "deepseek-v3": 256}
CLUSTER_GPUS = {
    "dgx-h100": (8, 16, 32, 64, 128, 256),
    "gb200-nvl72": (8, 16, 32, 64, 72, 144),
}
SETTINGS = settings(max_examples=30, deadline=None)
REL = 1e-9


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request as a plain dict: model, training, cluster and a layout built from divisors."""
    model = draw(st.sampled_from(MODELS))
    cluster = draw(st.sampled_from(sorted(CLUSTER_GPUS)))
    n = draw(st.sampled_from(CLUSTER_GPUS[cluster]))
    tp = draw(st.sampled_from(_divisors(n, 16)))
    pp = draw(st.sampled_from(_divisors(n // tp, 8)))
    cp = draw(st.sampled_from(_divisors(n // (tp * pp), 2)))
    dp = n // (tp * pp * cp)
    ep = 1
    if model in NUM_EXPERTS:
        ep = draw(st.sampled_from([e for e in _divisors(dp * cp, 8) if NUM_EXPERTS[model] % e == 0]))
    mbs = draw(st.sampled_from([1, 2]))
    m = pp * draw(st.sampled_from([1, 2, 4]))  # micro-batches: >= pp and a multiple of pp
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    return {
        "model": {"preset": model},
        "training": {
            "seq_len": draw(st.sampled_from([2048, 4096])),
            "global_batch_size": dp * mbs * m,
            # materialised scores only without context parallelism
            "attention_kernel": draw(st.sampled_from(["flash3", "flash2"] + (["unfused"] if cp == 1 else []))),
            "pp_comm_overlap": draw(st.booleans()),
            "dp_collectives": draw(st.sampled_from(["hierarchical", "flat"])),
            "dp_comm_overlap": draw(st.booleans()),
            "grad_reduce_in_fp32": draw(st.booleans()),
            "cross_entropy": draw(st.sampled_from(["fused", "unfused"])),
        },
        "cluster": {"preset": cluster, "num_gpus": n},
        "config": {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "ep": ep,
            "vpp": vpp,
            "micro_batch_size": mbs,
            "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
            "recompute": draw(st.sampled_from(RECOMPUTE_LEVELS[model])),
        },
    }


def _scored(
    model: str, cluster: str, num_gpus: int, training: dict[str, Any], cal: Any = None, **layout: Any
) -> tuple[JobContext, Estimate]:
    """A preset model on a preset cluster, one layout scored (its best rank order)."""
    job = JobSpec(model={"preset": model}, training=training, cluster={"preset": cluster, "num_gpus": num_gpus})
    ctx = build_context(job) if cal is None else build_context(job, cal)
    return ctx, best_estimate(ctx, resolve_layout(job, Layout(**layout)))


def _with(req: dict[str, Any], section: str, **changes: Any) -> dict[str, Any]:
    out = {k: dict(v) for k, v in req.items()}
    out[section].update(changes)
    return out


def _evaluate(req: dict[str, Any]) -> Plan:
    try:
        return evaluate(EvaluateRequest(**req))
    except InvalidLayout:
        assume(False)
        raise  # unreachable: assume(False) aborts the example


def _estimate(req: dict[str, Any]) -> Estimate:
    """The estimate ``evaluate`` scores (same context, layout and rank-order choice)."""
    job = JobSpec(model=req["model"], training=req["training"], cluster=req["cluster"])
    try:
        return best_estimate(build_context(job), resolve_layout(job, Layout(**req["config"])))
    except InvalidLayout:
        assume(False)
        raise


# --------------------------------------------------------------------------- (a) bandwidth


@SETTINGS
@given(requests())
def test_more_network_bandwidth_never_slows_a_step(req):
    """The same layout on the same cluster with XDR 800G instead of NDR 400G NICs."""
    slow = _evaluate(_with(req, "cluster", network="ib-ndr-400"))
    fast = _evaluate(_with(req, "cluster", network="ib-xdr-800"))
    assert fast.step_time_s <= slow.step_time_s * (1 + REL)


# --------------------------------------------------------------------------- (b) ZeRO


def _request(model: str, num_gpus: int, seq: int, gbs: int, **config: Any) -> dict[str, Any]:
    return {
        "model": {"preset": model},
        "training": {"seq_len": seq, "global_batch_size": gbs},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "config": {"zero_stage": 0, "recompute": "selective", **config},
    }


@SETTINGS
@given(requests())
# No data-parallel ranks to shard over (dp * cp = 1): ZeRO-3 must not add gather buffers.
@example(req=_request("llama3-8b", 8, 2048, 2, tp=4, pp=2))
# MoE with ep = dp * cp and tp = 1: expert weights are not sharded by ZeRO-3 at all.
@example(req=_request("mixtral-8x7b", 8, 4096, 16, tp=1, pp=4, ep=2))
def test_higher_zero_stage_never_raises_memory(req):
    totals = [_evaluate(_with(req, "config", zero_stage=z)).memory_gib.total for z in (0, 1, 2, 3)]
    for lower, higher in itertools.pairwise(totals):
        assert higher <= lower * (1 + REL), totals


# --------------------------------------------------------------------------- (c) recompute


@SETTINGS
@given(requests())
def test_more_recompute_never_raises_activations_nor_lowers_hardware_work(req):
    """none -> selective -> (moe, MoE models) -> full: activations per stage never grow; hardware
    FLOPs never shrink.

    Activations are compared stage by stage (the ``Plan`` reports only the peak stage, which can
    change with the recompute policy). ``hfu * step_time_s`` is hardware FLOPs / (GPUs * peak).
    """
    levels = RECOMPUTE_LEVELS[req["model"]["preset"]]
    plans = [_evaluate(_with(req, "config", recompute=r)) for r in levels]
    work = [p.hfu * p.step_time_s for p in plans]
    acts = [[m.activations_bytes for m in _estimate(_with(req, "config", recompute=r)).memory] for r in levels]
    for i in range(len(levels) - 1):
        assert work[i + 1] >= work[i] * (1 - REL), (levels[i], levels[i + 1], work)
        for stage, (before, after) in enumerate(zip(acts[i], acts[i + 1], strict=False)):
            assert after <= before * (1 + REL), (levels[i], levels[i + 1], stage, before, after)


@SETTINGS
@given(requests())
def test_op_level_recompute_sits_between_none_and_full(req):
    """torchtitan's op-level policy keeps more than full recompute and, without tensor
    parallelism, less than no recompute (with it, the full-width partial sums it saves can exceed
    what no recompute keeps); its hardware work lies between theirs."""
    levels = ("none", "op", "full")
    plans = [_evaluate(_with(req, "config", recompute=r)) for r in levels]
    work = [p.hfu * p.step_time_s for p in plans]
    acts = [[m.activations_bytes for m in _estimate(_with(req, "config", recompute=r)).memory] for r in levels]
    for i in range(len(levels) - 1):
        assert work[i + 1] >= work[i] * (1 - REL), (levels, work)
        if i == 0 and req["config"]["tp"] > 1:
            continue
        for stage, (before, after) in enumerate(zip(acts[i], acts[i + 1], strict=False)):
            assert after <= before * (1 + REL), (levels[i], levels[i + 1], stage, before, after)


# --------------------------------------------------------------------------- (d) weak scaling


@SETTINGS
@given(requests())
def test_doubling_gpus_and_batch_never_grows_compute(req):
    """Double num_gpus and the global batch (so dp doubles): per-GPU work is unchanged."""
    base = _evaluate(req)
    doubled = _with(req, "cluster", num_gpus=2 * req["cluster"]["num_gpus"])
    doubled["training"]["global_batch_size"] = 2 * req["training"]["global_batch_size"]
    big = _evaluate(doubled)
    assert big.config.dp == 2 * base.config.dp
    assert big.config.num_micro_batches == base.config.num_micro_batches
    assert big.time_breakdown_s.compute <= base.time_breakdown_s.compute * (1 + REL)


# --------------------------------------------------------------------------- (e) - (g)


@SETTINGS
@given(requests())
def test_step_time_is_the_sum_of_its_breakdown(req):
    plan = _evaluate(req)
    total = sum(plan.time_breakdown_s.model_dump().values())
    assert abs(plan.step_time_s - total) <= REL * plan.step_time_s


@SETTINGS
@given(requests())
def test_mfu_and_hfu_are_ordered_fractions(req):
    plan = _evaluate(req)
    assert 0 < plan.mfu <= plan.hfu < 1


@SETTINGS
@given(requests())
def test_evaluate_is_deterministic(req):
    first = _evaluate(req).model_dump_json()
    clear_context_cache()  # recompute everything from scratch the second time
    clear_geometry_cache()
    assert _evaluate(req).model_dump_json() == first


# --------------------------------------------------------------------------- all-to-all tiers


def test_all_to_all_scale_out_levels_share_the_nic():
    """Leaf and spine traffic leave through the same NIC (their times add); only a scale-up
    level has links of its own that run concurrently with the NIC."""
    from optimizer.cost.comm import Level, all_to_all_time_s

    nic = 50e9
    leaf, spine = Level(4, nic, 0.0, own_links=False), Level(2, nic / 2, 0.0, own_links=False)
    per_rank = 7e9  # 1 GB to each of the 7 peers
    # 3 peers under the leaf at 50 GB/s, then 4 behind the spine at 25 GB/s: 0.06 + 0.16 s
    assert all_to_all_time_s(per_rank, [leaf, spine]) == pytest.approx(0.06 + 0.16)
    nvlink = Level(4, 450e9, 0.0)
    # NVLink part (3 GB at 450 GB/s) overlaps the NIC part (4 GB behind the spine): 0.16 s
    assert all_to_all_time_s(per_rank, [nvlink, spine]) == pytest.approx(0.16)


MOE_BOUND_LAYOUTS = ((1, 2, 8), (1, 4, 8), (2, 2, 8), (1, 8, 8), (2, 4, 4))


@pytest.mark.parametrize(
    ("cluster", "global_batch_size", "layouts"),
    [
        (
            {"preset": "dgx-h100", "num_gpus": 512, "leaf_span_gpus": 64, "spine_oversubscription": 2.0},
            4096,
            MOE_BOUND_LAYOUTS,
        ),
        # xGMI mesh: a partial scale-up group gets less bandwidth, so locality is not always faster
        (
            {
                "gpu": "mi300x",
                "gpus_per_node": 8,
                "nvlink_domain_size": 8,
                "network": "roce-400",
                "nics_per_node": 8,
                "num_gpus": 512,
            },
            4096,
            MOE_BOUND_LAYOUTS,
        ),
        # 148 GPUs on NVL72 racks: 4 domains of 37, which no TP/EP group size divides
        (
            {"preset": "gb200-nvl72", "num_gpus": 148},
            2368,
            ((1, 2, 2), (2, 2, 2), (4, 1, 4), (2, 1, 4), (1, 4, 1), (2, 2, 1)),
        ),
    ],
)
def test_lower_bound_holds_for_every_rank_order_of_moe_layouts(cluster, global_batch_size, layouts):
    """``compute_lower_bound_s`` is below the step time of every rank order, including orders
    with pp innermost (EP groups then start at stride pp) and groups that domains split unevenly:
    the bound takes each axis's cheapest geometry over the strides any rank order can give."""
    from optimizer.cost import estimate, resolve_layout
    from optimizer.cost.topology import candidate_orders
    from optimizer.search.lower_bounds import compute_lower_bound_s

    job = JobSpec(
        model={"preset": "mixtral-8x7b"},
        training={"seq_len": 4096, "global_batch_size": global_batch_size},
        cluster=cluster,
    )
    ctx = build_context(job)
    checked = 0
    for tp, pp, ep in layouts:
        lay = resolve_layout(job, Layout(tp=tp, pp=pp, ep=ep, micro_batch_size=1, zero_stage=1, recompute="selective"))
        bound = compute_lower_bound_s(ctx, lay)
        for order in candidate_orders(lay.sizes()):
            assert bound <= estimate(ctx, lay, order).step_time_s * (1 + 1e-12), (tp, pp, ep, order)
            checked += 1
    assert checked >= 15


def test_tp_comm_overlap_hides_tp_time_only_inside_nvlink_with_sequence_parallel():
    import dataclasses

    from optimizer.calibration import DEFAULT

    cal = dataclasses.replace(DEFAULT, tp_comm_overlap=0.5)

    def tp_time(overlap: bool, tp: int, sp: bool) -> float:
        return _scored(
            "llama3-70b",
            "dgx-h100",
            64,
            {"seq_len": 8192, "global_batch_size": 64, "tp_comm_overlap": overlap},
            cal=cal,
            tp=tp,
            pp=1,
            sequence_parallel=sp,
            recompute="selective",
        )[1].breakdown_s["tp_comm"]

    # half hidden; the hidden half still costs the SM share collectives take (overlap_contention)
    exposed = 1 - 0.5 * (1 - cal.overlap_contention)
    assert tp_time(True, 8, True) == pytest.approx(exposed * tp_time(False, 8, True))
    assert tp_time(True, 8, False) == pytest.approx(tp_time(False, 8, False))  # needs sequence parallel
    assert tp_time(True, 16, True) == pytest.approx(tp_time(False, 16, True))  # TP16 leaves the node


def test_ep_comm_overlap_hides_its_calibrated_share_of_the_all_to_all_and_nothing_else():
    from optimizer.calibration import DEFAULT

    def breakdown(overlap: bool) -> dict[str, float]:
        return _scored(
            "mixtral-8x7b",
            "dgx-h100",
            64,
            {"seq_len": 4096, "global_batch_size": 256, "ep_comm_overlap": overlap},
            tp=1,
            pp=1,
            ep=8,
            micro_batch_size=1,
            recompute="selective",
        )[1].breakdown_s

    off, on = breakdown(False), breakdown(True)
    assert off["ep_comm"] > 0
    kept = 1 - DEFAULT.overlap_contention  # hidden time still costs the collective's SM share
    ratio = 1 - DEFAULT.ep_comm_overlap_batched * kept  # nothing hides without the batch-level overlap
    assert on["ep_comm"] == pytest.approx(ratio * off["ep_comm"])
    assert ratio < 1  # the overlap never slows a step
    assert {k: v for k, v in on.items() if k != "ep_comm"} == pytest.approx(
        {k: v for k, v in off.items() if k != "ep_comm"}
    )


def test_unfused_kernels_only_slow_the_memory_bound_work():
    def step(fused: bool) -> tuple[float, dict[str, float]]:
        est = _scored(
            "llama3-8b",
            "dgx-h100",
            8,
            {"seq_len": 8192, "global_batch_size": 16, "fused_kernels": fused},
            tp=1,
            pp=1,
            micro_batch_size=2,
            zero_stage=3,
            recompute="selective",
        )[1]
        return est.step_time_s, est.breakdown_s

    (fused_s, fused), (eager_s, eager) = step(True), step(False)
    assert eager["compute"] > fused["compute"]
    assert 1.10 < eager_s / fused_s < 1.25  # torchtitan measured 1.157x / 1.162x with torch.compile
    assert {k: v for k, v in eager.items() if k not in ("compute", "dp_comm")} == pytest.approx(
        {k: v for k, v in fused.items() if k not in ("compute", "dp_comm")}
    )


def test_fp4_runs_gemms_at_the_fp4_rate_and_keeps_fp4_weight_copies():
    from optimizer.cost.memory import FP4_COPY_BYTES, FP8_COPY_BYTES

    def est(precision: str):
        return _scored(
            "llama3-70b",
            "gb200-nvl72",
            72,
            {"seq_len": 8192, "global_batch_size": 72, "precision": precision},
            tp=8,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute="selective",
        )[1]

    bf16, fp8, fp4 = est("bf16"), est("fp8"), est("fp4")
    assert bf16.step_time_s > fp8.step_time_s > fp4.step_time_s
    # GEMMs run at twice the FP8 rate; attention, elementwise work and communication do not speed up
    assert 1.1 < fp8.breakdown_s["compute"] / fp4.breakdown_s["compute"] < 2.0
    w = {p: e.memory[e.peak_stage].weights_bytes for p, e in (("bf16", bf16), ("fp8", fp8), ("fp4", fp4))}
    assert w["fp4"] / w["bf16"] == pytest.approx((2.0 + FP4_COPY_BYTES) / 2.0)
    assert w["fp8"] / w["bf16"] == pytest.approx((2.0 + FP8_COPY_BYTES) / 2.0)


def test_attention_kernel_class_scales_only_the_attention_core():
    """flash3 (Hopper-native kernels) runs the attention core at ``attention_efficiency_flash3``
    instead of ``attention_efficiency``; GPUs before Hopper run flash2-class kernels either way
    (on A100 at a larger share of its peak)."""
    from optimizer.calibration import DEFAULT
    from optimizer.cost.layer import Dims, attention_core_time_s

    def ctx_for(gpu_preset: str, kernel: str):
        job = JobSpec(
            model={"preset": "llama3-8b"},
            training={"seq_len": 32768, "global_batch_size": 8, "attention_kernel": kernel},
            cluster={"preset": gpu_preset, "num_gpus": 8},
        )
        return job, build_context(job, DEFAULT)

    dims = Dims(tp=1, cp=2, ep=1, micro_batch_size=1, sequence_parallel=False, recompute="none")
    (_, h3), (_, h2) = ctx_for("dgx-h100", "flash3"), ctx_for("dgx-h100", "flash2")
    t3, t2 = (attention_core_time_s(c, c.kinds[0], dims) for c in (h3, h2))
    assert t2 / t3 == pytest.approx(DEFAULT.attention_efficiency_flash3 / DEFAULT.attention_efficiency)
    assert DEFAULT.attention_efficiency_flash3 > DEFAULT.attention_efficiency

    lay = Layout(tp=2, pp=1, cp=2, micro_batch_size=1, zero_stage=1, recompute="none")
    (j3, c3), (j2, c2) = ctx_for("dgx-h100", "flash3"), ctx_for("dgx-h100", "flash2")
    e3, e2 = best_estimate(c3, resolve_layout(j3, lay)), best_estimate(c2, resolve_layout(j2, lay))
    assert e3.step_time_s < e2.step_time_s  # 32k tokens: the attention core is a large share
    assert e3.breakdown_s["tp_comm"] == e2.breakdown_s["tp_comm"] > 0
    assert e3.peak_memory_bytes == e2.peak_memory_bytes

    (a3j, a3), (a2j, a2) = ctx_for("dgx-a100", "flash3"), ctx_for("dgx-a100", "flash2")
    # flash2-class on Ampere, at the A100's FlashAttention-2 share of peak (docs/catalog.md)
    assert (
        a3.attention_efficiency
        == a2.attention_efficiency
        == pytest.approx(DEFAULT.attention_efficiency * 0.656 / 0.339)
    )
    assert (
        best_estimate(a3, resolve_layout(a3j, lay)).step_time_s
        == best_estimate(a2, resolve_layout(a2j, lay)).step_time_s
    )


def test_flash3_on_a_gpu_without_it_is_noted():
    req = EvaluateRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 8192, "global_batch_size": 16, "attention_kernel": "flash3"},
            "cluster": {"preset": "dgx-a100", "num_gpus": 8},
            "config": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"},
        }
    )
    assert any("costed as flash2" in n for n in evaluate(req).notes)
    # the default (not set by the job) stays quiet
    quiet = EvaluateRequest.model_validate(
        {**req.model_dump(exclude_none=True), "training": {"seq_len": 8192, "global_batch_size": 16}}
    )
    assert quiet.training.attention_kernel == "flash3"
    assert not any("attention" in n for n in evaluate(quiet).notes)


def test_launch_arguments_name_the_attention_backend_that_was_costed():
    def megatron(preset: str) -> str:
        req = EvaluateRequest.model_validate(
            {
                "model": {"preset": "llama3-8b"},
                "training": {"seq_len": 8192, "global_batch_size": 16},
                "cluster": {"preset": preset, "num_gpus": 8},
                "config": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"},
            }
        )
        return evaluate(req).launch.megatron

    assert "--attention-backend fused" in megatron("dgx-h100")
    assert "--attention-backend flash" in megatron("dgx-a100")  # no Hopper-native kernels there


def test_unfused_attention_keeps_the_scores_unless_recomputed_and_forbids_cp():
    """``attention_kernel: unfused`` materialises the s x s scores: Korthikanti et al.'s 5as^2b
    bytes per layer stay for backward with no recompute, none with selective recompute (the
    attention core is re-run); context parallelism needs a fused kernel."""
    from optimizer.cost.layer import UNFUSED_SCORE_BYTES_STORED

    def est(kernel: str, recompute: str, cp: int = 1):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=2,
            pp=1,
            cp=cp,
            micro_batch_size=1,
            zero_stage=1,
            recompute=recompute,
        )[1]

    scores = 32 * UNFUSED_SCORE_BYTES_STORED * 1 * (32 / 2) * 4096**2  # layers x bytes x b x heads/tp x s^2
    none_u, none_f = est("unfused", "none"), est("flash2", "none")
    assert none_u.memory[0].activations_bytes - none_f.memory[0].activations_bytes == pytest.approx(scores)
    sel_u, sel_f = est("unfused", "selective"), est("flash2", "selective")
    assert sel_u.memory[0].activations_bytes == pytest.approx(sel_f.memory[0].activations_bytes)
    # the scores' HBM round trips make the unfused core slower at 4k tokens, and re-running it
    # (selective recompute) costs more than re-running a flash kernel
    assert none_u.breakdown_s["compute"] > none_f.breakdown_s["compute"]
    assert sel_u.breakdown_s["compute"] - none_u.breakdown_s["compute"] > (
        sel_f.breakdown_s["compute"] - none_f.breakdown_s["compute"]
    )
    with pytest.raises(InvalidLayout) as exc:
        est("unfused", "none", cp=2)
    assert exc.value.field == "config.cp"


def test_unfused_hfu_counts_the_masked_half_of_the_scores():
    def est(kernel: str):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=1,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute="selective",
        )

    (ctx, unfused), (_, flash) = est("unfused"), est("flash2")
    tokens = 8 * 4096
    assert unfused.model_flops_per_step == flash.model_flops_per_step
    extra = unfused.hardware_flops_per_step - flash.hardware_flops_per_step
    assert extra == pytest.approx(ctx.flops.attn_core_forward_per_token * 4 * tokens)  # fwd, bwd (2x), recompute


def test_op_level_recompute_sits_between_none_and_full_and_reruns_tp_collectives():
    """``op`` (torchtitan's policy) re-runs every second matmul and the elementwise ops, keeps the
    attention core's output, and re-runs the sequence-parallel all-gathers: half of each layer's
    forward TP traffic."""

    def est(recompute: str):
        return _scored(
            "llama3-8b",
            "dgx-h100",
            64,
            {"seq_len": 8192, "global_batch_size": 96},
            tp=8,
            pp=1,
            micro_batch_size=12,
            zero_stage=3,
            recompute=recompute,
        )[1]

    none, sel, op, full = (est(r) for r in ("none", "selective", "op", "full"))
    assert none.breakdown_s["compute"] < op.breakdown_s["compute"] < full.breakdown_s["compute"]
    assert op.breakdown_s["tp_comm"] == pytest.approx(1.25 * none.breakdown_s["tp_comm"])  # 4 -> 5 per layer
    assert full.breakdown_s["tp_comm"] == pytest.approx(1.5 * none.breakdown_s["tp_comm"])
    assert sel.breakdown_s["tp_comm"] == pytest.approx(none.breakdown_s["tp_comm"])
    # op keeps the output of every second matmul per token and layer, w2's full-width partial
    # sum among them at TP 8 (8,576 elements against selective's 5,888; docs/cost-model.md)
    kept = 32 * (8576 - 5888) * 12 * 8192 * 2  # layers x elements x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(kept)
    assert none.hardware_flops_per_step < op.hardware_flops_per_step < full.hardware_flops_per_step
    assert op.model_flops_per_step == none.model_flops_per_step


def test_blocking_pipeline_sends_are_all_exposed():
    from optimizer.calibration import DEFAULT

    def est(overlap: bool):
        return _scored(
            "gpt3-175b",
            "dgx-a100",
            256,
            {"seq_len": 2048, "global_batch_size": 256, "pp_comm_overlap": overlap},
            tp=8,
            pp=8,
            micro_batch_size=1,
            zero_stage=1,
            recompute="full",
        )[1]

    overlapped, blocking = est(True), est(False)
    assert blocking.breakdown_s["pp_comm"] > 3 * overlapped.breakdown_s["pp_comm"] > 0
    fill = 2 * 7  # the fill/drain chain is on the critical path either way
    steady_overlapped = overlapped.breakdown_s["pp_comm"]
    steady_blocking = blocking.breakdown_s["pp_comm"]
    # (exposed * m * 2 + fill) * t_p2p: solve both for t_p2p and compare
    m = 256 // 4
    t1 = steady_overlapped / (DEFAULT.pp_comm_exposed * m * 2 + fill)
    t2 = steady_blocking / (m * 2 + fill)
    assert t1 == pytest.approx(t2)


# --------------------------------------------------------------------------- training.dp_collectives


@settings(max_examples=200, deadline=None)
@given(
    shape=st.lists(st.tuples(st.integers(2, 72), st.floats(1e9, 1e12), st.floats(0.0, 2e-5)), min_size=1, max_size=3),
    num_bytes=st.floats(1e3, 1e12),
)
def test_flat_ring_is_never_cheaper_than_hierarchical_levels(shape, num_bytes):
    from optimizer.cost.comm import (
        Level,
        flat_ring_levels,
        hierarchical_allreduce_time_s,
        hierarchical_reduce_scatter_time_s,
        ring_allreduce_time_s,
    )

    levels = tuple(Level(r, b, a) for r, b, a in shape)
    flat = flat_ring_levels(levels)
    ranks = 1
    for lv in levels:
        ranks *= lv.ranks
    beta, alpha = min(lv.beta_bytes_per_s for lv in levels), max(lv.alpha_s for lv in levels)
    assert hierarchical_allreduce_time_s(num_bytes, flat) == pytest.approx(
        ring_allreduce_time_s(num_bytes, ranks, beta, alpha)
    )
    for f in (hierarchical_allreduce_time_s, hierarchical_reduce_scatter_time_s):
        assert f(num_bytes, flat) >= f(num_bytes, levels) * (1 - 1e-12)


def _gpt3_on_a100(num_gpus: int, collectives: str, **layout: Any) -> Estimate:
    return _scored(
        "gpt3-175b",
        "dgx-a100",
        num_gpus,
        {"seq_len": 2048, "global_batch_size": 1536, "dp_collectives": collectives},
        recompute="full",
        **layout,
    )[1]


def test_flat_zero3_gathers_are_bound_by_one_nic_per_gpu():
    """SC'21 Table 2's setting (GPT-3 175B, batch 1536, A100 + 8 HDR NICs per node): ZeRO-3 with no
    model parallelism against PTD-P (TP 8, PP 12). With hierarchical collectives the gathers hide
    under compute and ZeRO-3 would be the faster layout at 768 and 1,536 GPUs; with flat rings each
    GPU's 200 Gb/s NIC carries 3 x 350 GB a step, the step stays near that floor as the GPU count
    doubles (as measured: 66.6 s at both) and PTD-P wins, as measured (149 and 141 TFLOP/s a GPU
    against 88 and 44)."""
    nic_bytes_per_s = 22.5e9  # dgx-a100: HDR 200 Gb/s at the catalog's 90% bus efficiency
    floor_s = {}
    for n, mbs in ((768, 2), (1536, 1)):
        hier = _gpt3_on_a100(n, "hierarchical", tp=1, pp=1, micro_batch_size=mbs, zero_stage=3)
        flat = _gpt3_on_a100(n, "flat", tp=1, pp=1, micro_batch_size=mbs, zero_stage=3)
        ptd = _gpt3_on_a100(n, "flat", tp=8, pp=12, vpp=2, micro_batch_size=1, zero_stage=1)
        assert hier.step_time_s < ptd.step_time_s < flat.step_time_s
        # hidden but for the SM share the gathers take (overlap_contention of their time)
        assert hier.breakdown_s["dp_comm"] < 0.1 * flat.breakdown_s["dp_comm"]
        assert flat.breakdown_s["compute"] == pytest.approx(hier.breakdown_s["compute"])
        # two gathers and a reduce-scatter of every bf16 weight, one flat ring of n ranks each
        gathered_s = 3 * (n - 1) / n * 2 * 174.566e9 / nic_bytes_per_s
        assert flat.step_time_s > gathered_s > 46.0
        floor_s[n] = flat.step_time_s
    assert floor_s[1536] == pytest.approx(floor_s[768], rel=0.05)


@SETTINGS
@given(requests())
def test_blocking_data_parallel_collectives_never_speed_a_step(req):
    """``training.dp_comm_overlap`` false exposes every data-parallel collective: in the same rank
    order only the exposed data-parallel term moves, up, and memory does not change; over every
    order the best step is never faster (another order may expose less)."""
    overlapped = _estimate(_with(req, "training", dp_comm_overlap=True))
    blocking_req = _with(req, "training", dp_comm_overlap=False)
    blocking_job = JobSpec(
        model=blocking_req["model"], training=blocking_req["training"], cluster=blocking_req["cluster"]
    )
    same_order = estimate(build_context(blocking_job), overlapped.layout, overlapped.order)
    assert same_order.breakdown_s["dp_comm"] >= overlapped.breakdown_s["dp_comm"] * (1 - REL)
    assert same_order.peak_memory_bytes == pytest.approx(overlapped.peak_memory_bytes, rel=REL)
    for term in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "optimizer"):
        assert same_order.breakdown_s[term] == pytest.approx(overlapped.breakdown_s[term], rel=REL)
    assert _estimate(blocking_req).step_time_s >= overlapped.step_time_s * (1 - REL)


@SETTINGS
@given(requests())
def test_fp32_gradients_double_gradient_memory_and_never_speed_a_step(req):
    """``training.grad_reduce_in_fp32`` keeps and reduces gradients in 4 bytes instead of 2: in the
    same rank order every stage's gradient memory doubles, its weights and optimizer state stay,
    only the data-parallel term of the time may move, and it only rises; over every order the best
    step is never faster."""
    half = _estimate(_with(req, "training", grad_reduce_in_fp32=False))
    fp32_req = _with(req, "training", grad_reduce_in_fp32=True)
    fp32_job = JobSpec(model=fp32_req["model"], training=fp32_req["training"], cluster=fp32_req["cluster"])
    same_order = estimate(build_context(fp32_job), half.layout, half.order)
    for h, f in zip(half.memory, same_order.memory, strict=True):
        assert f.gradients_bytes == pytest.approx(2 * h.gradients_bytes, rel=REL)
        assert (f.weights_bytes, f.optimizer_bytes) == pytest.approx((h.weights_bytes, h.optimizer_bytes), rel=REL)
    assert same_order.peak_memory_bytes >= half.peak_memory_bytes * (1 - REL)
    assert same_order.breakdown_s["dp_comm"] >= half.breakdown_s["dp_comm"] * (1 - REL)
    for term in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "optimizer"):
        assert same_order.breakdown_s[term] == pytest.approx(half.breakdown_s[term], rel=REL)
    assert _estimate(fp32_req).step_time_s >= half.step_time_s * (1 - REL)


def test_fp32_gradients_cost_zero3_one_gradient_reduce_scatter_more():
    """ZeRO-3 gathers each layer's 16-bit weights twice and reduce-scatters its gradients once per
    micro-batch: with fp32 gradients the bytes of that triple grow from 3 x 2 to 2 x 2 + 4 per
    parameter. Gathered on demand (``dp_comm_overlap`` false) a third of the collectives (the
    16-bit reduce-scatter's share) hides under the 44 s of backward (GPT-3 175B on 384 A100) and
    costs only its contention; the wider gradients' extra bytes count as blocking: the exposed
    time grows by 4/3 less the ring latency, which does not grow (383 hops a collective here)."""
    from optimizer.calibration import DEFAULT

    training = {"seq_len": 2048, "global_batch_size": 1536, "dp_collectives": "flat", "dp_comm_overlap": False}
    layout = {"tp": 1, "pp": 1, "micro_batch_size": 4, "zero_stage": 3}
    half = _scored("gpt3-175b", "dgx-a100", 384, training, recompute="full", **layout)[1]
    fp32 = _scored("gpt3-175b", "dgx-a100", 384, {**training, "grad_reduce_in_fp32": True}, recompute="full",
                   **layout)[1]  # fmt: skip
    c = DEFAULT.overlap_contention
    assert c < 1 / 3  # the hidden third costs its contention in both
    assert 1.32 < fp32.breakdown_s["dp_comm"] / half.breakdown_s["dp_comm"] < 4 / 3
    stage = fp32.memory[fp32.peak_stage]
    assert stage.gradients_bytes == pytest.approx(2 * half.memory[half.peak_stage].gradients_bytes, rel=REL)


def test_blocking_zero3_gathers_add_to_compute_and_order_sc21_table2():
    """SC'21 Table 2 at its smallest GPU count (GPT-3 175B, batch 1536, 384 A100): DeepSpeed's
    ZeRO-3 of 2021 (flat rings, prefetch too small to gather a layer ahead) measured 100 TFLOP/s a
    GPU against PTD-P's 107. Its collectives move 3 x 350 GB a step over each GPU's NIC.
    Overlapped, they would hide under the 59 s of compute and ZeRO-3 would win; gathered on
    demand, the two weight gathers add to compute (the reduce-scatter still hides under backward,
    at its contention's cost) and PTD-P wins."""
    from optimizer.calibration import DEFAULT

    nic_bytes_per_s = 22.5e9  # dgx-a100: HDR 200 Gb/s at the catalog's 90% bus efficiency
    n = 384
    layout = {"tp": 1, "pp": 1, "micro_batch_size": 4, "zero_stage": 3}
    overlapped = _scored("gpt3-175b", "dgx-a100", n, {"seq_len": 2048, "global_batch_size": 1536,
                         "dp_collectives": "flat"}, recompute="full", **layout)[1]  # fmt: skip
    blocking = _scored("gpt3-175b", "dgx-a100", n, {"seq_len": 2048, "global_batch_size": 1536,
                       "dp_collectives": "flat", "dp_comm_overlap": False}, recompute="full", **layout)[1]  # fmt: skip
    ptd = _gpt3_on_a100(n, "hierarchical", tp=8, pp=12, vpp=2, micro_batch_size=1, zero_stage=1)
    collectives_s = 3 * (n - 1) / n * 2 * 174.566e9 / nic_bytes_per_s
    c = DEFAULT.overlap_contention
    # overlapped, the collectives cost only the SM share they take from compute (overlap_contention)
    hidden_cost_s = 1.1 * c * collectives_s
    gathers_s = 2 / 3 * collectives_s
    assert (
        overlapped.breakdown_s["dp_comm"]
        < hidden_cost_s
        < gathers_s
        < blocking.breakdown_s["dp_comm"]
        < 1.05 * (gathers_s + c * collectives_s / 3)
    )
    assert blocking.step_time_s == pytest.approx(
        blocking.breakdown_s["compute"] + blocking.breakdown_s["dp_comm"], rel=1e-3
    )
    assert overlapped.step_time_s < ptd.step_time_s < blocking.step_time_s


def test_flat_collectives_change_nothing_inside_one_level():
    """With tensor parallelism filling each node, a data-parallel group has one GPU per node: a
    flat ring and NCCL's hierarchy run over the same links. Beyond one leaf (160 GPUs here) a flat
    ring pays the spine's latency on every hop: a small difference at most."""
    hier = _gpt3_on_a100(128, "hierarchical", tp=8, pp=4, micro_batch_size=1, zero_stage=1)
    flat = _gpt3_on_a100(128, "flat", tp=8, pp=4, micro_batch_size=1, zero_stage=1)
    assert hier.breakdown_s["dp_comm"] > 0
    assert flat.breakdown_s["dp_comm"] == pytest.approx(hier.breakdown_s["dp_comm"], rel=1e-12)
    hier = _gpt3_on_a100(256, "hierarchical", tp=8, pp=4, micro_batch_size=1, zero_stage=1)
    flat = _gpt3_on_a100(256, "flat", tp=8, pp=4, micro_batch_size=1, zero_stage=1)
    assert hier.breakdown_s["dp_comm"] <= flat.breakdown_s["dp_comm"] < 1.01 * hier.breakdown_s["dp_comm"]


def test_op_level_recompute_keeps_the_attention_core_outputs():
    """With materialised scores, ``op`` keeps them (the attention core is not re-run) where
    selective recompute drops them; its HFU counts no re-run of the core either."""
    from optimizer.cost.layer import UNFUSED_SCORE_BYTES_STORED

    def est(recompute: str, kernel: str = "unfused"):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=2,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute=recompute,
        )

    (ctx, op), (_, sel), (_, none) = est("op"), est("selective"), est("none")
    scores = 32 * UNFUSED_SCORE_BYTES_STORED * (32 / 2) * 4096**2
    acts = {name: e.memory[0].activations_bytes for name, e in (("op", op), ("sel", sel))}
    assert acts["op"] - est("op", "flash2")[1].memory[0].activations_bytes == pytest.approx(scores)
    assert acts["sel"] == pytest.approx(est("selective", "flash2")[1].memory[0].activations_bytes)
    masked = ctx.flops.attn_core_forward_per_token * 8 * 4096  # one run of the masked half
    op_extra = op.hardware_flops_per_step - op.model_flops_per_step
    none_extra = none.hardware_flops_per_step - none.model_flops_per_step
    assert none_extra == pytest.approx(3 * masked)
    assert op_extra - none_extra == pytest.approx(0.5 * (ctx.flops.forward_layers_per_token * 8 * 4096 - masked))


def _deepseek_v3_h800(recompute: str, **training: Any) -> tuple[JobContext, Estimate]:
    """DeepSeek-V3's published pre-training layout (report section 3.2: 2,048 H800, PP16, EP64
    over 8 nodes, ZeRO-1 data parallel; 4k sequences, batch 15,360, FP8 GEMMs), with 16-bit
    activations kept for backward."""
    job = JobSpec(
        model={"preset": "deepseek-v3"},
        training={
            "seq_len": 4096,
            "global_batch_size": 15360,
            "precision": "fp8",
            "fp8_saved_inputs": False,
            **training,
        },  # fmt: skip
        cluster={"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
    )
    ctx = build_context(job)
    layout = Layout(tp=1, pp=16, ep=64, micro_batch_size=1, zero_stage=1, recompute=recompute)
    return ctx, best_estimate(ctx, resolve_layout(job, layout))


def test_mla_selective_recompute_keeps_the_latents_and_reruns_the_up_projections():
    """On MLA models selective recompute keeps the compressed latents and the rotary key and re-makes
    the per-head q, k, v in backward (DeepSeek-V3 report 3.2.3; Megatron's ``mla_up_proj``):
    128 heads x (192 + 192 + 128) elements per token fewer per layer than ``op`` (which keeps them,
    memory otherwise counted the same), at the cost of the two up-projection GEMMs."""
    from optimizer.cost.layer import ACT_BYTES, Dims, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, sel = _deepseek_v3_h800("selective")
    _, op = _deepseek_v3_h800("op")
    _, none = _deepseek_v3_h800("none")
    tokens = 15360 * 4096
    # q_b 1536 x 128 x 192 and kv_b 512 x 128 x (128 + 128), 61 layers, 2 FLOPs per multiply-add
    up_flops_per_token = 2 * 61 * (1536 * 128 * 192 + 512 * 128 * 256)
    assert ctx.flops.mla_up_forward_per_token == up_flops_per_token
    assert sel.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(
        (ctx.flops.attn_core_forward_per_token + up_flops_per_token) * tokens
    )
    groups = axis_groups(ctx.topology, sel.order, sel.layout.sizes())
    moe_kind = next(k for k in ctx.kinds if k.is_moe)

    def cost(recompute: str):
        return layer_cost(ctx, moe_kind, Dims(1, 1, 64, 1, False, recompute), groups)

    per_head_qkv = 128 * (192 + 192 + 128) * 4096 * ACT_BYTES  # one micro-batch of 4,096 tokens
    assert cost("op").stored_act_bytes - cost("selective").stored_act_bytes == pytest.approx(per_head_qkv)
    assert cost("selective").working_act_bytes == pytest.approx(cost("op").working_act_bytes)
    # the published layout ran: with the up-projections recomputed it fits the H800's 80 GB
    # (78.6 GiB on stage 1, bf16 activations; DeepSeek also cached activations in FP8); keeping the
    # per-head q, k, v it would need about 111 GiB
    assert sel.fits_memory
    assert sel.peak_memory_bytes / GIB == pytest.approx(78.6, abs=0.1)
    assert op.peak_memory_bytes / GIB > 100


def test_mla_up_projection_recompute_costs_its_two_gemms_and_keeps_split_latents(monkeypatch):
    """Backward re-runs q_b (1536 -> 128 x 192) and kv_b (512 -> 128 x 256) on every token of the
    micro-batch, heads split over TP; with sequence parallelism the latents are split too."""
    from optimizer.cost import layer as layer_mod
    from optimizer.cost.layer import ACT_BYTES, Dims, gemm_time_s, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, sel = _deepseek_v3_h800("selective")
    groups = axis_groups(ctx.topology, sel.order, sel.layout.sizes())
    moe_kind = next(k for k in ctx.kinds if k.is_moe)
    tp, tokens = 2, 4096.0
    dims = Dims(tp, 1, 64, 1, True, "selective")
    recomputed = layer_cost(ctx, moe_kind, dims, groups)
    monkeypatch.setattr(layer_mod, "MLA_UP_RECOMPUTED", frozenset())
    kept = layer_cost(ctx, moe_kind, dims, groups)
    gemms = gemm_time_s(ctx, 2 * tokens * 1536 * 128 * 192 / tp, tokens, 128 * 192 / tp, 1536) + gemm_time_s(
        ctx, 2 * tokens * 512 * 128 * 256 / tp, tokens, 128 * 256 / tp, 512
    )
    assert recomputed.bwd_s - kept.bwd_s == pytest.approx(gemms)
    assert recomputed.fwd_s == kept.fwd_s
    # stored per token: norm inputs 2 x 7168/2, latents (1536 + 512)/2, rotary key 64, attention
    # output 128 x 128/2, routed copies 8/2 x (7168 + 2 x 2048), shared expert 2 x 2048/2
    elements = 7168 + 1024 + 64 + 8192 + 4 * 11264 + 2048
    assert recomputed.stored_act_bytes == pytest.approx(elements * tokens * ACT_BYTES)


def test_mla_without_query_compression_re_makes_q_from_the_hidden_state():
    """Megatron's mla_up_proj checkpoint also re-runs the direct query projection when a model
    has no query latent (DeepSeek-V2-Lite): q is dropped and its GEMM re-run in backward."""
    mla = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    model = {"name": "mla-lite", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
             "num_kv_heads": 16, "vocab_size": 32000, "ffn_hidden_size": 8192, "mla": mla}  # fmt: skip
    job = JobSpec(
        model=model, training={"seq_len": 4096, "global_batch_size": 8},
        cluster={"preset": "dgx-h100", "num_gpus": 8},
    )  # fmt: skip
    ctx = build_context(job)
    assert ctx.mla_up_params == (2048 * 16 * 192, 512 * 16 * 256)
    assert ctx.flops.mla_up_forward_per_token == 2 * 4 * (2048 * 16 * 192 + 512 * 16 * 256)

    def est(recompute: str) -> Estimate:
        lay = Layout(tp=1, pp=1, micro_batch_size=1, zero_stage=1, recompute=recompute)
        return best_estimate(ctx, resolve_layout(job, lay))

    sel, op = est("selective"), est("op")
    per_head_qkv = 4 * 16 * (192 + 192 + 128) * 4096 * 2  # layers x elements per token x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(per_head_qkv)


@pytest.mark.parametrize(
    "recompute, passes_in_backward", [("none", 1), ("selective", 1), ("op", 2), ("moe", 2), ("full", 2)]
)
def test_moe_permutation_moves_every_routed_copy_through_hbm(monkeypatch, recompute, passes_in_backward):
    """DeepSeek-V3's MoE layer (top-8, hidden 7168) on one H800 of TP1 EP64: the permutation and
    unpermutation read and write each of a token's 8 routed copies, 8 bytes per hidden unit
    forward, the same again in backward, and once more when the MoE block is recomputed (torchtitan's
    op-level policy saves matmul and all-to-all outputs, not gathers and scatters). Dense layers move
    nothing of the kind."""
    from optimizer.cost import layer as layer_mod
    from optimizer.cost.layer import Dims, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, est = _deepseek_v3_h800(recompute)
    groups = axis_groups(ctx.topology, est.order, est.layout.sizes())
    dims = Dims(1, 1, 64, 1, False, recompute)
    hbm = ctx.gpu.hbm_bandwidth_bytes_per_s.value * ctx.cal.hbm_efficiency
    moved_s = 4096 * 8 * 7168 * 8.0 / hbm  # tokens x top_k x hidden x PERMUTE_BYTES
    assert moved_s == pytest.approx(0.623e-3, rel=0.01)  # 1.88 GB at 90% of 3.35 TB/s
    for kind in ctx.kinds:
        with_perm = layer_cost(ctx, kind, dims, groups)
        monkeypatch.setattr(layer_mod, "PERMUTE_BYTES", 0.0)
        without = layer_cost(ctx, kind, dims, groups)
        monkeypatch.undo()
        expected = moved_s if kind.is_moe else 0.0
        assert with_perm.fwd_s - without.fwd_s == pytest.approx(expected, abs=1e-12)
        assert with_perm.bwd_s - without.bwd_s == pytest.approx(passes_in_backward * expected, abs=1e-12)


@pytest.mark.parametrize(
    ("tp", "op_elems", "selective_elems"),
    [
        # wq, wv, w1, w2 of the seven matmuls, the layer input and the attention output:
        # 4 x 4096 + 1024 + 14336 + 4096 = 31,744 against selective's 4h + 2 kv + 2 f
        (1, 31744, 47104),
        # TP 8 with sequence parallelism: w2's partial sum is full width (4096), plus the two
        # reduce-scatter outputs; selective splits everything over TP
        (8, 8576, 5888),
    ],
)
def test_op_level_checkpointing_keeps_every_second_matmul_output(tp, op_elems, selective_elems):
    """torchtitan's op-level policy (``_custom_policy``: every mm output saved but every second
    one of the layer) on Llama 3 8B, elements kept per token and layer."""
    op = _scored("llama3-8b", "dgx-h100", 8, {"seq_len": 8192, "global_batch_size": 8},
                 tp=tp, pp=1, micro_batch_size=1, zero_stage=3, recompute="op")[1]  # fmt: skip
    sel = _scored("llama3-8b", "dgx-h100", 8, {"seq_len": 8192, "global_batch_size": 8},
                  tp=tp, pp=1, micro_batch_size=1, zero_stage=3, recompute="selective")[1]  # fmt: skip
    per_elem = 32 * 8192 * 2  # layers x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(
        (op_elems - selective_elems) * per_elem
    )


def test_unfused_cross_entropy_holds_twelve_bytes_a_logit():
    """PyTorch's cross_entropy on fp32 logits (torchtitan) holds 12 bytes per logit at its peak,
    Megatron-Core's fused vocab-parallel loss 6: Llama 3 8B on 8 GPUs, 16,384 tokens a GPU."""
    training = {"seq_len": 8192, "global_batch_size": 16}
    fused = _scored("llama3-8b", "dgx-h100", 8, training, tp=1, pp=1, micro_batch_size=2, zero_stage=3,
                    recompute="op")[1]  # fmt: skip
    unfused = _scored("llama3-8b", "dgx-h100", 8, {**training, "cross_entropy": "unfused"}, tp=1, pp=1,
                      micro_batch_size=2, zero_stage=3, recompute="op")[1]  # fmt: skip
    logits = 2 * 8192 * 128256
    extra = unfused.memory[0].activations_bytes - fused.memory[0].activations_bytes
    assert extra == pytest.approx(6 * logits, rel=1e-9)
    assert unfused.step_time_s > fused.step_time_s  # the loss also moves twice the bytes


@pytest.mark.parametrize(("zero_stage", "ratio"), [(0, 2.0), (1, 1.5), (2, 1.5)])
def test_fp32_gradients_leave_the_weight_gathers_16_bit(zero_stage, ratio):
    """Blocking data-parallel time with fp32 gradients over 16-bit ones, Llama 3 8B on 64 H100:
    ZeRO-0 all-reduces gradients only (x2); ZeRO-1/2 reduce-scatter gradients and all-gather
    16-bit weights (2 + 4 over 2 + 2); each a little under its ratio by the ring latency, which
    does not grow. (ZeRO-3 keeps its reduce-scatter under backward even then:
    ``test_fp32_gradients_cost_zero3_one_gradient_reduce_scatter_more``.)"""

    def dp_s(fp32: bool) -> float:
        training = {"seq_len": 8192, "global_batch_size": 64, "dp_comm_overlap": False, "grad_reduce_in_fp32": fp32}
        return _scored("llama3-8b", "dgx-h100", 64, training, tp=1, pp=1, micro_batch_size=1,
                       zero_stage=zero_stage, recompute="none")[1].breakdown_s["dp_comm"]  # fmt: skip

    assert 0.97 * ratio < dp_s(True) / dp_s(False) <= ratio * (1 + 1e-9)


def test_small_expert_gemms_are_host_bound_and_large_ones_are_not():
    """The routed-expert GEMMs of a layer take at least the host's time to issue them: two per local
    expert forward, at ``expert_gemm_host_s`` each. Qwen3-235B's 16 local experts at EP8 and TP4
    with 4k tokens get 512 tokens per expert GEMM: host bound (still a little at 2,048). At TP2 with
    micro-batch 4 (4,096 each, the published FSDP layout) the GPU work is longer."""
    from optimizer.calibration import DEFAULT
    from optimizer.cost.layer import Dims, expert_gemm_times_s

    def times(seq: int, tp: int, mbs: int) -> tuple[float, float]:
        job = JobSpec(
            model={"preset": "qwen3-235b-a22b"},
            training={"seq_len": seq, "global_batch_size": 2048},
            cluster={"preset": "dgx-h100", "num_gpus": 256},
        )
        ctx = build_context(job)
        moe_kind = next(k for k in ctx.kinds if k.is_moe)
        return expert_gemm_times_s(ctx, moe_kind, Dims(tp, 1, 8, mbs, True, "none"))

    floor = 2 * 16 * DEFAULT.expert_gemm_host_s
    gpu, host = times(4096, 4, 1)  # 1,024 tokens per GPU, 512 per expert GEMM
    assert host == floor and gpu < 0.5 * floor
    gpu, host = times(16384, 4, 1)  # 2,048 per expert GEMM
    assert host == floor and 0.85 * floor < gpu < floor
    gpu, host = times(4096, 2, 4)  # 4,096 per expert GEMM
    assert host == floor and gpu > 1.5 * floor


def test_the_expert_host_floor_only_slows_host_bound_moe_layouts():
    """Switching the floor off speeds the Qwen3-235B TP4 EP8 layout (512 tokens per expert GEMM)
    up by about 2x, as measured against predicted before it; the TP2 EP32 layout (4,096 tokens per
    expert GEMM) and a dense model do not move."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    no_floor = dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0)
    qwen = {"seq_len": 4096, "global_batch_size": 2048}

    def step(model: str, training: dict[str, Any], cal: Any, **layout: Any) -> float:
        return _scored(model, "dgx-h100", 256, training, cal, **layout)[1].step_time_s

    tp4 = {"tp": 4, "pp": 8, "ep": 8, "vpp": 4, "micro_batch_size": 1, "recompute": "none"}
    assert 1.8 < step("qwen3-235b-a22b", qwen, DEFAULT, **tp4) / step("qwen3-235b-a22b", qwen, no_floor, **tp4) < 2.3
    tp2 = {"tp": 2, "pp": 8, "ep": 32, "vpp": 4, "micro_batch_size": 1, "recompute": "selective"}
    assert step("qwen3-235b-a22b", qwen, DEFAULT, **tp2) == step("qwen3-235b-a22b", qwen, no_floor, **tp2)
    dense = {"seq_len": 8192, "global_batch_size": 256}
    llama = {"tp": 8, "pp": 1, "micro_batch_size": 1, "recompute": "selective"}
    assert step("llama3-70b", dense, DEFAULT, **llama) == step("llama3-70b", dense, no_floor, **llama)


def test_a_host_bound_moe_plan_says_so_with_the_step_it_would_take_otherwise():
    def notes(**layout: Any) -> list[str]:
        plan = evaluate(EvaluateRequest(
            model={"preset": "qwen3-235b-a22b"}, training={"seq_len": 4096, "global_batch_size": 2048},
            cluster={"preset": "dgx-h100", "num_gpus": 256}, config=layout,
        ))  # fmt: skip
        return [n for n in plan.notes if n.startswith("expert GEMMs are host bound")]

    (note,) = notes(tp=4, pp=8, ep=8, vpp=4, micro_batch_size=1, recompute="none")
    assert "16 local experts gets about 512 tokens" in note
    fast, slow = (float(x) for x in re.findall(r"take ([\d.]+) s a step instead of ([\d.]+) s", note)[0])
    assert 1.8 < slow / fast < 2.3
    assert notes(tp=2, pp=8, ep=32, vpp=4, micro_batch_size=1, recompute="selective") == []


def test_a_stack_without_host_splits_drops_the_expert_floor():
    """``training.expert_gemm_host_splits: false`` (a device-side grouped GEMM, CUDA graphs over
    the experts) costs the layout as the calibration without the floor does."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    layout = {"tp": 4, "pp": 8, "ep": 8, "vpp": 4, "micro_batch_size": 1, "recompute": "none"}
    training = {"seq_len": 4096, "global_batch_size": 2048}
    no_floor = dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0)
    device = _scored("qwen3-235b-a22b", "dgx-h100", 256, {**training, "expert_gemm_host_splits": False}, **layout)[1]
    host = _scored("qwen3-235b-a22b", "dgx-h100", 256, training, **layout)[1]
    free = _scored("qwen3-235b-a22b", "dgx-h100", 256, training, no_floor, **layout)[1]
    assert device.step_time_s == free.step_time_s < 0.55 * host.step_time_s
