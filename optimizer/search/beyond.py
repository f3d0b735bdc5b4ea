"""Layouts beyond the default space's bounds (``space.Reach.ALL``): which of them to bound.

Micro-batches above ``MAX_MICRO_BATCH`` add as many blocks as the default space has on
batch-rich jobs (DeepSeek-V3 on 2,048 GPUs: 10,088 next to 10,538), each with its own per-layer
bound terms to compute. A block's memory floor (``estimate.memory_floor_bytes``: the average
stage's weights, gradients, optimizer state and one micro-batch of stored activations) does not
fall as the micro-batch grows, so a block whose sibling with the largest micro-batch inside the
bounds (same sizes, sequence parallelism, ZeRO stages and recompute modes) fits in no variant
fits in none either: it is no plan and is not bounded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optimizer.search.bounds import SpaceBounds
from optimizer.search.space import MAX_MICRO_BATCH, LayoutBlock


def _sizes(block: LayoutBlock) -> tuple:
    lay = block.base
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.sequence_parallel)


def beyond_micro_batch(block: LayoutBlock) -> bool:
    """A block of micro-batches beyond ``MAX_MICRO_BATCH`` (none that the request named)."""
    return block.beyond and block.base.micro_batch_size > MAX_MICRO_BATCH


def may_fit(bounds: SpaceBounds, outer: Sequence[LayoutBlock], usable_bytes: float) -> list[LayoutBlock]:
    """The blocks of ``outer`` (micro-batches beyond the bound) whose sibling in ``bounds`` (the
    block of the same sizes with the largest micro-batch there) fits in some variant, or that
    have no sibling there."""
    n = bounds.n_variants
    fits = (bounds.memory_floor <= usable_bytes).reshape(-1, n).any(axis=1)
    sibling: dict[tuple, tuple[int, bool]] = {}  # sizes -> (largest micro-batch, does it fit)
    for i, block in enumerate(bounds.blocks):
        key, mbs = _sizes(block), block.base.micro_batch_size
        if key not in sibling or mbs > sibling[key][0]:
            sibling[key] = (mbs, bool(fits[i]))
        elif mbs == sibling[key][0]:
            sibling[key] = (mbs, sibling[key][1] or bool(fits[i]))
    return [b for b in outer if sibling.get(_sizes(b), (0, True))[1]]


def concat(a: SpaceBounds, b: SpaceBounds) -> SpaceBounds:
    """The bounds of ``a``'s blocks then ``b``'s (same variants), as one ``SpaceBounds``."""
    assert a.n_variants == b.n_variants
    return SpaceBounds(
        [*a.blocks, *b.blocks],
        a.n_variants,
        tuple(np.concatenate([x, y]) for x, y in zip(a.terms, b.terms, strict=True)),  # type: ignore[arg-type]
        np.concatenate([a.pp, b.pp]),
        np.concatenate([a.m, b.m]),
        np.concatenate([a.first, b.first]),
        np.concatenate([a.has_deeper, b.has_deeper]),
        np.concatenate([a.deeper, b.deeper]),
        np.concatenate([a.memory_floor, b.memory_floor]),
    )
