"""Lower bounds of the whole regular layout space as numpy arrays, and the order they give.

The search costs layouts in the order of their lower bounds. Bounding every family one at a time
in Python was most of the planner's time on the large MoE spaces (126,456 families for
DeepSeek-V3 on 2,048 GPUs). Here the per-layer totals are looked up once per block (a resolved
layout and its recompute modes; ``space.LayoutBlock``) from the cost model's memo, and the
arithmetic over ZeRO stages, recompute modes and interleaving depths runs as arrays through
the cost model's own bound functions (``lower_bounds.bound_terms``, ``optimizer_shards``,
``dp_exposed_floor_s``, ``memory_floor_bytes``, ``bound_at_vpp``, ``family_bound``), which give
the same floats on numbers and on arrays. No layout object is built until the search reaches
it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from optimizer.cost.context import JobContext
from optimizer.cost.head import head_time_s
from optimizer.cost.memory import optimizer_shards
from optimizer.cost.rules import ResolvedLayout
from optimizer.search.lower_bounds import (
    bound_at_vpp,
    bound_terms,
    dp_exposed_floor_s,
    family_bound,
    lower_bound_layer_totals,
    memory_floor_bytes,
    p2p_floor_s,
)
from optimizer.search.space import LayoutBlock, LayoutFamily


@dataclass(frozen=True)
class SpaceBounds:
    """Bounds of every family of ``blocks`` (family ``f`` is variant ``f - offsets[b]`` of the
    block ``b`` whose families start at ``offsets[b]``: the order of ``space.layout_families``)."""

    blocks: Sequence[LayoutBlock]
    offsets: np.ndarray
    """Index of each block's first family (blocks may hold different numbers of variants)."""
    terms: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """``lower_bounds.lower_bound_terms`` of each family's first layout."""
    pp: np.ndarray
    m: np.ndarray
    first: np.ndarray
    """The bound of each family's first layout (``bound_at_vpp`` at its depth)."""
    has_deeper: np.ndarray
    """Whether the family has deeper layouts (``LayoutFamily.more_vpps``)."""
    deeper: np.ndarray
    """The smallest bound of each family's deeper layouts (``family_bound``; inf when none)."""
    memory_floor: np.ndarray
    """``lower_bounds.memory_floor_bytes`` of each family (the same for all its depths)."""

    @property
    def num_families(self) -> int:
        return len(self.first)

    def family(self, f: int) -> LayoutFamily:
        b = int(np.searchsorted(self.offsets, f, side="right")) - 1
        return self.blocks[b].family(f - int(self.offsets[b]))

    def member_bound(self, ctx: JobContext, f: int, lay: ResolvedLayout) -> float:
        """``compute_lower_bound_s`` of ``lay``, a layout of family ``f`` (its terms do not depend
        on the interleaving depth): the same float, from the family's terms."""
        terms = cast(tuple[float, float, float, float], tuple(float(t[f]) for t in self.terms))
        return cast(float, bound_at_vpp(ctx, terms, lay.pp, lay.vpp, lay.num_micro_batches))  # a number for one layout

    def depth_bound(self, ctx: JobContext, f: int, vpp: int) -> float:
        """``member_bound`` of family ``f``'s layout at depth ``vpp``, without resolving it."""
        terms = cast(tuple[float, float, float, float], tuple(float(t[f]) for t in self.terms))
        return cast(float, bound_at_vpp(ctx, terms, int(self.pp[f]), vpp, int(self.m[f])))  # a number for one layout

    def queue_order(self) -> tuple[list[float], list[int]]:
        """(bound, sequence number) of every queue entry, ascending: ``2 f`` is family ``f``'s first
        layout, ``2 f + 1`` its deeper layouts (at the smallest of their bounds). Ties go to the
        smaller sequence number, as in a heap of ``(bound, seq)`` pairs."""
        with_deeper = np.flatnonzero(self.has_deeper)
        bounds = np.concatenate([self.first, self.deeper[with_deeper]])
        seqs = np.concatenate([2 * np.arange(self.num_families), 2 * with_deeper + 1])
        order = np.lexsort((seqs, bounds))
        return bounds[order].tolist(), seqs[order].tolist()

    def left_out_bound(self, ctx: JobContext, best_s: float) -> float:
        """The smallest bound of the depths the space left out (``LayoutBlock.skipped_vpps``)
        when it is below ``best_s`` (else some value at least ``best_s``). A family's bound is at
        least its steady and optimizer terms, whatever the depth: families where those reach
        ``best_s`` are passed over."""
        best = float("inf")
        for vpps, fams in _families_by(self.blocks, self.offsets, lambda b: b.skipped_vpps).items():
            fams = fams[self.terms[0][fams] + self.terms[2][fams] < best_s]
            if len(fams):
                terms = tuple(t[fams] for t in self.terms)
                best = min(best, float(np.min(family_bound(ctx, terms, self.pp[fams], vpps, self.m[fams]))))
        return best

    def beyond_bound(self, usable_bytes: float, every: bool = False) -> float:
        """The smallest bound of the layouts beyond the default space's bounds
        (``LayoutBlock.beyond``; ``every``: of every layout) whose memory floor fits
        ``usable_bytes``; inf when none."""
        beyond = np.repeat([every or b.beyond for b in self.blocks], [len(b.variants) for b in self.blocks])
        mask = beyond & (self.memory_floor <= usable_bytes)
        if not mask.any():
            return float("inf")
        return float(min(np.min(self.first[mask]), np.min(self.deeper[mask])))

    def left_out_count(self) -> int:
        return sum(len(b.variants) * len(b.skipped_vpps) for b in self.blocks)


def _families_by(
    blocks: Sequence[LayoutBlock], offsets: np.ndarray, depths: Callable[[LayoutBlock], tuple[int, ...]]
) -> dict[tuple[int, ...], np.ndarray]:
    """Family indices grouped by ``depths(block)``, empty tuples left out."""
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, block in enumerate(blocks):
        vpps = depths(block)
        if vpps:
            groups[vpps].extend(range(int(offsets[i]), int(offsets[i]) + len(block.variants)))
    return {vpps: np.asarray(idx, dtype=np.int64) for vpps, idx in groups.items()}


DEADLINE_CHECK_BLOCKS = 64
"""Blocks looked up between two checks of the deadline."""


def space_bounds(ctx: JobContext, blocks: Sequence[LayoutBlock], deadline: float | None = None) -> SpaceBounds | None:
    """Bound every family of ``blocks`` (at least one); None when ``time.perf_counter()`` passes
    ``deadline`` first (checked between the per-block lookups, which take most of the time).
    Blocks sharing their ``variants`` are bounded together as arrays."""
    sizes = np.fromiter((len(b.variants) for b in blocks), dtype=np.int64, count=len(blocks))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, block in enumerate(blocks):
        groups[block.variants].append(i)
    total = int(sizes.sum())
    out = {name: np.empty(total) for name in ("t0", "t1", "t2", "t3", "pp", "m", "first", "deeper", "memory")}
    has_deeper = np.empty(total, dtype=bool)
    for variants, idx in groups.items():
        part = _group_bounds(ctx, [blocks[i] for i in idx], variants, deadline)
        if part is None:
            return None
        where = (offsets[idx][:, None] + np.arange(len(variants))).ravel()
        for name, values in part.items():
            if name == "has_deeper":
                has_deeper[where] = values
            else:
                out[name][where] = values
    terms = (out["t0"], out["t1"], out["t2"], out["t3"])
    pp = out["pp"].astype(np.int64)
    m = out["m"].astype(np.int64)
    return SpaceBounds(blocks, offsets, terms, pp, m, out["first"], has_deeper, out["deeper"], out["memory"])


def _group_bounds(
    ctx: JobContext, blocks: Sequence[LayoutBlock], variants: tuple, deadline: float | None
) -> dict[str, np.ndarray] | None:
    """The bound arrays of blocks sharing ``variants`` (block-major, variant-minor)."""
    zeros = list(dict.fromkeys(z for z, _ in variants))
    rcs = list(dict.fromkeys(r for _, r in variants))
    nb, nz, nr = len(blocks), len(zeros), len(rcs)
    totals = np.empty((6, nb, nr))
    ints = np.empty((7, nb), dtype=np.int64)  # pp, m, vpp, dp, cp, tp, ep * etp
    p2p = np.empty(nb)
    head = np.empty(nb)
    for b, block in enumerate(blocks):
        if deadline is not None and b % DEADLINE_CHECK_BLOCKS == 0 and time.perf_counter() > deadline:
            return None
        lay = block.base
        for r, rc in enumerate(rcs):
            totals[:, b, r] = lower_bound_layer_totals(
                ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, rc, lay.etp
            )
        # the ranks that split the experts (ep x etp): the expert state is sharded over the rest
        ints[:, b] = (lay.pp, lay.num_micro_batches, lay.vpp, lay.dp, lay.cp, lay.tp, lay.ep * lay.etp)
        p2p[b] = p2p_floor_s(ctx, lay)
        head[b] = head_time_s(ctx, lay)
    pp, m, vpp, dp, cp, tp, ep = (a[:, None] for a in ints)  # block x zero stage
    dense_shard, expert_shard = cast(  # arrays here: the sizes are
        "tuple[np.ndarray, np.ndarray]", optimizer_shards(np.asarray(zeros)[None, :], dp, cp, tp, ep)
    )
    dp_floor = np.stack(
        [dp_exposed_floor_s(ctx, z, dp, cp, tp, ep, pp, m, tuple(totals), head[:, None]) for z in zeros], axis=1
    )  # block x zero stage x recompute
    memory = np.stack([memory_floor_bytes(ctx, z, dp, cp, tp, ep, pp, tuple(totals)) for z in zeros], axis=1)
    shape = (nb, nz, nr)
    pick = np.asarray([zeros.index(z) * nr + rcs.index(r) for z, r in variants], dtype=np.int64)

    def grid(a: np.ndarray) -> np.ndarray:  # block x variant, flattened in that order
        return np.broadcast_to(a, shape).reshape(nb, nz * nr)[:, pick].reshape(-1)

    pp_f, m_f = grid(pp[:, :, None]), grid(m[:, :, None])
    terms = bound_terms(  # arrays here, one entry per family
        ctx,
        tuple(grid(t[:, None, :]) for t in totals),
        pp_f, m_f, grid(dense_shard[:, :, None]), grid(expert_shard[:, :, None]), grid(p2p[:, None, None]),
        grid(dp_floor),
    )  # fmt: skip
    terms_arrays = cast(tuple[np.ndarray, ...], terms)
    nv = len(variants)
    # arrays here: one entry per family
    first = cast(np.ndarray, bound_at_vpp(ctx, terms, pp_f, grid(vpp[:, :, None]), m_f))
    has_deeper = np.repeat([bool(b.more_vpps) for b in blocks], nv)
    deeper = np.full(len(first), np.inf)
    local_offsets = np.arange(nb, dtype=np.int64) * nv
    for vpps, fams in _families_by(blocks, local_offsets, lambda blk: blk.more_vpps).items():
        deeper[fams] = family_bound(ctx, tuple(t[fams] for t in terms_arrays), pp_f[fams], vpps, m_f[fams])
    t0, t1, t2, t3 = (np.broadcast_to(t, first.shape) for t in terms)
    return {"t0": t0, "t1": t1, "t2": t2, "t3": t3, "pp": pp_f, "m": m_f, "first": first,
            "has_deeper": has_deeper, "deeper": deeper, "memory": grid(memory)}  # fmt: skip
