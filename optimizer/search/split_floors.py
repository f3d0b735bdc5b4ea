"""Lower bounds on one layout's step time over its rank orders and its layer splits
(``split_floor_s``, ``order_split_floors``, ``split_may_reach``; ``layers_floor_s``, a cheaper
one): the search skips layouts and (layout, order) pairs whose floor is above the k-th best
step. Each stays below ``optimizer.cost.estimate.estimate`` for every order and split it covers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, cast

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.dp_comm import dp_bucketed_times_s, dp_exposed_s, gradient_exposed_s
from optimizer.cost.estimate import Estimate, pp_comm_s
from optimizer.cost.head import head_time_at_s, head_time_s
from optimizer.cost.layer import contended
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import layout_kind_costs, stage_fixed_cached
from optimizer.cost.topology import AxisGroups, GroupGeometry, axis_groups
from optimizer.search.floors import STEP_FLOOR_MARGIN, kind_time_floor
from optimizer.search.orders import any_order_groups, kind_times, order_geometries
from optimizer.search.split_bound import stage_split_reaches


class MinMaxStageKey(NamedTuple):
    """All ``_min_max_stage_floor_s`` reads: the pipeline depth, the LM head's fields, the times."""

    pp: int
    tp: int
    cp: int
    micro_batch_size: int
    times: tuple[float, ...]


def min_max_stage_key(lay: ResolvedLayout, times: tuple[float, ...]) -> MinMaxStageKey:
    return tuple.__new__(MinMaxStageKey, (lay.pp, lay.tp, lay.cp, lay.micro_batch_size, times))


MIN_MAX_STAGE_FLOOR = Memo[MinMaxStageKey, float]("min_max_stage_floor")


def _min_max_stage_floor_s(ctx: JobContext, lay: ResolvedLayout, times: tuple[float, ...]) -> float:
    """A lower bound on the slowest stage's time over every layer split, each layer kind taking
    ``times[k]`` (one rank order's, or a floor over orders).

    Stage times add up to every layer's time plus the LM head, so the slowest is at least their
    average. And stages hold whole layers, a stage of q layers taking at least the time of the
    model's q cheapest layers, with the head on the last stage: the best any split can do is the
    best choice of the last stage's layer count with the rest spread as evenly as whole layers
    allow (with one layer kind, q times its time; with several, e.g. DeepSeek-V3's three dense
    layers among 58 MoE layers, much more than q times the cheapest kind's).
    """
    key = min_max_stage_key(lay, times)
    table = ctx.caches[MIN_MAX_STAGE_FLOOR]
    floor = table.get(key)
    if floor is None:
        floor = table[key] = _min_max_stage_floor_uncached(ctx, key)
    return floor


def _min_max_stage_floor_uncached(ctx: JobContext, key: MinMaxStageKey) -> float:
    """``_min_max_stage_floor_s`` from its key alone."""
    pp, times = key.pp, key.times
    head = head_time_at_s(ctx, key.tp, key.cp, key.micro_batch_size)
    totals = [ctx.kind_prefix[k][-1] for k in range(len(times))]
    average = (sum(n * f for n, f in zip(totals, times, strict=True)) + head) / pp
    if pp == 1:
        return average
    layers = sum(totals)
    by_time = sorted(range(len(times)), key=lambda k: times[k])

    def cheapest(q: int) -> float:
        """The time of the model's q cheapest layers: no stage of q layers is faster."""
        t, left = 0.0, q
        for k in by_time:
            take = min(left, totals[k])
            t += take * times[k]
            left -= take
        return t

    def worst(n_last: int) -> float:  # the last stage holds n_last layers, the rest spread evenly
        return max(cheapest(n_last) + head, cheapest(-(-(layers - n_last) // (pp - 1))))

    # The last stage's time grows with n_last and the others' shrinks (in steps), so the smallest
    # worst case is at the first n_last where the last stage is the slowest, or just before it.
    lo, hi = 0, layers
    while lo < hi:
        mid = (lo + hi) // 2
        if cheapest(mid) + head >= cheapest(-(-(layers - mid) // (pp - 1))):
            hi = mid
        else:
            lo = mid + 1
    whole = min(worst(lo), worst(lo - 1)) if lo > 0 else worst(lo)
    return max(average, whole)


NO_OVERLAP_S = 1e30
"""Compute time passed to ``dp_exposed_s`` so that overlap hides everything it can."""


def split_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A lower bound on ``estimate(...).step_time_s`` over every rank order and every layer
    split with at least one layer per stage (all the search builds).

    The smallest, over the distinct geometries of the rank orders, of ``(m + (pp-1)/vpp) *
    _min_max_stage_floor_s`` (the order's own layer times) + pipeline send/recv + a floor on the
    slowest stage's exposed data-parallel time; + the average stage's optimizer step. Less 1e-9
    relative for rounding. Layer and communication terms come from the same order: an order that
    puts TP or EP on NVLink cannot also put the data-parallel rings there.

    The data-parallel floor is ``dp_exposed_s`` of the average stage (its parameters,
    compute and layer count are the totals over ``pp``): the collectives are affine in their
    bytes (and, per ZeRO-3 layer gather, in the layer count) and the overlap terms are maxima,
    so the slowest stage's time is at least the average's, provided the term no overlap hides is
    the same for every stage or largest on the stage the floor takes it from: ZeRO-3's first
    gather (the largest layer, which some stage holds), or the last gradient bucket when each
    stage's dense gradients fill one. Otherwise it is ``dp_exposed_s`` of the stage holding at
    least the average dense parameters with nothing to overlap against counted: what no overlap
    can hide (the last bucket).
    """
    floors = order_split_floors(ctx, lay)
    return floors[0][0]


def layers_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A cheap lower bound on ``split_floor_s``: its layer part with each layer kind at its
    fastest over every rank order (no communication, no optimizer step)."""
    steady = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    return steady * _min_max_stage_floor_s(ctx, lay, kind_time_floor(ctx, lay)) * (1.0 - STEP_FLOOR_MARGIN)


class FamilyKey(NamedTuple):
    """What a term the layouts of one family share reads (``_split_floor_parts``,
    ``_split_floor_stage_inputs``): every field but the interleaving depth and the layer split
    (``num_micro_batches`` follows from ``dp`` and ``micro_batch_size``)."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    etp: int


def family_key(lay: ResolvedLayout) -> FamilyKey:
    return tuple.__new__(FamilyKey, (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
                                     lay.recompute, lay.sequence_parallel, lay.etp))  # fmt: skip


class SplitFloorsKey(NamedTuple):
    """What ``order_split_floors`` reads: ``FamilyKey``, the depth asked for and the micro-batch count."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    vpp: int
    num_micro_batches: int
    etp: int


def split_floors_key(lay: ResolvedLayout, vpp: int) -> SplitFloorsKey:
    return tuple.__new__(SplitFloorsKey, (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
                                          lay.recompute, lay.sequence_parallel, vpp, lay.num_micro_batches,
                                          lay.etp))  # fmt: skip


ORDER_SPLIT_FLOORS = Memo[SplitFloorsKey, list[tuple[float, AxisGroups]]]("order_split_floors")
SPLIT_FLOOR_PARTS = Memo[FamilyKey, tuple[float, list[tuple[float, float, AxisGroups]]]]("split_floor_parts")
SPLIT_FLOOR_INPUTS = Memo[FamilyKey, tuple[float, tuple, tuple]]("split_floor_stage_inputs")


def order_split_floors(ctx: JobContext, lay: ResolvedLayout, vpp: int | None = None) -> list[tuple[float, AxisGroups]]:
    """``split_floor_s`` per distinct rank-order geometry of the layout (a representative order's
    groups), ascending: a lower bound on ``estimate`` in that order over every layer split. At
    interleaving depth ``vpp`` (default the layout's): the layout of ``lay``'s family at that
    depth gets the same floats, as nothing else of the depth enters. Memoised per layout and
    depth (the layout's own split does not enter); the terms that do not depend on the depth are
    shared by the family."""
    vpp = lay.vpp if vpp is None else vpp
    key = split_floors_key(lay, vpp)
    table = ctx.caches[ORDER_SPLIT_FLOORS]
    floors = table.get(key)
    if floors is not None:
        return floors
    optimizer, parts = _split_floor_parts(ctx, lay)
    steady = lay.num_micro_batches + (lay.pp - 1) / vpp
    sends: dict[GroupGeometry, float] = {}
    floors = []
    for stage, dp, g in parts:
        send = sends.get(g.pp)
        if send is None:
            send = sends[g.pp] = pp_comm_s(ctx, lay, g, vpp)
        floors.append(((optimizer + (steady * stage + (dp + send))) * (1.0 - STEP_FLOOR_MARGIN), g))
    floors.sort(key=lambda fg: fg[0])
    table[key] = floors
    return floors


def split_floor_at_vpp_s(ctx: JobContext, lay: ResolvedLayout, vpp: int) -> float:
    """``split_floor_s`` of the layout of ``lay``'s family at interleaving depth ``vpp``, without
    resolving that layout; the same memo entry as that layout's own ``split_floor_s``."""
    return order_split_floors(ctx, lay, vpp)[0][0]


def _split_floor_parts(ctx: JobContext, lay: ResolvedLayout) -> tuple[float, list[tuple[float, float, AxisGroups]]]:
    """The terms of ``order_split_floors`` that do not depend on the interleaving depth: the
    average stage's optimizer step, and per distinct rank-order geometry the slowest stage's
    floor (``_min_max_stage_floor_s`` of that order's layer times), the data-parallel floor and
    a representative order's groups. Memoised."""
    key = family_key(lay)
    table = ctx.caches[SPLIT_FLOOR_PARTS]
    cached = table.get(key)
    if cached is not None:
        return cached
    per_layer_geometry: dict[tuple, float] = {}
    per_dp_geometry: dict[tuple, float] = {}
    parts = []
    for g in order_geometries(ctx, lay)[2]:
        lkey, dkey = (g.tp, g.cp, g.ep), (g.dp_cp, g.edp)
        if lkey not in per_layer_geometry:
            per_layer_geometry[lkey] = _min_max_stage_floor_s(ctx, lay, kind_times(ctx, lay, g))
        if dkey not in per_dp_geometry:
            per_dp_geometry[dkey] = _split_floor_dp_s(ctx, lay, g)
        parts.append((per_layer_geometry[lkey], per_dp_geometry[dkey], g))
    cached = table[key] = (_split_floor_stage_inputs(ctx, lay)[0], parts)
    return cached


def split_may_reach(ctx: JobContext, est: Estimate, limits: Sequence[int], threshold_s: float) -> bool:
    """False only when no layer split of ``est``'s layout in ``est``'s rank order with stage
    ``s`` holding at most ``limits[s]`` layers (``stage_fit_limits``) can have a step time at
    most ``threshold_s`` (True does not promise one: the test is of a relaxation, and rules
    nothing out for three or more layer kinds).

    The step is at least ``split_floor_s``'s terms of this order with the slowest stage at
    its smallest over such splits, and ``stage_split_reaches`` decides exactly, for a relaxation
    (layer kinds on any stage), whether that stage can be fast enough. Tighter than the floor when
    stages must hold whole layers of unequal kinds or memory caps some stages."""
    lay = est.layout
    if lay.pp == 1 or not math.isfinite(threshold_s):
        return True
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    steady = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    rest = _split_floor_stage_inputs(ctx, lay)[0] + _split_floor_dp_s(ctx, lay, groups) + pp_comm_s(ctx, lay, groups)
    stage_time = (threshold_s / (1.0 - STEP_FLOOR_MARGIN) - rest) / steady
    totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
    return stage_split_reaches(stage_time, kind_times(ctx, lay, groups), totals, head_time_s(ctx, lay), lay.vpp, limits)


def _split_floor_stage_inputs(ctx: JobContext, lay: ResolvedLayout) -> tuple[float, tuple, tuple]:
    """(the average stage's optimizer step, the average stage's data-parallel inputs, the inputs
    of the stage the data-parallel floor is taken from) of ``split_floor_s``. Memoised."""
    key = family_key(lay)
    table = ctx.caches[SPLIT_FLOOR_INPUTS]
    cached = table.get(key)
    if cached is not None:
        return cached
    groups = any_order_groups(ctx, lay)
    totals = tuple(ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds)))
    # one stage holding every layer and the embedding: its parameters, compute and optimizer step
    everything, _, _, dp_inputs = stage_fixed_cached(ctx, lay, groups, totals, True, False)
    dense, expert, n_layers, max_layer_params, compute, fwd, bwd = dp_inputs
    pp = lay.pp
    smallest_layer = min(c.dense_params for c in layout_kind_costs(ctx, lay, groups))
    average = (dense / pp, expert / pp, n_layers / pp, max_layer_params, (compute + head_time_s(ctx, lay)) / pp,
               fwd / pp, bwd / pp)  # fmt: skip
    if lay.zero_stage == 3 or smallest_layer * ctx.grad_bytes >= ctx.cal.dp_bucket_bytes:
        stage = average  # the head is on the last stage: more compute to overlap with
    else:
        stage = (dense / pp, 0.0, 1, max_layer_params, NO_OVERLAP_S, NO_OVERLAP_S, NO_OVERLAP_S)
    cached = table[key] = cast(
        "tuple[float, tuple, tuple]", (everything.optimizer_s / pp, average, stage)
    )  # numbers for one layout
    return cached


def _split_floor_dp_s(ctx: JobContext, lay: ResolvedLayout, g: AxisGroups) -> float:
    """``split_floor_s``'s floor on the slowest stage's exposed data-parallel time in the rank
    order of ``g`` (the same for every interleaving depth)."""
    _, average, stage = _split_floor_stage_inputs(ctx, lay)
    if stage is average:
        return cast(float, dp_exposed_s(ctx, lay, g, *stage))  # a number for one layout
    # What no overlap hides, or the overlap-limited part of the average stage (each stage's
    # exposed time is at least its own, which is affine in the stage's parameters and compute).
    # (affine in the stage's bytes and compute, with the SM share overlapped time still costs)
    t_b, _, t_f, _ = dp_bucketed_times_s(ctx, lay, g, *average[:2])
    m, compute, fwd, bwd = lay.num_micro_batches, average[4], average[5], average[6]
    excess = gradient_exposed_s(ctx, lay.zero_stage, m, t_b, 0.0, compute, bwd) + contended(
        ctx, t_f - ctx.dp_overlap * fwd, t_f
    )
    return cast(float, max(dp_exposed_s(ctx, lay, g, *stage), excess if t_b > 0 else 0.0))  # a number for one layout
