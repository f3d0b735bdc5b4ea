"""Exhaustive vectorised costing of the regular layout space: the reference the planner is timed
against (``benchmarks/search_latency.py``).

Every layout of ``space.layout_blocks`` (what ``enumerate_layouts`` yields: every valid
combination of the knobs, uniform layer split) under every distinct rank order its frameworks lay
out (``JobContext.rank_orders``) is costed exactly
by ``cost.columns.cost_columns``, one batch per parallel sizes (all its ZeRO stages and rank
orders at once). No lower bound and no pruning: each layout's fastest rank order that fits in
memory (as ``best_estimate`` chooses it, up to ties), and the fastest of those over the space.
Non-uniform layer splits are not in this space (the planner's CP-SAT split model is), so the
planner's optimum is at most this one's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.cost import distinct_orders
from optimizer.cost.columns import LayoutColumns, cost_columns
from optimizer.cost.context import JobContext
from optimizer.cost.rules import ResolvedLayout
from optimizer.search.space import LayoutBlock, Reach, layout_blocks
from optimizer.specs import JobSpec, SearchSpec


@dataclass(frozen=True)
class ExhaustiveBest:
    """The result of costing every layout of the regular space under every rank order."""

    layouts: int
    """Layouts costed (each under every distinct rank order of its sizes)."""
    fitting: int
    """Layouts with a rank order whose peak memory fits."""
    costed: int
    """(layout, rank order) pairs costed."""
    layout: ResolvedLayout | None
    """The fastest layout that fits (the first found among equal step times); None if none fits."""
    order: tuple[str, ...] | None
    """Its rank order (innermost axis first), the first of equally fast ones."""
    step_time_s: float
    """Its step time (``inf`` when nothing fits)."""


@dataclass
class _Rows:
    """One batch's layouts, column by column."""

    micro_batch_size: list[int]
    sequence_parallel: list[bool]
    recompute: list[str]
    vpp: list[int]
    num_micro_batches: list[int]

    def add(self, block: LayoutBlock, vpp: int, recompute: str) -> None:
        """``block``'s layout at depth ``vpp`` with ``recompute`` (every ZeRO stage of it shares the row)."""
        base = block.base
        self.micro_batch_size.append(base.micro_batch_size)
        self.sequence_parallel.append(base.sequence_parallel)
        self.recompute.append(recompute)
        self.vpp.append(vpp)
        self.num_micro_batches.append(base.num_micro_batches)


def exhaustive_best(
    ctx: JobContext, job: JobSpec, search: SearchSpec, headroom_bytes: float | None = None
) -> ExhaustiveBest:
    """Cost the whole regular space of ``job`` (as ``search`` restricts it) exactly, as arrays."""
    by_sizes: dict[tuple[int, int, int, int, int, int, tuple[tuple[int, str], ...]], list[LayoutBlock]] = {}
    for block in layout_blocks(job, search, Reach.ALL):
        by_sizes.setdefault((*block.base.family, block.variants), []).append(block)
    usable = ctx.usable_bytes(headroom_bytes)
    layouts = fitting = costed = 0
    best_step, best_row = math.inf, None
    for key, blocks in by_sizes.items():
        sizes, variants = key[:6], key[6]
        orders = distinct_orders(ctx, blocks[0].base)
        # the blocks of a group share their variants (some of product(zero stages, recompute modes))
        zeros = list(dict.fromkeys(z for z, _ in blocks[0].variants))
        recomputes = list(dict.fromkeys(r for _, r in blocks[0].variants))
        rows = _Rows([], [], [], [], [])
        for block in blocks:
            for vpp in (block.base.vpp, *block.more_vpps):
                for rc in recomputes:
                    rows.add(block, vpp, rc)
        cols = LayoutColumns.of(sizes, zeros[0], rows.micro_batch_size, rows.sequence_parallel, rows.recompute,
                                rows.vpp, rows.num_micro_batches)  # fmt: skip
        by_zero = cost_columns(ctx, cols, [groups for _, groups in orders], zeros)
        for zero, costs in zip(zeros, by_zero, strict=True):
            step = np.full(len(cols), math.inf)
            order_index = np.zeros(len(cols), dtype=np.int64)
            admitted = np.asarray([(zero, rc) in variants for rc in rows.recompute], dtype=np.bool_)
            for i, cost in enumerate(costs):
                ok = (cost.peak_memory_bytes <= usable) & admitted
                candidate = np.where(ok, cost.step_time_s, math.inf)
                better = candidate < step  # ties keep the earlier (canonical-first) order
                step = np.where(better, candidate, step)
                order_index = np.where(better, i, order_index)
            layouts += int(admitted.sum())
            costed += int(admitted.sum()) * len(orders)
            fits = np.isfinite(step)
            fitting += int(fits.sum())
            if fits.any():
                r = int(np.argmin(step))
                if step[r] < best_step:
                    best_step = float(step[r])
                    best_row = (cols, zero, r, orders[int(order_index[r])][0])
    if best_row is None:
        return ExhaustiveBest(layouts, fitting, costed, None, None, math.inf)
    best_cols, zero, r, order = best_row
    return ExhaustiveBest(layouts, fitting, costed, best_cols.layout_at(job, r, zero), order, best_step)
