"""The distinct rank-order geometries of a layout, and the per-layer-kind times under one: what
the search's floors and split tables iterate over."""

from __future__ import annotations

from optimizer.cost import SizesKey, sizes_key
from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import LayerKey, layout_kind_costs, layout_layer_key
from optimizer.cost.topology import AxisGroups, axis_groups

ORDER_GEOMETRIES = Memo[SizesKey, tuple[list[AxisGroups], list[AxisGroups], list[AxisGroups]]]("order_geometries")


def order_geometries(
    ctx: JobContext, lay: ResolvedLayout
) -> tuple[list[AxisGroups], list[AxisGroups], list[AxisGroups]]:
    """One rank order's groups per distinct (tp, cp, ep) geometry, which is all the per-layer
    costs read; per distinct (dp x cp, expert-dp, pp) geometry, which is all the exposed
    data-parallel and pipeline communication read; and per distinct pair of the two, which is
    all a whole step reads (memoised per ``SizesKey``)."""
    key = sizes_key(lay)
    table = ctx.caches[ORDER_GEOMETRIES]
    reps = table.get(key)
    if reps is None:
        sizes = key.sizes()
        layer: dict[tuple, AxisGroups] = {}
        comm: dict[tuple, AxisGroups] = {}
        both: dict[tuple, AxisGroups] = {}
        for o in ctx.rank_orders(sizes):
            g = axis_groups(ctx.topology, o, sizes)
            layer.setdefault((g.tp, g.cp, g.ep, g.etp, g.tp_ep), g)
            comm.setdefault((g.dp_cp, g.edp, g.pp), g)
            both.setdefault((g.tp, g.cp, g.ep, g.etp, g.tp_ep, g.dp_cp, g.edp, g.pp), g)
        reps = table[key] = (list(layer.values()), list(comm.values()), list(both.values()))
    return reps


def any_order_groups(ctx: JobContext, lay: ResolvedLayout) -> AxisGroups:
    """The groups of one rank order of the layout (the canonical first; memoised), for terms
    that do not depend on the order."""
    return order_geometries(ctx, lay)[0][0]


KIND_TIMES = Memo[LayerKey, tuple[float, ...]]("kind_times")


def kind_times(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> tuple[float, ...]:
    """Per layer kind, ``LayerCost.time_s`` under the groups' (tp, cp, ep) geometry (memoised per
    ``layout_layer_key``)."""
    key = layout_layer_key(lay, groups)
    table = ctx.caches[KIND_TIMES]
    times = table.get(key)
    if times is None:
        times = table[key] = tuple(c.time_s for c in layout_kind_costs(ctx, lay, groups))
    return times


def geometry_key(groups: AxisGroups) -> tuple:
    """What a step reads of a rank order: the groups' geometries, not the order's name."""
    return (groups.tp, groups.cp, groups.ep, groups.etp, groups.tp_ep, groups.dp_cp, groups.edp, groups.pp)
