"""Layouts beyond the default space's bounds (``space.Reach.ALL``): which of them to bound, and when.

Micro-batches above ``MAX_MICRO_BATCH`` add as many blocks as the default space has on
batch-rich jobs (DeepSeek-V3 on 2,048 GPUs: 10,088 next to 10,538), each with its own per-layer
bound terms to compute. Two things keep that cheap:

- A block's memory floor (``estimate.memory_floor_bytes``: the average stage's weights,
  gradients, optimizer state and one micro-batch of stored activations) does not fall as the
  micro-batch grows, so a block whose sibling with the largest micro-batch inside the bounds
  (same sizes, sequence parallelism, ZeRO stages and recompute modes) fits in no variant fits
  in none either: it is no plan and is not bounded (``may_fit``).
- The blocks that differ only in micro-batch form a group with one lower bound from one lookup
  (``group_bound``); the search bounds the group's blocks only when its queue reaches that bound
  (DeepSeek-V3 on 2,048 H800: 60 of 623 groups). The group bound rests on two properties of
  the per-layer bound totals (``estimate.lower_bound_layer_totals``), which
  ``tests/search/test_search_bounds_beyond.py`` checks: a layer's time per sequence does not grow with
  the micro-batch (GEMMs reach a larger share of peak, latencies and host work are shared by
  more tokens), and no recompute mode is faster than none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from optimizer.cost.context import JobContext
from optimizer.modes import RecomputeMode
from optimizer.search.bounds import SpaceBounds, space_bounds
from optimizer.search.lower_bounds import lower_bound_layer_totals
from optimizer.search.space import MAX_MICRO_BATCH, LayoutBlock


def _sizes(block: LayoutBlock) -> tuple:
    lay = block.base
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.sequence_parallel, lay.etp)


def beyond_micro_batch(block: LayoutBlock) -> bool:
    """A block of micro-batches beyond ``MAX_MICRO_BATCH`` (none that the request named)."""
    return block.beyond and block.base.micro_batch_size > MAX_MICRO_BATCH


def may_fit(bounds: SpaceBounds, outer: Sequence[LayoutBlock], usable_bytes: float) -> list[LayoutBlock]:
    """The blocks of ``outer`` (micro-batches beyond the bound) whose sibling in ``bounds`` (the
    block of the same sizes with the largest micro-batch there) fits in some variant, or that
    have no sibling there."""
    fits = np.logical_or.reduceat(bounds.memory_floor <= usable_bytes, bounds.offsets)
    sibling: dict[tuple, tuple[int, bool]] = {}  # sizes, variants -> (largest micro-batch, does it fit)
    for i, block in enumerate(bounds.blocks):
        key, mbs = (_sizes(block), _fit_variants(block.variants)), block.base.micro_batch_size
        if key not in sibling or mbs > sibling[key][0]:
            sibling[key] = (mbs, bool(fits[i]))
        elif mbs == sibling[key][0]:
            sibling[key] = (mbs, sibling[key][1] or bool(fits[i]))
    return [b for b in outer if sibling.get((_sizes(b), _fit_variants(b.variants)), (0, True))[1]]


def _fit_variants(variants: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
    """``variants`` without the ZeRO-1 ones whose ZeRO-2 twin is in, the key a block and its
    sibling with fewer micro-batches are matched on: ``framework_space.block_variants`` drops
    ZeRO-1 beside ZeRO-2 only with one micro-batch and FSDP2's / DeepSpeed's buffers, where it
    never needs less memory, so the sibling's variants hold every one of the block's or one that
    needs no more memory."""
    return tuple(v for v in variants if not (v[0] == 1 and (2, v[1]) in variants))


class BeyondGroup(NamedTuple):
    """Blocks of micro-batches beyond the bound that differ only in micro-batch, and a lower bound
    on the step time of every layout they hold (``group_bound``)."""

    bound: float
    blocks: tuple[LayoutBlock, ...]


def group_bound(ctx: JobContext, blocks: Sequence[LayoutBlock]) -> float:
    """A lower bound on ``bound_at_vpp`` of every layout of ``blocks`` (same tp, pp, cp, ep,
    sequence parallelism; micro-batches ``b`` from ``lo`` to ``hi``; any ZeRO stage, recompute and
    depth up to ``v``): with ``a`` the per-sequence layer time at ``hi`` without recompute over
    ``pp``, the steady term ``m * avg`` is at least ``R * a`` (``R`` sequences a replica), the
    bubble term at least ``(pp - 1) / v * lo * a``, and the optimizer, data-parallel and pipeline
    send terms at least 0."""
    lay = blocks[0].base
    hi = max(b.base.micro_batch_size for b in blocks)
    lo = min(b.base.micro_batch_size for b in blocks)
    deepest = max(max((b.base.vpp, *b.more_vpps)) for b in blocks)
    time_s = lower_bound_layer_totals(
        ctx, lay.tp, lay.cp, lay.ep, hi, lay.sequence_parallel, RecomputeMode.NONE, lay.etp
    )[0]
    a = time_s / (hi * lay.pp)
    per_replica = lay.num_micro_batches * lay.micro_batch_size
    return per_replica * a + (lay.pp - 1) / deepest * lo * a


def beyond_groups(ctx: JobContext, outer: Sequence[LayoutBlock]) -> list[BeyondGroup]:
    """``outer``'s blocks grouped by everything but the micro-batch, each with its ``group_bound``."""
    by_sizes: dict[tuple, list[LayoutBlock]] = defaultdict(list)
    for block in outer:
        by_sizes[_sizes(block)].append(block)
    return [BeyondGroup(group_bound(ctx, blocks), tuple(blocks)) for blocks in by_sizes.values()]


def smallest_bound(
    ctx: JobContext, groups: Sequence[BeyondGroup], usable_bytes: float, above: float, deadline: float | None = None
) -> float:
    """The smallest bound of the layouts of ``groups`` that may fit in memory, or some value at
    least ``above`` when none is below it: groups whose bound reaches ``above`` are not bounded
    block by block, nor is any once ``time.perf_counter()`` passes ``deadline`` (their group
    bound, a lower one, stands in)."""
    best = float("inf")
    for group in groups:
        if group.bound >= min(above, best):
            best = min(best, group.bound)
            continue
        bounds = space_bounds(ctx, group.blocks, deadline)
        best = min(best, group.bound if bounds is None else bounds.beyond_bound(usable_bytes, every=True))
    return best
