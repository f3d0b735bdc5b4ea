"""Per-stage memory limits on the layers a stage can hold (``stage_fit_limits``), and whether
any layer split of a layout can fit at all (``some_split_may_fit``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.estimate import Estimate
from optimizer.cost.memory import memory_signature
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import stage_memory_bytes
from optimizer.cost.topology import AxisGroups, axis_groups
from optimizer.search.orders import order_geometries
from optimizer.search.split_mixes import (
    consecutive_mixes,
    counts_at,
    mix_vectors,
    per_stage_layers,
    several_kinds_one_chunk,
    stage_starts,
)


class FitKey(NamedTuple):
    """What ``signature_fit_limits`` reads: the whole layout, the memory signature of the rank
    order (memory takes nothing else from it, see ``memory_signature``: every order of a layout
    with that signature shares the limits) and the memory cap."""

    layout: ResolvedLayout
    signature: tuple[bool, ...]
    cap_bytes: float


def fit_key(lay: ResolvedLayout, groups: AxisGroups, cap_bytes: float) -> FitKey:
    return tuple.__new__(FitKey, (lay, memory_signature(groups), cap_bytes))


FIT_LIMITS = Memo[FitKey, tuple[int, ...]]("stage_fit_limits")
FIT_ADMITS = Memo[FitKey, bool]("some_split_may_fit")
"""Whether the limits of ``FIT_LIMITS`` (``some_split_may_fit`` stops early when they cannot) admit a split."""


def some_split_may_fit(ctx: JobContext, lay: ResolvedLayout, cap_bytes: float) -> bool:
    """False when no layer split of ``lay`` in any of its rank orders fits within ``cap_bytes``
    per GPU: for every memory signature of its orders, some stage cannot hold one layer per chunk
    or the stages' limits (``stage_fit_limits``, sharing its memo) add up to fewer layers than the
    model has. The split phase skips such layouts before computing their split floors."""
    total = len(ctx.layer_kind)
    seen = set()
    for g in order_geometries(ctx, lay)[2]:
        sig = memory_signature(g)
        if sig in seen:
            continue
        seen.add(sig)
        key = fit_key(lay, g, cap_bytes)
        admitted = ctx.caches[FIT_ADMITS]
        admits = admitted.get(key)
        if admits is None:
            limits = signature_fit_limits(ctx, lay, g, cap_bytes, needed=total)
            if limits is not None:  # computed in full: the per-pair test reads them
                ctx.caches[FIT_LIMITS][key] = tuple(limits)
            admits = admitted[key] = limits is not None and limits_admit_split(limits, lay.vpp, total)
        if admits:
            return True
    return False


def limits_admit_split(limits: Sequence[int], vpp: int, num_layers: int) -> bool:
    """Some layer split fits within per-stage ``limits``: every stage holds one layer per chunk
    and together they hold every layer."""
    return min(limits) >= vpp and sum(limits) >= num_layers


def cached_fit_limits(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, cap: float) -> tuple[int, ...]:
    key = fit_key(lay, groups, cap)
    table = ctx.caches[FIT_LIMITS]
    cached = table.get(key)
    if cached is None:
        limits = signature_fit_limits(ctx, lay, groups, cap)
        assert limits is not None
        cached = table[key] = tuple(limits)
    return cached


def stage_fit_limits(ctx: JobContext, est: Estimate) -> list[int]:
    """Per pipeline stage of ``est``'s layout in ``est``'s rank order, the most layers it can hold
    with its memory within capacity less headroom (``vpp - 1`` when not even one layer per chunk
    fits). A stage's memory grows with its layers, so a split fits only if every stage is within
    its limit; binary search over the same stage terms as ``split_tables`` (with several layer
    kinds and one chunk per stage: at some position the stage can start at; with several kinds
    and interleaved stages: with the kind mix of that many layers that needs the least memory,
    as the stage's chunks may add up to any mix)."""
    lay = est.layout
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    return list(cached_fit_limits(ctx, lay, groups, est.capacity_bytes - est.headroom_bytes))


def signature_fit_limits(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, cap: float, needed: int | None = None
) -> list[int] | None:
    """``stage_fit_limits`` of one memory signature. With ``needed`` (the model's layers): None as
    soon as stage 0 cannot hold one layer per chunk or the first, last and largest middle limits
    show that the stages cannot hold ``needed`` layers together."""
    per_stage = per_stage_layers(lay)
    offsets = [sum(per_stage[:s]) for s in range(lay.pp)]
    layers = len(ctx.layer_kind)
    most = layers - (lay.pp - 1) * lay.vpp
    by_start = several_kinds_one_chunk(ctx, lay)
    totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]

    def fits(s: int, n: int) -> bool:
        if len(ctx.kinds) == 1:
            start = 0 if s == 0 else min(offsets[s], layers - n)  # as _table_stage_terms places it
            return stage_memory_bytes(ctx, lay, groups, s, counts_at(ctx, start, n)) <= cap
        if by_start:  # n layers fit if they do at some position the stage can start at
            mixes: Iterable[tuple[int, ...]] = consecutive_mixes(ctx, stage_starts(lay, layers, s, n, lay.vpp, most), n)
        else:
            # interleaved stages: the chunks' cuts decide the stage's mix, so n layers fit if some
            # mix of n layers does (a stage's memory never shrinks when it gains a layer, so the
            # least over the mixes grows with n and the binary search below holds)
            mixes = mix_vectors(n, totals)
        return any(stage_memory_bytes(ctx, lay, groups, s, c) <= cap for c in mixes)

    def limit(s: int, lo: int, hi: int) -> int:
        """The most layers stage s fits, given that ``lo`` fits (or is vpp - 1) and ``hi + 1``
        does not: doubling strides up from ``lo``, then a bisection of the last stride."""
        step = 1
        while lo < hi:
            probe = min(hi, lo + step)
            if not fits(s, probe):
                hi = probe - 1
                break
            lo, step = probe, 2 * step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(s, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    pp, none_fit = lay.pp, lay.vpp - 1
    # Middle stages try the same mixes and differ only in their in-flight micro-batches, which
    # never grow with the stage index: what fits stage s - 1 fits stage s, so their limits rise
    # along the pipeline and the last middle stage's bounds them all.
    ordered_middle = not by_start and pp > 3
    first_fits = none_fit
    if needed is not None:
        # Two probes settle most layouts that no split fits: stage 0 must hold one layer per
        # chunk, and some stage must hold ceil(needed / pp) layers (pigeonhole), which, unless
        # stages start at different kind mixes, the largest-limit stages (the last middle one:
        # what fits stage s - 1 fits stage s, stage 0 included as it also holds the embedding;
        # and the last one) must then hold.
        if not fits(0, lay.vpp):
            return None
        first_fits = lay.vpp
        share = -(-needed // pp)
        if pp > 1 and not by_start and lay.vpp <= share <= most and not fits(pp - 2, share) and not fits(pp - 1, share):
            return None
    first = limit(0, first_fits, most)
    known = {0: first}
    if ordered_middle:
        known[pp - 1] = limit(pp - 1, none_fit, most)
        known[pp - 2] = limit(pp - 2, none_fit, most)
        if needed is not None and first + known[pp - 1] + (pp - 2) * known[pp - 2] < needed:
            return None
    limits: list[int] = []
    for s in range(pp):
        if s in known:
            limits.append(known[s])
        elif ordered_middle and s > 1:
            limits.append(limit(s, limits[-1], known[pp - 2]))
        else:
            limits.append(limit(s, none_fit, most))
    return limits
