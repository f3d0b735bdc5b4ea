"""The search's steps that hold no state: ranking keys, the final top-k, the space's bounds and
the queueing of micro-batch groups beyond the default bound, and memory screening helpers."""

from __future__ import annotations

import heapq

from optimizer.cost import Estimate, best_estimate
from optimizer.cost.rules import ResolvedLayout
from optimizer.search.beyond import BeyondGroup, beyond_groups, beyond_micro_batch, may_fit
from optimizer.search.bounds import SpaceBounds, space_bounds
from optimizer.search.floors import step_floor_exceeds
from optimizer.search.ranking import BestTimes, pick, simplest
from optimizer.search.screen import Screen, Unfit, screen_memory
from optimizer.search.space import LayoutBlock, recompute_choices, zero_choices
from optimizer.search.splits import POOL_MARGIN_S, layout_key
from optimizer.specs import JobSpec, SearchSpec
from optimizer.units import GIB

POOL_EXTRA = 8
"""Candidates kept beyond top_k for the CP-SAT stage."""


def rank_key(est: Estimate) -> tuple:
    lay = est.layout
    inter_node = sum(1 for t in est.placement.values() if t not in ("nvlink", "none"))
    return (
        round(est.step_time_s, 9),
        round(est.peak_memory_bytes / GIB, 3),
        inter_node,
        (lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, lay.micro_batch_size, lay.zero_stage, lay.recompute, lay.etp),
        lay.stage_layers,
    )


def solver_status(proved_optimal: bool, found: bool) -> str:
    """OPTIMAL only with a proof; FEASIBLE with plans but no proof (whatever CP-SAT said of a
    split model it stopped); UNKNOWN with neither (the infeasible answer overrides it)."""
    if proved_optimal:
        return "OPTIMAL"
    return "FEASIBLE" if found else "UNKNOWN"


def final_top_k(ctx, job: JobSpec, spec: SearchSpec, ranked: list[Estimate], headroom: float | None) -> list[Estimate]:
    """The top-k of ``ranked`` in their simplest form (``ranking.simplest``), each layout once,
    one per family when ``search.diverse``."""
    zeros, rcs = zero_choices(spec), recompute_choices(job, spec)
    chosen = [simplest(ctx, job, e, zeros, rcs, headroom) for e in pick(ranked, spec.top_k + POOL_EXTRA, spec.diverse)]
    unique: dict[tuple, Estimate] = {}
    for est in chosen:
        unique.setdefault(layout_key(est.layout), est)
    return pick(sorted(unique.values(), key=rank_key), spec.top_k, spec.diverse)


def bound_space(
    ctx, blocks: list[LayoutBlock], usable_bytes: float, deadline: float
) -> tuple[SpaceBounds | None, list[BeyondGroup]]:
    """``space_bounds`` of ``blocks`` but those of micro-batches beyond the default bound, which
    are left out when they provably fit in memory under no variant (``beyond.may_fit``) and
    otherwise grouped (``beyond.beyond_groups``) to be bounded when the costing reaches them."""
    inner = [b for b in blocks if not beyond_micro_batch(b)]
    outer = [b for b in blocks if beyond_micro_batch(b)]
    if not inner or not outer:
        return space_bounds(ctx, blocks, deadline), []
    bounds = space_bounds(ctx, inner, deadline)
    if bounds is None:
        return None, []
    return bounds, beyond_groups(ctx, may_fit(bounds, outer, usable_bytes))


def expand_group(
    ctx, job: JobSpec, group: BeyondGroup, usable_bytes: float, kth: float, queue: list, seq: int, deadline: float
) -> int:
    """Bound ``group``'s blocks and queue their layouts (every depth) whose bound is at most
    ``kth`` and whose memory floor fits; returns the next sequence number. When ``deadline``
    passes while bounding, the group goes back to the queue at its bound, unexpanded (the search
    stops there, its bound the best remaining one)."""
    sb = space_bounds(ctx, group.blocks, deadline)
    if sb is None:
        heapq.heappush(queue, (group.bound, seq, group))
        return seq + 1
    for f in range(sb.num_families):
        if sb.memory_floor[f] > usable_bytes:
            continue
        fam = sb.family(f)
        if sb.first[f] <= kth:
            heapq.heappush(queue, (float(sb.first[f]), seq, fam.first))
            seq += 1
        fam = fam._replace(more_vpps=tuple(v for v in fam.more_vpps if sb.depth_bound(ctx, f, v) <= kth))
        for member in fam.expand(job):
            heapq.heappush(queue, (sb.member_bound(ctx, f, member), seq, member))
            seq += 1
    return seq


def least_memory(smallest: Unfit | None, unfit: Unfit) -> Unfit:
    """The one of the two needing less memory (the earlier, ``smallest``, on a tie)."""
    return unfit if smallest is None or unfit.peak_memory_bytes < smallest.peak_memory_bytes else smallest


def unfit_of(ctx, lay: ResolvedLayout, headroom_bytes: float | None) -> Unfit:
    """The peak memory of a layout known not to fit (``screen_memory``, or the full estimate)."""
    screen = screen_memory(ctx, lay, headroom_bytes)
    if screen is not None:
        return Unfit(lay, screen.peak_memory_bytes)
    est = best_estimate(ctx, lay, headroom_bytes=headroom_bytes)
    return Unfit(lay, est.peak_memory_bytes, est)


def outside_pool(ctx, lay: ResolvedLayout, screen: Screen, pool_best: BestTimes) -> bool:
    """True when a fitting layout provably ranks after ``pool_size`` layouts already costed.

    The pool's worst time only decreases as layouts are costed, so such a layout is outside the
    final pool (and the top-k) too; its full estimate cannot change the answer.
    """
    if not pool_best.full:
        return False
    return step_floor_exceeds(ctx, lay, screen.groups, pool_best.value + POOL_MARGIN_S)
