"""Lower bounds on step time and memory of a layout over every rank order and layer split, from
per-layer totals (``lower_bound_layer_totals``): plain arithmetic on numbers or numpy arrays, so
the bound phase (``search.bounds``) bounds whole blocks of layouts at once with the same floats."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple, cast

import numpy as np

from optimizer.cost.caches import Memo
from optimizer.cost.comm import p2p_time_s
from optimizer.cost.context import JobContext
from optimizer.cost.dp_comm import (
    dp_collective_parts_s,
    dp_exposed_from_parts_s,
    dp_ring,
    expert_dp_ring,
    gather_scale,
    last_bucket_s,
)
from optimizer.cost.estimate import pp_comm_from_p2p_s, pp_message_bytes, pp_sends_s
from optimizer.cost.head import head_time_s
from optimizer.cost.layer import Dims
from optimizer.cost.layer_memo import kind_compute
from optimizer.cost.memory import (
    ADAM_STEP_BYTES,
    optimizer_shards,
    shard_group_sizes,
    static_memory_bytes,
)
from optimizer.cost.num import Num
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import group_geometry
from optimizer.search.comm_floors import ep_comm_floor_s, group_geometries, tp_cp_floor_s
from optimizer.search.floors import STEP_FLOOR_MARGIN


def memory_floor_bytes(
    ctx: JobContext, zero_stage: int, dp: Num, cp: Num, tp: Num, ep: Num, pp: Num, totals: tuple[Num, ...]
) -> Num:
    """A lower bound on the peak per-GPU memory of a layout over every rank order and layer split,
    from its ``lower_bound_layer_totals``: that of the average stage (every layer and the
    embedding over ``pp``) counting only the CUDA context, its weights, gradients and optimizer
    state, one micro-batch of its stored activations, and the allocator's fragmentation share of
    those activations and the gradients. Each stage holds at least that much of its own (every
    stage has at least one micro-batch in flight: ``in_flight_microbatches``), it is linear in
    the stage's parameters and stored activations (sharded alike on every stage), so the largest
    stage's is at least the average's; working buffers and NCCL groups only add. A layout whose
    floor is above the usable capacity fits in memory under no split. ``zero_stage`` is a number;
    the rest numbers or numpy arrays (broadcast)."""
    dense, expert, stored = totals[1] / pp, totals[2] / pp, totals[5] / pp
    shards = shard_group_sizes(dp, cp, tp, ep)
    weights, grads, optim = static_memory_bytes(ctx, zero_stage, dense, expert, *shards,
                                                *optimizer_shards(zero_stage, dp, cp, tp, ep))  # fmt: skip
    frag = ctx.cal.fragmentation
    floor = ctx.cal.cuda_context_bytes + (weights + grads + optim) + (1.0 + frag) * stored + frag * grads
    # less 1e-9 relative: the terms are summed differently from a stage's own
    return floor * (1.0 - STEP_FLOOR_MARGIN)


def compute_lower_bound_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A lower bound on ``estimate(...).step_time_s`` for every rank order and layer split.

    The slowest stage is at least the average stage, so ``m * avg + (pp-1)/vpp * avg`` bounds the
    steady pipeline plus bubble, the average stage's optimizer step bounds the optimizer term, and
    ``pp_comm_s`` at the cheapest send any pipeline-group geometry gives bounds the pipeline
    sends; every other term is non-negative. Uses the same per-layer costs.
    """
    return compute_lower_bounds(ctx, (lay,))[0]


def compute_lower_bounds(ctx: JobContext, layouts: Sequence[ResolvedLayout]) -> list[float]:
    """``compute_lower_bound_s`` of each layout, in one loop (the search bounds every layout)."""
    return [
        cast(float, bound_at_vpp(ctx, terms, lay.pp, lay.vpp, lay.num_micro_batches))  # a number for one layout
        for terms, lay in zip(lower_bound_terms(ctx, layouts), layouts, strict=True)
    ]


def bound_at_vpp(ctx: JobContext, terms: tuple[Num, Num, Num, Num], pp: Num, vpp: Num, m: Num) -> Num:
    """The lower bound from a layout's ``lower_bound_terms`` at interleaving depth ``vpp``: the
    bubble falls as it rises, the pipeline sends grow with it (``pp_comm_from_p2p_s`` at the
    cheapest send). Plain arithmetic: the arguments may be numbers or numpy arrays (the search
    bounds whole blocks of layouts at once), with the same floats either way."""
    steady, avg, optimizer, p2p = terms
    return steady + (pp - 1) / vpp * avg + optimizer + pp_comm_from_p2p_s(ctx, pp, vpp, m, p2p)


def family_bound(ctx: JobContext, terms: tuple[Num, Num, Num, Num], pp: Num, vpps: Sequence[int], m: Num) -> Num:
    """The smallest ``bound_at_vpp`` over the depths ``vpps`` (ascending). The bound is
    ``a + b / vpp + c * vpp`` with ``b, c >= 0`` (the bubble falls, the sends grow), convex in
    ``vpp``: its smallest over a sorted set is at one of the two depths beside ``sqrt(b / c)``.
    ``b`` and ``c`` are read off ``bound_at_vpp`` and ``pp_sends_s`` (the sends' share per unit
    of depth): a change to either formula's shape must keep it convex in ``vpp`` or change this
    too (``test_family_bound_is_the_smallest_member_bound`` checks the two agree). Depth 1, where
    the sends may block (``pp_comm_from_p2p_s``), is bounded on its own.
    ``terms``, ``pp`` and ``m`` may be numbers (the answer is a float) or numpy arrays of one
    shape (the answer is an array of it)."""
    if len(vpps) > 2 and vpps[0] == 1:
        best = np.minimum(bound_at_vpp(ctx, terms, pp, 1, m), family_bound(ctx, terms, pp, vpps[1:], m))
    elif len(vpps) <= 2:
        best = functools.reduce(np.minimum, (bound_at_vpp(ctx, terms, pp, v, m) for v in vpps))
    else:
        depths = np.asarray(vpps)
        b = (pp - 1) * terms[1]
        c = pp_sends_s(ctx, pp, 1, m, terms[3]) - pp_sends_s(ctx, pp, 0, m, terms[3])
        with np.errstate(divide="ignore", invalid="ignore"):
            beside = np.where(c > 0, np.searchsorted(depths, np.sqrt(np.divide(b, c)), side="left"), len(vpps))
        below = bound_at_vpp(ctx, terms, pp, depths[np.maximum(beside - 1, 0)], m)
        above = bound_at_vpp(ctx, terms, pp, depths[np.minimum(beside, len(vpps) - 1)], m)
        best = np.minimum(np.where(beside >= 1, below, np.inf), np.where(beside < len(vpps), above, np.inf))
    return best if np.ndim(best) else float(best)


def bound_terms(
    ctx: JobContext,
    totals: tuple[Num, ...],
    pp: Num,
    m: Num,
    dense_shard: Num,
    expert_shard: Num,
    p2p: Num,
    dp_floor: Num,
) -> tuple[Num, Num, Num, Num]:
    """``lower_bound_terms`` from a layout's ``lower_bound_layer_totals`` (every layer's time,
    dense and expert parameters, ...), its ``pp`` and micro-batch count, the ranks its optimizer
    state is sharded over (dense, expert; 1 without ZeRO), its ``p2p_floor_s`` and its
    ``dp_exposed_floor_s``. Plain arithmetic: numbers or numpy arrays (``search.bounds`` bounds
    blocks of layouts with it)."""
    layer_time, dense, expert = totals[:3]
    hbm = ctx.hbm_bytes_per_s
    avg = layer_time / pp
    # The optimizer step of the heaviest stage is at least that of the average stage.
    optimizer = (dense / dense_shard + expert / expert_shard) / pp * ADAM_STEP_BYTES / hbm
    return (m * avg, avg, optimizer + dp_floor, p2p)


def dp_exposed_floor_s(
    ctx: JobContext,
    zero_stage: int,
    dp: Num,
    cp: Num,
    tp: Num,
    ep: Num,
    pp: Num,
    m: Num,
    totals: tuple[Num, ...],
    head: Num,
) -> Num:
    """A lower bound on the slowest stage's exposed data-parallel time over every rank order and
    every layer split with at least one layer per stage, from ``lower_bound_layer_totals`` and
    ``head_time_s`` (the LM head).

    With ZeRO-0/1/2 it is also at least the last gradient bucket's collective (twice with
    ZeRO-1/2, whose parameter gather leaves its mirror exposed) at the average stage's dense
    gradient bytes: no overlap hides it, and the bucket time does not decrease in the bytes.

    Each stage's exposed time is at least ``dp_exposed_from_parts_s`` with nothing counted as
    unhidden (the maxima with 0 are convex, the collective parts affine in the stage's bytes and
    layer count), so the slowest stage's is at least the average stage's: every layer, the
    embedding, and for ZeRO-3's overlap the LM head, over ``pp``. It does not decrease in the
    collective parts, so it is at least its value at each part's smallest over every geometry
    its group can have (``group_geometries``): the dense ``dp x cp`` group (``dp`` alone when a
    rank order separates the two axes) and the expert ``tp x cp x dp / ep`` group. ``zero_stage``
    is a number; the rest numbers or numpy arrays of one shape (the answer is then an array)."""
    arrays = (dp, cp, tp, ep, pp, m, head, *totals)
    scalar = not any(isinstance(a, np.ndarray) for a in arrays)
    dp, cp, tp, ep, pp, m, head, _, dense, expert, fwd, bwd, _ = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(a)) for a in arrays)
    )
    n_layers = (ctx.job.model.num_layers or 0) / pp
    g_dense, g_exp = dense * ctx.grad_bytes / pp, expert * ctx.grad_bytes / pp

    def smallest(sizes: np.ndarray, ring, cost, g: np.ndarray) -> np.ndarray:
        """``cost(levels, selection, bytes)`` at its smallest over every geometry of the group."""
        best = np.full(sizes.shape, np.inf)
        for size in np.unique(sizes):
            sel = sizes == size
            for geo in group_geometries(ctx, int(size)):
                best[sel] = np.minimum(best[sel], cost(ring(ctx, geo), sel, g[sel]))
        return best

    def smallest_dense(cost, g: np.ndarray) -> np.ndarray:
        """``smallest`` over the dense ``dp x cp`` group, or ``dp`` alone when an order separates them."""
        best = smallest(dp * cp, dp_ring, cost, g)
        if np.any(cp > 1):
            best = np.minimum(best, np.where(cp > 1, smallest(dp, dp_ring, cost, g), np.inf))
        return best

    def dense_collective(levels, sel, g):  # the expert part runs over no levels: 0, not read
        return dp_collective_parts_s(zero_stage, levels, (), g, g, n_layers[sel], ctx.grad_bytes)[0]

    def expert_collective(levels, sel, g):
        return dp_collective_parts_s(zero_stage, (), levels, g, g, n_layers[sel], ctx.grad_bytes)[1]

    def parts(g_dense: np.ndarray, g_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (smallest_dense(dense_collective, g_dense),
                smallest(tp * cp * dp // ep, expert_dp_ring, expert_collective, g_exp))  # fmt: skip

    dense_part, expert_part = parts(g_dense, g_exp)
    ratio = gather_scale(ctx, zero_stage)
    gather = None if ratio is None else sum(parts(g_dense * ratio, g_exp * ratio))
    compute = (fwd + bwd + head) / pp
    floor = dp_exposed_from_parts_s(ctx, zero_stage, m, n_layers, (dense_part, expert_part), 0.0,
                                     compute, fwd / pp, bwd / pp, gather)  # fmt: skip
    if zero_stage != 3:
        # the last gradient bucket is never hidden (twice with ZeRO-1/2: its parameter gather too);
        # the stage with the most dense parameters has at least the average's
        last_bucket = smallest_dense(lambda levels, _, g: last_bucket_s(ctx, zero_stage, levels, g), g_dense)
        floor = np.maximum(floor, (1 if zero_stage == 0 else 2) * last_bucket)
    floor = floor * (1.0 - STEP_FLOOR_MARGIN)  # the terms are summed differently from the exact ones
    return float(cast(np.ndarray, floor)[0]) if scalar else floor  # an array: the inputs went through atleast_1d


def lower_bound_terms(ctx: JobContext, layouts: Sequence[ResolvedLayout]) -> list[tuple[float, float, float, float]]:
    """Per layout, what its bound is made of apart from the interleaving depth: ``m`` times the
    average stage's time per micro-batch, that time, the average stage's optimizer step plus a
    floor on the exposed data-parallel time (``dp_exposed_floor_s``), and one pipeline send at its
    cheapest over every geometry the pipeline group can have."""
    out = []
    for lay in layouts:
        totals = lower_bound_layer_totals(
            ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute, lay.etp
        )
        block = lay.ep * lay.etp  # the ranks that split the experts: shards are over the rest
        shards = optimizer_shards(lay.zero_stage, lay.dp, lay.cp, lay.tp, block)
        dp_floor = dp_exposed_floor_s(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, block, lay.pp,
                                      lay.num_micro_batches, totals, head_time_s(ctx, lay))  # fmt: skip
        terms = bound_terms(ctx, totals, lay.pp, lay.num_micro_batches, *shards, p2p_floor_s(ctx, lay), dp_floor)
        out.append(cast("tuple[float, float, float, float]", terms))  # numbers for one layout
    return out


class TotalsKey(NamedTuple):
    """All ``_lower_bound_totals`` reads of a layout: the fields of its layers' ``Dims``."""

    tp: int
    cp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    etp: int


LOWER_BOUND_TOTALS = Memo[TotalsKey, tuple[float, float, float, float, float, float]]("lower_bound_layer_totals")


def lower_bound_layer_totals(
    ctx: JobContext,
    tp: int,
    cp: int,
    ep: int,
    micro_batch_size: int,
    sequence_parallel: bool,
    recompute: str,
    etp: int = 1,
) -> tuple[float, float, float, float, float, float]:
    """``_lower_bound_totals``, memoised per ``TotalsKey``."""
    key = tuple.__new__(TotalsKey, (tp, cp, ep, micro_batch_size, sequence_parallel, recompute, etp))
    table = ctx.caches[LOWER_BOUND_TOTALS]
    totals = table.get(key)
    if totals is None:
        dims = Dims(key.tp, key.cp, key.ep, key.micro_batch_size, key.sequence_parallel, key.recompute, key.etp)
        totals = table[key] = _lower_bound_totals(ctx, dims)
    return totals


class P2PKey(NamedTuple):
    """All ``_p2p_floor_s`` reads of a layout: the pipeline depth (the group's geometries) and
    what sets the message size (``pp_message_bytes``: TP divides it only with sequence parallelism)."""

    pp: int
    micro_batch_size: int
    cp: int
    sp_tp: int
    """``tp`` with sequence parallelism, else 1."""


def p2p_key(lay: ResolvedLayout) -> P2PKey:
    return tuple.__new__(P2PKey, (lay.pp, lay.micro_batch_size, lay.cp, lay.tp if lay.sequence_parallel else 1))


P2P_FLOOR = Memo[P2PKey, float]("p2p_floor_s")


def p2p_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """``_p2p_floor_s`` memoised per ``P2PKey`` (0 without pipelining)."""
    if lay.pp == 1:
        return 0.0
    key = p2p_key(lay)
    table = ctx.caches[P2P_FLOOR]
    p2p = table.get(key)
    if p2p is None:
        p2p = table[key] = _p2p_floor_s(ctx, lay)
    return p2p


def _p2p_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """The cheapest pipeline send of ``lay`` over every geometry its pipeline group can have."""
    msg = pp_message_bytes(ctx, lay)
    return min(
        p2p_time_s(msg, g.levels[-1].beta_bytes_per_s, g.levels[-1].alpha_s) if g.levels else 0.0
        for g in group_geometries(ctx, lay.pp)
    )


def _lower_bound_totals(ctx: JobContext, dims: Dims) -> tuple[float, float, float, float, float, float]:
    """(every layer's time, dense parameters with the embedding, expert parameters, every layer's
    forward compute, every layer's backward compute, every layer's stored activation bytes) on one
    GPU, per micro-batch.

    A layer's time is its compute plus its TP, CP and EP communication, each of which depends only
    on its own axis's group geometry (``layer.tp_comm_s`` etc.): each at its smallest over the
    geometries the axis can have bounds every rank order."""
    one = group_geometry(ctx.topology, 1, 1)
    # A dense layer's cost does not depend on ep, nor its TP and CP terms on ep: keys without it
    # are shared by every expert-parallel degree (most of the keys of an MoE job).
    no_ep = Dims(dims.tp, dims.cp, 1, dims.micro_batch_size, dims.sequence_parallel, dims.recompute)
    times = []
    costs = []
    for i, kind in enumerate(ctx.kinds):
        c = kind_compute(ctx, i, dims if kind.is_moe else no_ep)
        t = c.fwd_s + c.bwd_s + tp_cp_floor_s(ctx, i, no_ep, c)
        if kind.is_moe and dims.ep * dims.etp > 1:
            t += ep_comm_floor_s(ctx, kind, dims, one)
        costs.append(c)
        times.append(t)
    per_layer_total = sum(ctx.kind_prefix[k][-1] * t for k, t in enumerate(times))
    dense = sum(ctx.kind_prefix[k][-1] * c.dense_params for k, c in enumerate(costs))
    expert = sum(ctx.kind_prefix[k][-1] * c.expert_params for k, c in enumerate(costs))
    fwd = sum(ctx.kind_prefix[k][-1] * c.fwd_s for k, c in enumerate(costs))
    bwd = sum(ctx.kind_prefix[k][-1] * c.bwd_s for k, c in enumerate(costs))
    stored = sum(ctx.kind_prefix[k][-1] * c.stored_act_bytes for k, c in enumerate(costs))
    return (per_layer_total, dense + ctx.embedding_params / dims.tp, expert, fwd, bwd, stored)
