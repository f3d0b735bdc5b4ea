"""The cost model: one pure function family that every entry point calls.

- ``context.build_context(job)``: per-job facts (model FLOPs, layer kinds, hardware, tiers).
- ``rules.ResolvedLayout.from_spec(layout, job)`` (``rules.resolve`` on plain numbers): the layout
  value, built only by the validity rules, with its derived numbers and views.
- ``estimate.estimate(ctx, layout, order)``: step time, memory, MFU for one rank order.
- ``best_estimate(ctx, layout, placement)``: the best rank order (or the one matching a placement).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext, build_context
from optimizer.cost.estimate import Estimate, estimate, steady_state_s, step_time_s
from optimizer.cost.memory import memory_signature
from optimizer.cost.rules import ResolvedLayout, resolve_layout
from optimizer.cost.topology import AxisGroups, axis_groups
from optimizer.errors import InvalidLayout


def best_estimate(
    ctx: JobContext,
    lay: ResolvedLayout,
    placement: dict[str, str] | None = None,
    headroom_bytes: float | None = None,
) -> Estimate:
    """Estimate under the fastest rank order that fits in memory (the first order's when none
    does); with ``placement``, only orders that realise it.

    Ties keep the canonical order ``tp, cp, dp, pp`` (innermost first).
    """
    distinct = [(steady_state_s(ctx, lay, groups), order, groups) for order, groups in distinct_orders(ctx, lay)]
    # Most promising orders first (stable: ties keep the canonical order first), so the bound
    # below prunes as many full estimates as possible.
    distinct.sort(key=lambda item: item[0])
    if placement:
        _check_tier_names(ctx, placement)
        best = _best_matching(ctx, lay, distinct, placement, headroom_bytes)
    else:
        best = _fastest(ctx, lay, distinct, headroom_bytes)
    if best is None:
        tiers = [t.name for t in ctx.topology.tiers]
        raise InvalidLayout(
            "config.placement",
            f"no rank order of this layout that the frameworks run puts the axes on the tiers {placement} "
            f"(tensor, context, data, pipeline from the innermost; Megatron can also put pipeline stages inside "
            f"data parallelism: docs/frameworks.md); tiers are {tiers} (axes of size 1 are 'none')",
        )
    return best


def _check_tier_names(ctx: JobContext, placement: dict[str, str]) -> None:
    """Raise ``InvalidLayout`` at ``config.placement.<axis>`` for a tier name no tier of any
    cluster or of the job's topology has (a known tier this job's GPUs do not span is left to the
    rank-order check, which lists the job's tiers)."""
    names = [t.name for t in ctx.topology.tiers]
    topology = ctx.job.cluster.topology
    known = {*names, *KNOWN_TIERS, *(topology.levels if topology is not None else ())}
    for axis, tier in placement.items():
        if tier not in known:
            raise InvalidLayout(
                f"config.placement.{axis}",
                f"unknown tier {tier!r}: this job's tiers are {names}, or 'none' (size 1) and 'cluster'",
            )


KNOWN_TIERS = ("nvlink", "leaf", "spine", "none", "cluster")
"""Tier names of the catalog's clusters, and the two every placement may name."""


class SizesKey(NamedTuple):
    """A layout's parallel sizes: all its rank orders and their groups depend on (with the job's
    topology)."""

    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    etp: int

    def sizes(self) -> dict[str, int]:
        """``ResolvedLayout.sizes`` of the layouts of this key."""
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp, "ep": self.ep, "etp": self.etp}


def sizes_key(lay: ResolvedLayout) -> SizesKey:
    return tuple.__new__(SizesKey, (lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp))


DISTINCT_ORDERS = Memo[SizesKey, list[tuple[tuple[str, ...], AxisGroups]]]("distinct_orders")


def distinct_orders(ctx: JobContext, lay: ResolvedLayout) -> list[tuple[tuple[str, ...], AxisGroups]]:
    """The rank orders that give the axes distinct groups, with those groups, canonical order
    first (memoised per ``SizesKey``: the orders and groups depend on nothing else)."""
    key = sizes_key(lay)
    table = ctx.caches[DISTINCT_ORDERS]
    cached = table.get(key)
    if cached is None:
        cached = []
        seen: set[tuple] = set()
        sizes = key.sizes()
        for order in ctx.rank_orders(sizes):
            groups = axis_groups(ctx.topology, order, sizes)
            signature = (groups.tp, groups.cp, groups.dp, groups.pp, groups.ep, groups.dp_cp, groups.edp, groups.etp,
                         groups.tp_ep)  # fmt: skip
            if signature in seen:  # another order already gave every axis the same groups
                continue
            seen.add(signature)
            cached.append((order, groups))
        table[key] = cached
    return cached


def _fastest(
    ctx: JobContext,
    lay: ResolvedLayout,
    distinct: list[tuple[float, tuple[str, ...], AxisGroups]],
    headroom_bytes: float | None,
) -> Estimate:
    """The fastest order that fits in memory (the earliest of orders within 1e-12 s of each
    other), or, when no order fits, the first order's estimate.

    Memory depends on the rank order only through ``memory_signature`` (which differs between
    orders only when ``dp = 1 < cp``), so one full estimate per signature says whether every order
    of that signature fits; the others are compared by ``step_time_s`` (the float ``estimate``
    computes), and only the winner is estimated in full.
    """
    fits: dict[tuple[bool, ...], bool] = {}
    first: Estimate | None = None
    best: Estimate | tuple[float, tuple[str, ...], AxisGroups] | None = None
    best_step = math.inf
    for steady, order, groups in distinct:
        if steady >= best_step:
            break  # this order's (and every later order's) pipeline alone is already slower
        signature = memory_signature(groups)
        est: Estimate | None = None
        if signature not in fits:  # the first order of its signature: estimate in full
            est = estimate(ctx, lay, order, headroom_bytes, groups)
            fits[signature] = est.fits_memory
            if first is None:
                first = est
        if not fits[signature]:
            continue
        step = est.step_time_s if est is not None else step_time_s(ctx, lay, groups)
        if best is None or step < best_step - 1e-12:
            best, best_step = (est if est is not None else (step, order, groups)), step
    if best is None:
        assert first is not None  # the first order is always estimated
        return first
    if isinstance(best, Estimate):
        return best
    _, order, groups = best
    return estimate(ctx, lay, order, headroom_bytes, groups)


def _best_matching(
    ctx: JobContext,
    lay: ResolvedLayout,
    distinct: list[tuple[float, tuple[str, ...], AxisGroups]],
    placement: dict[str, str],
    headroom_bytes: float | None,
) -> Estimate | None:
    """The fastest order whose placement matches ``placement`` (None if none does)."""
    best: Estimate | None = None
    for steady, order, groups in distinct:
        if best is not None and steady >= best.step_time_s:
            break  # this order's (and every later order's) pipeline alone is already slower
        if any(groups.placement().get(a) != t for a, t in placement.items() if t is not None):
            continue
        est = estimate(ctx, lay, order, headroom_bytes, groups)
        if best is None or est.step_time_s < best.step_time_s - 1e-12:
            best = est
    return best


__all__ = ["Estimate", "JobContext", "ResolvedLayout", "best_estimate", "build_context", "estimate", "resolve_layout"]
