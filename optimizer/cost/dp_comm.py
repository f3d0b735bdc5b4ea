"""Data-parallel communication of a pipeline stage: the dense (``dp x cp``) and expert
collectives of each ZeRO stage, and the part that overlap with compute leaves exposed at the end
of the step (``dp_exposed_s``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from optimizer.cost.caches import Memo
from optimizer.cost.comm import (
    Level,
    flat_ring_levels,
    hierarchical_allgather_time_s,
    hierarchical_allreduce_time_s,
    hierarchical_reduce_scatter_time_s,
)
from optimizer.cost.context import JobContext
from optimizer.cost.layer import contended
from optimizer.cost.memory import WEIGHT_BYTES
from optimizer.cost.num import Num, maximum, minimum
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage_layout import StageLayout
from optimizer.cost.topology import AxisGroups, GroupGeometry


class DpGroupsKey(NamedTuple):
    """All ``_dp_levels`` reads of a rank order: the dense and the expert data-parallel groups'
    geometries (they hash by identity: a cheap key)."""

    dp_cp: GroupGeometry
    edp: GroupGeometry


def dp_groups_key(groups: AxisGroups) -> DpGroupsKey:
    return tuple.__new__(DpGroupsKey, (groups.dp_cp, groups.edp))


DP_LEVELS = Memo[DpGroupsKey, tuple[tuple[Level, ...], tuple[Level, ...]]]("dp_levels")


def _dp_levels(ctx: JobContext, groups: AxisGroups) -> tuple[tuple[Level, ...], tuple[Level, ...]]:
    """The levels the dense (``dp x cp``) and expert data-parallel collectives run over
    (``training.dp_collectives``).

    A model without MoE layers has no expert parameters and issues no expert collectives. The
    rule is per job, not per message: a stage of an MoE model that holds only dense layers still
    pays the expert groups' latency, which keeps every data-parallel time affine in the stage's
    parameters (``split_floor_s`` bounds stages by their average).
    """
    key = dp_groups_key(groups)
    table = ctx.caches[DP_LEVELS]
    levels = table.get(key)
    if levels is None:
        levels = table[key] = (dp_ring(ctx, key.dp_cp), expert_dp_ring(ctx, key.edp))
    return levels


def dp_ring(ctx: JobContext, geo: GroupGeometry) -> tuple[Level, ...]:
    """The levels a data-parallel collective runs over in ``geo``: hierarchical, or one flat ring."""
    return flat_ring_levels(geo.levels) if ctx.job.training.dp_collectives == "flat" else geo.levels


def expert_dp_ring(ctx: JobContext, geo: GroupGeometry) -> tuple[Level, ...]:
    """``dp_ring`` of an expert data-parallel group (none without MoE layers)."""
    return () if ctx.job.model.moe is None else dp_ring(ctx, geo)


def dp_collective_parts_s(
    zero_stage: int,
    dp_cp: tuple[Level, ...],
    edp: tuple[Level, ...],
    g_dense: Num,
    g_exp: Num,
    n_layers: Num,
    grad_bytes: float,
) -> tuple[Num, Num]:
    """A stage's data-parallel collectives over ``dp_cp`` (dense gradient bytes ``g_dense``) and
    ``edp`` (expert, ``g_exp``), gradients of ``grad_bytes`` each: (dense part, expert part), per
    step for ZeRO-0/1/2 (all-reduce, or reduce-scatter, which the parameter all-gather mirrors),
    per layer and micro-batch for ZeRO-3 (gather the layer's 16-bit weights for forward and for
    backward and reduce-scatter its gradients, each collective paying its own latency). Each part
    is affine in its bytes (and ZeRO-3's, times the layer count, in the layer count). Numbers or
    numpy arrays."""
    if zero_stage == 3:
        return _zero3_layer_s(g_dense / n_layers, dp_cp, grad_bytes), _zero3_layer_s(g_exp / n_layers, edp, grad_bytes)
    collective = hierarchical_allreduce_time_s if zero_stage == 0 else hierarchical_reduce_scatter_time_s
    return collective(g_dense, dp_cp), collective(g_exp, edp)


def _zero3_layer_s(grads: Num, levels: tuple[Level, ...], grad_bytes: float) -> Num:
    """ZeRO-3's collectives for one layer of ``grads`` gradient bytes: two weight gathers and a
    gradient reduce-scatter (the same ring time for the same bytes)."""
    reduce = hierarchical_reduce_scatter_time_s(grads, levels)
    if grad_bytes == WEIGHT_BYTES:
        return 3 * reduce
    return 2 * hierarchical_allgather_time_s(grads * (WEIGHT_BYTES / grad_bytes), levels) + reduce


def dp_exposed_from_parts_s(
    ctx: JobContext,
    zero_stage: int,
    m: Num,
    n_layers: Num,
    parts: tuple[Num, Num],
    unhidden: Num,
    compute: Num,
    fwd: Num,
    bwd: Num,
    gather: Num | None = None,
) -> Num:
    """A stage's exposed data-parallel time from its ``dp_collective_parts_s`` and the term no
    overlap hides (``unhidden``: ZeRO-3's first weight gather, else the last gradient bucket).
    ZeRO-3 overlaps its per-layer collectives with every micro-batch's compute; ZeRO-0/1/2 their
    gradient collectives with the last micro-batch's backward and (ZeRO-1/2) the parameter
    all-gather (``gather``, ``_weight_gather_s``; the reduce-scatter's time when the gradients
    are as wide as the weights) with the next step's first forward. Non-decreasing in every part
    and in ``unhidden``. Numbers or numpy arrays."""
    dense, expert = parts
    if zero_stage == 3:
        per_mb = n_layers * (dense + expert)
        if ctx.dp_overlap == 0.0:
            return zero3_on_demand_s(ctx, m * per_mb, m * bwd)
        return contended(ctx, maximum(unhidden, m * per_mb - ctx.dp_overlap * m * compute), m * per_mb)
    t_b = dense + expert
    exposed = gradient_exposed_s(ctx, zero_stage, m, t_b, unhidden, compute, bwd)
    if zero_stage != 0:  # the parameter all-gather, the reduce-scatter's mirror in weight bytes
        t_g = t_b if gather is None else gather
        exposed = exposed + contended(ctx, maximum(unhidden, t_g - ctx.dp_overlap * fwd), t_g)
    return np.where(t_b > 0, exposed, 0.0) if isinstance(exposed, np.ndarray) else (exposed if t_b > 0 else 0.0)


def gradient_exposed_s(
    ctx: JobContext, zero_stage: int, m: Num, t_b: Num, unhidden: Num, compute: Num, bwd: Num
) -> Num:
    """Exposed time of ZeRO-0/1/2's gradient collective ``t_b`` (one pass over the gradients).
    ZeRO-0/1 reduce once per step, under the last micro-batch's backward. ZeRO-2 keeps only its
    shard of the gradients, so it reduce-scatters every micro-batch's (Megatron-FSDP
    ``optim_grads``: ``grad_reduce_every_bprop``; DeepSpeed stage 2: "communicates during non
    gradient accumulation boundaries as well"): ``m`` passes, queued under the compute from the
    first backward on, the last one under the last backward only. Convex in ``t_b`` and the
    compute (a maximum of affine terms), and never below ZeRO-1's."""
    once = maximum(unhidden, t_b - ctx.dp_overlap * bwd)
    if zero_stage != 2:
        return contended(ctx, once, t_b)
    total = m * t_b
    return contended(ctx, maximum(once, total - ctx.dp_overlap * ((m - 1) * compute + bwd)), total)


ZERO3_REDUCE_SHARE = 1.0 / 3.0
"""The gradient reduce-scatter's share of ZeRO-3's three per-layer collectives (two weight gathers
and one reduce-scatter of as many bytes). With wider (fp32) gradients the extra bytes are counted
with the blocking gathers: an upper estimate that keeps the exposed time non-decreasing in every
collective's bytes (the per-collective latency makes an exact split by bytes decrease it)."""


def zero3_on_demand_s(ctx: JobContext, total_s: Num, bwd_s: Num) -> Num:
    """Exposed ZeRO-3 time when weights are gathered on demand (``training.dp_comm_overlap``
    false): each layer's weight gathers block its compute, while the gradient reduce-scatters
    run on their own stream under the backward's compute (DeepSpeed's ``overlap_comm``, on by
    default at stage 3). ``total_s`` is the step's ZeRO-3 collective time, ``bwd_s`` its
    backward compute."""
    reduce_s = total_s * ZERO3_REDUCE_SHARE
    hidden_window_s = ctx.cal.dp_overlap * bwd_s
    return (total_s - reduce_s) + contended(ctx, maximum(0.0, reduce_s - hidden_window_s), reduce_s)


def gather_scale(ctx: JobContext, zero_stage: int) -> float | None:
    """Weight bytes per gradient byte of ZeRO-1/2's parameter all-gather, when it differs from the
    reduce-scatter's (fp32 gradients); None when the gather mirrors the reduce-scatter."""
    if zero_stage not in (1, 2) or ctx.grad_bytes == WEIGHT_BYTES:
        return None
    return WEIGHT_BYTES / ctx.grad_bytes


def _weight_gather_s(
    ctx: JobContext, zero_stage: int, dp_cp: tuple[Level, ...], edp: tuple[Level, ...], g_dense: Num, g_exp: Num
) -> Num | None:
    """ZeRO-1/2's parameter all-gather of a stage whose gradient bytes are ``g_dense`` and
    ``g_exp``: the reduce-scatter's collectives over the 16-bit weights' bytes. None when the
    gradients are as wide as the weights (the gather then takes the reduce-scatter's time)."""
    ratio = gather_scale(ctx, zero_stage)
    if ratio is None:
        return None
    dense, expert = dp_collective_parts_s(zero_stage, dp_cp, edp, g_dense * ratio, g_exp * ratio, 1, WEIGHT_BYTES)
    return dense + expert


def dp_exposed_s(
    ctx: JobContext,
    lay: StageLayout,
    groups: AxisGroups,
    dense: Num,
    expert: Num,
    n_layers: Num,
    max_layer_params: Num,
    compute: Num,
    fwd: Num,
    bwd: Num,
) -> Num:
    """Data-parallel communication a stage leaves exposed at the end of the step."""
    dp_cp, edp = _dp_levels(ctx, groups)
    g_dense, g_exp = dense * ctx.grad_bytes, expert * ctx.grad_bytes
    parts = dp_collective_parts_s(lay.zero_stage, dp_cp, edp, g_dense, g_exp, n_layers, ctx.grad_bytes)
    if lay.zero_stage == 3:
        unhidden = hierarchical_allgather_time_s(max_layer_params * WEIGHT_BYTES, dp_cp)
    else:
        unhidden = last_bucket_s(ctx, lay.zero_stage, dp_cp, g_dense)
    gather = _weight_gather_s(ctx, lay.zero_stage, dp_cp, edp, g_dense, g_exp)
    return dp_exposed_from_parts_s(ctx, lay.zero_stage, lay.num_micro_batches, n_layers, parts, unhidden,
                                    compute, fwd, bwd, gather)  # fmt: skip


def last_bucket_s(ctx: JobContext, zero_stage: int, dp_cp: tuple[Level, ...], g_dense: Num) -> Num:
    """The last dense gradient bucket's collective (ZeRO-0/1/2): what no overlap hides."""
    bucket = minimum(ctx.cal.dp_bucket_bytes, g_dense)
    if zero_stage == 0:
        return hierarchical_allreduce_time_s(bucket, dp_cp)
    return hierarchical_reduce_scatter_time_s(bucket, dp_cp)


def dp_bucketed_times_s(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, dense: Num, expert: Num
) -> tuple[Num, Num, Num, Num]:
    """ZeRO-0/1/2 data-parallel collectives of a stage: (gradient time, its last bucket,
    parameter all-gather time, its last bucket), each affine in the stage's parameters."""
    g_dense, g_exp = dense * ctx.grad_bytes, expert * ctx.grad_bytes
    dp_cp, edp = _dp_levels(ctx, groups)
    d, e = dp_collective_parts_s(lay.zero_stage, dp_cp, edp, g_dense, g_exp, 1, ctx.grad_bytes)
    t_b = d + e
    last_b = last_bucket_s(ctx, lay.zero_stage, dp_cp, g_dense)
    if lay.zero_stage == 0:
        return t_b, last_b, 0.0, 0.0
    gather = _weight_gather_s(ctx, lay.zero_stage, dp_cp, edp, g_dense, g_exp)
    # the parameter all-gather mirrors the gradient reduce-scatter in the weights' bytes
    return t_b, last_b, (t_b if gather is None else gather), last_b
