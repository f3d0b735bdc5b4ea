"""Exact per-stage cost tables for the CP-SAT layer-split model (``SplitTables``), built from the
cost model's own ``stage_terms``, and the range of layer counts a split under a step-time
threshold keeps (``certified_split_range``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from optimizer.cost.context import JobContext
from optimizer.cost.estimate import Estimate, pp_comm_s
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import StageTerms, stage_terms
from optimizer.cost.topology import AxisGroups, axis_groups
from optimizer.search.orders import kind_times
from optimizer.search.split_mixes import (
    chunk_sum_mixes,
    counts_at,
    mix_vectors,
    per_stage_layers,
    several_kinds_one_chunk,
    stage_starts,
)

SPLIT_RADIUS_MIN = 4
SPLIT_FULL_TABLE_MAX = 128
"""Layer-split tables cover every possible layer count of every stage when that is at most this
many entries (small jobs, where a huge LM head or a tight memory limit may want a split such as
[L-1, 1]); otherwise each stage's even share +- max(4, share/2) layers."""


@dataclass(frozen=True)
class SplitTables:
    """Exact per-stage cost tables of one layout and rank order, indexed by the stage's layer count.

    ``time_s[s][i]``, ``dp_s[s][i]``, ``optimizer_s[s][i]`` and ``memory_bytes[s][i]`` are the
    cost model's ``stage_terms`` for stage ``s`` holding ``lo + i`` layers. The step time of a
    split is ``steady_coefficient * max time + max dp + max optimizer + pp_comm_s``: the same
    composition as ``estimate``. Exact for models with one layer kind. With several kinds a
    stage's mix depends on which layers it holds: ``by_start`` then lists, per stage, every
    (first layer, layers, time, dp, optimizer, memory) a one-chunk-per-stage split can give it,
    and ``by_mix`` (interleaved stages) every mix its chunks can add up to. When neither is built
    (a per-mix table too large) the mix is taken from where the even split puts it and ``exact``
    is False.
    """

    lo: int
    hi: int
    time_s: tuple[tuple[float, ...], ...]
    dp_s: tuple[tuple[float, ...], ...]
    optimizer_s: tuple[tuple[float, ...], ...]
    memory_bytes: tuple[tuple[float, ...], ...]
    steady_coefficient: float
    pp_comm_s: float
    by_start: tuple[tuple[tuple[int, int, float, float, float, float], ...], ...] | None = None
    by_mix: tuple[tuple[tuple[int, tuple[int, ...], float, float, float, float], ...], ...] | None = None
    """Interleaved stages of a model with several layer kinds: per stage, (layers, layers of each
    kind, time, dp, optimizer, memory) for every kind mix the stage's chunks can add up to; the
    model then follows each chunk's first layer and count through ``kind_prefix``."""
    kind_prefix: tuple[tuple[int, ...], ...] = ()
    exact: bool = True


SPLIT_CERTIFIED_TABLE_MAX = 4096
"""Largest certified table (entries over all stages) ``certified_split_range`` hands out."""


def _table_stage_terms(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, stage: int, n: int, offsets: list[int]
) -> StageTerms:
    """``stage_terms`` of stage ``stage`` holding ``n`` layers, its kind mix taken from where the
    even split (``offsets``: first layer of each stage) puts it."""
    start = 0 if stage == 0 else min(offsets[stage], len(ctx.layer_kind) - n)
    return stage_terms(ctx, lay, groups, stage, counts_at(ctx, start, n))


SPLIT_MIX_TABLE_MAX = 20_000
"""Largest per-mix table (entries over all stages) ``split_tables`` builds for interleaved stages
of a model with several layer kinds; beyond it the tables fall back to the even split's mixes."""


def certified_split_range(
    ctx: JobContext, est: Estimate, threshold_s: float, most_fitting: int
) -> tuple[int, int] | None:
    """Layer counts per stage that every split of ``est``'s layout in ``est``'s rank order that
    fits in memory (no stage above ``most_fitting`` layers) and has a step time at most
    ``threshold_s`` keeps, or None when that range is too wide to tabulate.

    A stage holding ``n`` layers takes at least ``n`` times the cheapest layer of this order, and
    the step at least ``(m + (pp-1)/vpp)`` times its slowest stage, which bounds ``n`` from above
    (``hi``); the other ``pp - 1`` stages hold at most ``hi`` each, which bounds it from below.
    An empty range (``lo > hi``) means no such split in this order.
    """
    lay = est.layout
    layers = len(ctx.layer_kind)
    hi = min(layers - (lay.pp - 1) * lay.vpp, most_fitting)
    if math.isfinite(threshold_s):
        groups = axis_groups(ctx.topology, est.order, lay.sizes())
        per_layer = min(kind_times(ctx, lay, groups)) * (lay.num_micro_batches + (lay.pp - 1) / lay.vpp)
        if per_layer > 0:
            hi = min(hi, int(threshold_s * (1 + 1e-9) / per_layer))
    lo = max(lay.vpp, layers - (lay.pp - 1) * hi)
    if (hi - lo + 1) * lay.pp > SPLIT_CERTIFIED_TABLE_MAX:
        return None
    return lo, hi


def _numbers(t: StageTerms) -> tuple[float, float, float, float]:
    """(time, exposed data-parallel time, optimizer step, memory) of one layout's stage: numbers
    here (``StageTerms`` holds numpy arrays on ``cost.columns``'s path)."""
    return cast("tuple[float, float, float, float]", (t.time_s, t.dp_exposed_s, t.optimizer_s, t.memory.total_bytes))


def split_tables(ctx: JobContext, est: Estimate, layer_range: tuple[int, int] | None = None) -> SplitTables:
    """``SplitTables`` of ``est``'s layout in ``est``'s rank order, over ``layer_range`` (from
    ``certified_split_range``) or, without one, over every layer count when that is at most
    ``SPLIT_FULL_TABLE_MAX`` entries and each stage's even share +- max(4, share/2) otherwise. The
    uniform split's counts are always included."""
    lay = est.layout
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    layers = len(ctx.layer_kind)
    per_stage = per_stage_layers(lay)
    share = layers / lay.pp
    most = layers - (lay.pp - 1) * lay.vpp  # every other stage keeps one layer per chunk
    if (most - lay.vpp + 1) * lay.pp <= SPLIT_FULL_TABLE_MAX:
        radius = layers  # every split (a huge LM head or a tight memory limit may want [L-1, 1])
    else:
        radius = max(SPLIT_RADIUS_MIN, int(share // 2))
    lo = max(lay.vpp, int(share) - radius) if lay.pp > 1 else layers
    hi = min(most, int(share) + 1 + radius) if lay.pp > 1 else layers
    if layer_range is not None:
        lo, hi = layer_range
    lo = min(lo, *per_stage)
    hi = max(hi, *per_stage)
    offsets = [sum(per_stage[:s]) for s in range(lay.pp)]
    time_t, dp_t, opt_t, mem_t = [], [], [], []
    for s in range(lay.pp):
        row_t, row_d, row_o, row_m = [], [], [], []
        for n in range(lo, hi + 1):
            time_s, dp_s, optimizer_s, memory_bytes = _numbers(_table_stage_terms(ctx, lay, groups, s, n, offsets))
            row_t.append(time_s)
            row_d.append(dp_s)
            row_o.append(optimizer_s)
            row_m.append(memory_bytes)
        time_t.append(tuple(row_t))
        dp_t.append(tuple(row_d))
        opt_t.append(tuple(row_o))
        mem_t.append(tuple(row_m))
    by_start = None
    if several_kinds_one_chunk(ctx, lay):
        rows: list[tuple[tuple[int, int, float, float, float, float], ...]] = []
        for s in range(lay.pp):
            row: list[tuple[int, int, float, float, float, float]] = []
            terms: dict[tuple[int, ...], tuple[float, float, float, float]] = {}
            for n in range(lo, hi + 1):
                for start in stage_starts(lay, layers, s, n, lo, hi):
                    mix = counts_at(ctx, start, n)
                    if mix not in terms:
                        terms[mix] = _numbers(stage_terms(ctx, lay, groups, s, mix))
                    row.append((start, n, *terms[mix]))
            rows.append(tuple(row))
        by_start = tuple(rows)
    by_mix = None
    if len(ctx.kinds) > 1 and lay.vpp > 1 and lay.pp > 1:
        totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
        reachable = chunk_sum_mixes(ctx, lay.vpp, hi)
        mixes = {n: [v for v in mix_vectors(n, totals) if v in reachable] for n in range(lo, hi + 1)}
        if sum(len(v) for v in mixes.values()) * lay.pp <= SPLIT_MIX_TABLE_MAX:
            mix_rows = []
            for s in range(lay.pp):
                mix_row: list[tuple[int, tuple[int, ...], float, float, float, float]] = []
                for n, vectors in mixes.items():
                    for mix in vectors:
                        mix_row.append((n, mix, *_numbers(stage_terms(ctx, lay, groups, s, mix))))
                mix_rows.append(tuple(mix_row))
            by_mix = tuple(mix_rows)
    return SplitTables(
        lo,
        hi,
        tuple(time_t),
        tuple(dp_t),
        tuple(opt_t),
        tuple(mem_t),
        lay.num_micro_batches + (lay.pp - 1) / lay.vpp,
        pp_comm_s(ctx, lay, groups),
        by_start,
        by_mix,
        ctx.kind_prefix,
        exact=len(ctx.kinds) == 1 or by_start is not None or by_mix is not None,
    )
