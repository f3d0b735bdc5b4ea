"""The geometries a group of a given size can have, and a layer's tensor-, context- and
expert-parallel communication floors over them (the search's lower bounds)."""

from __future__ import annotations

from typing import NamedTuple

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.layer import Dims, LayerCompute, cp_comm_s, ep_comm_s, tp_comm_s
from optimizer.cost.layer_base import ATTENTION_CORE_RECOMPUTED
from optimizer.cost.layer_comm import DISPATCH_REPLAYED, rank_tokens
from optimizer.cost.rules import divisors
from optimizer.cost.topology import GroupGeometry, group_geometry
from optimizer.modes import RecomputeMode

AXIS_GEOMETRIES = Memo[int, tuple[GroupGeometry, ...]]("axis_geometries")
"""Keyed by the group's size: all ``group_geometries`` reads (with the job's topology)."""


def group_geometries(ctx: JobContext, size: int) -> tuple[GroupGeometry, ...]:
    """Every distinct geometry a ``size``-rank group can have: one per stride dividing
    ``num_gpus / size`` (a superset of what the rank orders give).

    Locality is not always cheaper under the cost model: a flat NVLink ring pays ``2(N-1)``
    latency steps where a group split over two tiers pays fewer, a partial scale-up mesh gets a
    fraction of the bandwidth, and a job spread over NVLink domains of 37 GPUs puts a 2-rank group
    at stride 1 across two domains but at stride 2 inside one. Memoised per ``size``."""
    table = ctx.caches[AXIS_GEOMETRIES]
    cached = table.get(size)
    if cached is None:
        topo = ctx.topology
        rest = topo.num_gpus // size
        seen: dict[tuple, GroupGeometry] = {}
        for stride in divisors(rest):
            geo = group_geometry(topo, stride, size)
            seen.setdefault(geo.levels, geo)
        cached = table[size] = tuple(seen.values())
    return cached


class EpFloorKey(NamedTuple):
    """All ``_ep_comm_floor_s`` reads of an MoE layer's ``Dims``: its tokens per GPU
    (``layer_comm.rank_tokens``, as ``ep_comm_s`` reads them), the expert groups (``ep``,
    ``etp``) and whether the forward dispatch is replayed (``DISPATCH_REPLAYED``). Not the layer kind:
    every MoE kind routes the same tokens the same way (``ep_comm_s`` reads only ``kind.is_moe``)."""

    tokens: float
    ep: int
    etp: int
    replayed: bool


def ep_floor_key(ctx: JobContext, dims: Dims) -> EpFloorKey:
    replayed = dims.recompute in DISPATCH_REPLAYED
    return tuple.__new__(EpFloorKey, (rank_tokens(ctx, dims), dims.ep, dims.etp, replayed))


EP_FLOOR = Memo[EpFloorKey, float]("ep_comm_floor_s")


def ep_comm_floor_s(
    ctx: JobContext,
    kind: LayerKind,
    dims: Dims,
    one: GroupGeometry,
) -> float:
    """``_ep_comm_floor_s`` of an MoE layer, memoised per ``EpFloorKey``."""
    key = ep_floor_key(ctx, dims)
    table = ctx.caches[EP_FLOOR]
    floor = table.get(key)
    if floor is None:
        floor = table[key] = _ep_comm_floor_s(ctx, kind, dims, one)
    return floor


def _ep_comm_floor_s(
    ctx: JobContext,
    kind: LayerKind,
    dims: Dims,
    one: GroupGeometry,
) -> float:
    """The smallest ``ep_comm_s`` of an MoE layer over every geometry its groups can have
    (``group_geometries``; ``one``: the one-rank group).

    With expert tensor parallelism the ``alltoall`` dispatcher's EP all-to-all and expert-TP
    collectives each at their cheapest geometry (they add up); the other dispatchers' one transfer
    over the ``etp x ep`` block at that block's cheapest geometry."""
    if dims.etp == 1:
        return min(ep_comm_s(ctx, kind, dims, g) for g in group_geometries(ctx, dims.ep))
    if ctx.job.training.moe_dispatcher == "alltoall":
        # the EP all-to-all and the expert-TP collectives each at their cheapest (the two add up)
        geos = group_geometries(ctx, dims.ep) if dims.ep > 1 else (one,)
        a2a = min(ep_comm_s(ctx, kind, dims, g, one, one) for g in geos)
        return a2a + min(ep_comm_s(ctx, kind, dims, one, e, one) for e in group_geometries(ctx, dims.etp))
    return min(ep_comm_s(ctx, kind, dims, one, one, b) for b in group_geometries(ctx, dims.ep * dims.etp))


class TpCpFloorKey(NamedTuple):
    """All ``_tp_cp_floor_s`` reads of a layer: its kind (index in ``ctx.kinds``), the ``Dims``
    fields the TP and CP terms read but the recompute mode, and of that mode only what they
    read: whether it replays the forward collectives (``full``), keeps the forward all-gathers
    (``op``) and re-runs the attention core (``ATTENTION_CORE_RECOMPUTED``). The TP windows and
    the attention core's times come from the layer's compute and depend on none of the modes
    (nor on ep or etp)."""

    kind: int
    tp: int
    cp: int
    micro_batch_size: int
    sequence_parallel: bool
    replays: tuple[bool, bool, bool]


def tp_cp_floor_key(kind: int, dims: Dims) -> TpCpFloorKey:
    rc = dims.recompute
    replays = (rc == RecomputeMode.FULL, rc == RecomputeMode.OP, rc in ATTENTION_CORE_RECOMPUTED)
    return tuple.__new__(TpCpFloorKey, (kind, dims.tp, dims.cp, dims.micro_batch_size, dims.sequence_parallel, replays))


TP_CP_FLOOR = Memo[TpCpFloorKey, float]("lower_bound_tp_cp_floor")


def tp_cp_floor_s(ctx: JobContext, k: int, dims: Dims, compute: LayerCompute) -> float:
    """A layer's TP and CP communication (``layer.tp_comm_s``, ``layer.cp_comm_s``) of layer kind
    ``k`` under ``dims`` (without expert parallelism), each at its smallest over the geometries
    its group can have; ``compute``: the layer's ``layer_compute`` (its TP windows and attention
    core times). Memoised per ``TpCpFloorKey``."""
    key = tp_cp_floor_key(k, dims)
    table = ctx.caches[TP_CP_FLOOR]
    floor = table.get(key)
    if floor is None:
        kind = ctx.kinds[k]
        floor = 0.0
        if dims.tp > 1:
            windows = compute.tp_wgrad_windows_s
            floor += min(tp_comm_s(ctx, kind, dims, g, windows) for g in group_geometries(ctx, dims.tp))
        if dims.cp > 1:
            t_core, t_core_bwd = compute.t_core_s, compute.t_core_bwd_s
            floor += min(cp_comm_s(ctx, dims, g, t_core, t_core_bwd) for g in group_geometries(ctx, dims.cp))
        table[key] = floor
    return floor
