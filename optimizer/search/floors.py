"""Lower bounds on one layout's step time over its rank orders, for its own layer split
(``step_floor_s``, ``step_floor_exceeds``), and on each layer kind's time over the orders
(``kind_time_floor``): the search skips layouts whose floor is above the k-th best step. Each
stays below ``optimizer.cost.estimate.estimate`` for every order it covers. The floors over
layer splits too are in ``search.split_floors``."""

from __future__ import annotations

from typing import NamedTuple, cast

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.dp_comm import dp_exposed_s
from optimizer.cost.estimate import distinct_stages, pp_comm_s
from optimizer.cost.head import head_time_s
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import LayerKey, layout_layer_key, stage_fixed_cached
from optimizer.cost.topology import AxisGroups
from optimizer.search.orders import kind_times, order_geometries


class KindFloorKey(NamedTuple):
    """What ``kind_time_floor`` reads: the parallel sizes (its rank orders) and the fields of the
    layers' ``Dims``."""

    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    etp: int


def kind_floor_key(lay: ResolvedLayout) -> KindFloorKey:
    return tuple.__new__(KindFloorKey, (lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.micro_batch_size,
                                        lay.sequence_parallel, lay.recompute, lay.etp))  # fmt: skip


KIND_TIME_FLOOR = Memo[KindFloorKey, tuple[float, ...]]("kind_time_floor")


def kind_time_floor(ctx: JobContext, lay: ResolvedLayout) -> tuple[float, ...]:
    """Per layer kind, the smallest ``LayerCost.time_s`` over every rank order of the layout
    (memoised per ``KindFloorKey``: ZeRO stage, pipeline interleaving and the layer split do not
    change it)."""
    key = kind_floor_key(lay)
    table = ctx.caches[KIND_TIME_FLOOR]
    floor = table.get(key)
    if floor is None:
        per_geometry = [kind_times(ctx, lay, g) for g in order_geometries(ctx, lay)[0]]
        floor = table[key] = tuple(min(times[k] for times in per_geometry) for k in range(len(ctx.kinds)))
    return floor


STEP_FLOOR_MARGIN = 1e-9
"""Relative slack of ``step_floor_s`` for float rounding (the exact terms are summed differently)."""


def _uniform_floor_terms(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups
) -> tuple[list[tuple[float, tuple, AxisGroups]], float, list[tuple[float, float, int, float, float, float, float]]]:
    """(per distinct rank-order geometry: ``m + (pp-1)/vpp`` times the slowest stage under it, the
    key of its data-parallel/pipeline geometry and a representative order's groups, ascending;
    slowest optimizer step; every distinct stage's data-parallel inputs) of the layout's own
    split. ``groups``: any order's, for the order-free terms."""
    head = head_time_s(ctx, lay)
    stages = distinct_stages(ctx, lay)
    optimizer = 0.0
    dp_inputs: list[tuple[float, float, int, float, float, float, float]] = []
    for first, last, counts in stages:
        fixed = stage_fixed_cached(ctx, lay, groups, counts, first, last)
        # numbers for one layout (the cost functions return arrays only on ``cost.columns``'s path)
        optimizer = max(optimizer, cast(float, fixed[0].optimizer_s))
        dp_inputs.append(cast("tuple[float, float, int, float, float, float, float]", fixed[3]))
    mult = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    pairs: list[tuple[float, tuple, AxisGroups]] = []
    per_layer_geometry: dict[tuple, float] = {}
    for g in order_geometries(ctx, lay)[2]:
        key = (g.tp, g.cp, g.ep)
        if key not in per_layer_geometry:
            per_layer_geometry[key] = mult * _slowest_stage_s(ctx, lay, g, stages, head)
        pairs.append((per_layer_geometry[key], (g.dp_cp, g.edp, g.pp), g))
    pairs.sort(key=lambda p: p[0])
    return pairs, optimizer, dp_inputs


class SlowestKey(NamedTuple):
    """What ``_slowest_stage_s`` reads: the distinct stages, and the layers' ``Dims`` and TP / CP /
    EP geometries (``kind_times``; with them the LM head's time, which reads tp, cp and the
    micro-batch size)."""

    stages: tuple[tuple[bool, bool, tuple[int, ...]], ...]
    layer: LayerKey


def slowest_key(lay: ResolvedLayout, g: AxisGroups, stages: list[tuple[bool, bool, tuple[int, ...]]]) -> SlowestKey:
    return tuple.__new__(SlowestKey, (tuple(stages), layout_layer_key(lay, g)))


SLOWEST_STAGE = Memo[SlowestKey, float]("slowest_stage")


def _slowest_stage_s(
    ctx: JobContext, lay: ResolvedLayout, g: AxisGroups, stages: list[tuple[bool, bool, tuple[int, ...]]], head: float
) -> float:
    """The slowest of ``stages`` (``distinct_stages``) counting its layers' times under ``g``'s
    per-layer geometry and the LM head on the last stage (``head``, the layout's). Memoised per
    ``SlowestKey``: the ZeRO stage and the interleaving depth do not enter, so layouts that
    differ only in them share it."""
    key = slowest_key(lay, g, stages)
    table = ctx.caches[SLOWEST_STAGE]
    slowest = table.get(key)
    if slowest is None:
        times = kind_times(ctx, lay, g)
        slowest = table[key] = max(
            sum(n * t for n, t in zip(counts, times, strict=True)) + (head if last else 0.0)
            for _, last, counts in stages
        )
    return slowest


def _uniform_comm_s(ctx: JobContext, lay: ResolvedLayout, g: AxisGroups, dp_inputs: list) -> float:
    """Slowest stage's exposed data-parallel time + pipeline send/recv under ``g``."""
    # a number for one layout
    return cast(float, max(dp_exposed_s(ctx, lay, g, *inputs) for inputs in dp_inputs) + pp_comm_s(ctx, lay, g))


def step_floor_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """A lower bound on ``estimate(ctx, lay, order).step_time_s`` over every rank order, for the
    layout's own layer split (``groups``: any order's; only its order-free terms are read).

    The step is ``(m + (pp-1)/vpp) * slowest stage + pipeline send/recv + slowest exposed DP +
    slowest optimizer``. Per rank order: each stage's time is at least its layers' times plus the
    LM head on the last stage; the communication terms are exact. The smallest over the orders'
    distinct geometries is taken; the optimizer term does not depend on the order.
    """
    pairs, optimizer, dp_inputs = _uniform_floor_terms(ctx, lay, groups)
    comm: dict[tuple, float] = {}
    best = float("inf")
    for st, ckey, g in pairs:
        if ckey not in comm:
            comm[ckey] = _uniform_comm_s(ctx, lay, g, dp_inputs)
        best = min(best, st + comm[ckey])
    return (best + optimizer) * (1.0 - STEP_FLOOR_MARGIN)


def step_floor_exceeds(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, threshold: float) -> bool:
    """``step_floor_s(ctx, lay, groups) > threshold``, stopping as soon as that is decided.

    The same arithmetic: the floor is the smallest over the orders' geometries of a sum, so one
    geometry at or below the threshold settles False; geometries come in ascending order of their
    layer part, so once that alone (with the optimizer step) exceeds the threshold, so do the rest.
    """
    pairs, optimizer, dp_inputs = _uniform_floor_terms(ctx, lay, groups)
    comm: dict[tuple, float] = {}
    for st, ckey, g in pairs:
        if (st + 0.0 + optimizer) * (1.0 - STEP_FLOOR_MARGIN) > threshold:
            return True
        if ckey not in comm:
            comm[ckey] = _uniform_comm_s(ctx, lay, g, dp_inputs)
        if (st + comm[ckey] + optimizer) * (1.0 - STEP_FLOOR_MARGIN) <= threshold:
            return False
    return True
