"""Which layers of each kind a pipeline stage can hold: the kind mixes of consecutive layers, of
the chunks an interleaved stage holds, and where a stage of one chunk can start. The split
tables and fit limits enumerate these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.rules import ResolvedLayout


def counts_at(ctx: JobContext, start: int, n: int) -> tuple[int, ...]:
    """Layers of each kind among layers ``start .. start + n - 1``."""
    prefix = ctx.kind_prefix
    return tuple(prefix[k][start + n] - prefix[k][start] for k in range(len(prefix)))


class MixesKey(NamedTuple):
    """All ``consecutive_mixes`` reads (with the job's layer kinds): the run length and the starts."""

    n: int
    start: int
    stop: int


CONSECUTIVE_MIXES = Memo[MixesKey, frozenset[tuple[int, ...]]]("consecutive_mixes")


def consecutive_mixes(ctx: JobContext, starts: range, n: int) -> frozenset[tuple[int, ...]]:
    """The distinct layer-kind mixes of ``n`` consecutive layers starting anywhere in ``starts``
    (a step-1 range; memoised per ``MixesKey``)."""
    key = tuple.__new__(MixesKey, (n, starts.start, starts.stop))
    table = ctx.caches[CONSECUTIVE_MIXES]
    mixes = table.get(key)
    if mixes is None:
        found: set[tuple[int, ...]] = set()
        if len(starts):
            kinds = ctx.layer_kind
            counts = list(counts_at(ctx, starts.start, n))
            found.add(tuple(counts))
            for s in range(starts.start + 1, starts.stop):  # slide: drop layer s - 1, add s + n - 1
                out, add = kinds[s - 1], kinds[s + n - 1]
                if out != add:
                    counts[out] -= 1
                    counts[add] += 1
                    found.add(tuple(counts))
        mixes = table[key] = frozenset(found)
    return mixes


def stage_starts(lay: ResolvedLayout, layers: int, stage: int, n: int, lo: int, hi: int) -> range:
    """First layers stage ``stage`` can have when it holds ``n`` layers and every stage holds
    ``lo .. hi`` (one chunk per stage: the stages before it hold the layers before it)."""
    if stage == 0:
        return range(1)
    if stage == lay.pp - 1:
        return range(layers - n, layers - n + 1)
    first = max(stage * lo, layers - n - (lay.pp - 1 - stage) * hi)
    last = min(stage * hi, layers - n - (lay.pp - 1 - stage) * lo)
    return range(first, last + 1)


def mix_vectors(n: int, totals: Sequence[int]) -> list[tuple[int, ...]]:
    """Every way to pick ``n`` layers when there are ``totals[k]`` layers of kind ``k``."""
    if len(totals) == 1:
        return [(n,)] if n <= totals[0] else []
    out = []
    for first in range(max(0, n - sum(totals[1:])), min(n, totals[0]) + 1):
        out += [(first, *rest) for rest in mix_vectors(n - first, totals[1:])]
    return out


class ChunkMixesKey(NamedTuple):
    """All ``chunk_sum_mixes`` reads (with the job's layer kinds)."""

    vpp: int
    most: int


CHUNK_SUM_MIXES = Memo[ChunkMixesKey, frozenset[tuple[int, ...]]]("chunk_sum_mixes")


def chunk_sum_mixes(ctx: JobContext, vpp: int, most: int) -> frozenset[tuple[int, ...]]:
    """Every layer-kind mix (layers of each kind) that ``vpp`` runs of consecutive layers, each
    of at least one layer and together at most ``most``, can add up to (memoised per job).

    A stage of an interleaved split holds ``vpp`` such runs (its chunks), so its mix is among
    these; the runs' order and disjointness are left out, so some of them no split gives. With
    MoE on every second layer a run of ``n`` layers holds ``n // 2`` or ``n - n // 2`` MoE layers,
    so a stage of ``n`` layers holds within ``vpp / 2`` of ``n / 2``: of the ``n + 1`` mixes a
    stage of ``n`` layers could otherwise hold, at most ``vpp + 1`` remain.
    """
    key = tuple.__new__(ChunkMixesKey, (vpp, most))
    table = ctx.caches[CHUNK_SUM_MIXES]
    found = table.get(key)
    if found is None:
        layers = len(ctx.layer_kind)
        longest = most - (vpp - 1)
        runs = set().union(
            *(consecutive_mixes(ctx, range(layers - n + 1), n) for n in range(1, min(longest, layers) + 1))
        )
        found = table[key] = sums_of_runs(runs, vpp, most, len(ctx.kinds))
    return found


CHUNK_SUM_GRID_MAX = 2_000_000
"""Largest kind-count grid (``(most + 1) ** kinds`` cells) ``sums_of_runs`` fills as an array."""


def sums_of_runs(runs: set[tuple[int, ...]], vpp: int, most: int, kinds: int) -> frozenset[tuple[int, ...]]:
    """Every sum of ``vpp`` mixes from ``runs`` (repeats allowed) with at most ``most`` layers in
    all: a reachability grid over the kind counts, shifted by each run ``vpp`` times (a set of
    tuples when the grid would be larger than ``CHUNK_SUM_GRID_MAX``)."""
    if (most + 1) ** kinds > CHUNK_SUM_GRID_MAX:
        sums: set[tuple[int, ...]] = {(0,) * kinds}
        for _ in range(vpp):
            sums = {
                tuple(a + b for a, b in zip(x, r, strict=True)) for x in sums for r in runs if sum(x) + sum(r) <= most
            }
        return frozenset(sums)
    size = most + 1
    reach = np.zeros((size,) * kinds, dtype=bool)
    reach[(0,) * kinds] = True
    if len(runs) * reach.size <= SHIFT_WORK_MAX:
        for _ in range(vpp):
            reach = _shifted(reach, runs)
    else:
        reach = _summed(reach, runs, vpp)
    total = np.indices(reach.shape).sum(axis=0)
    return frozenset(tuple(int(c) for c in idx) for idx in np.argwhere(reach & (total <= most)))


SHIFT_WORK_MAX = 50_000_000
"""Largest runs x grid-cells product ``sums_of_runs`` ORs shifted grids for; above it (a long
model of several layer kinds has hundreds of thousands of distinct runs) the sums are built by
doubling with FFT convolutions (``_summed``)."""


def _shifted(reach: np.ndarray, runs: set[tuple[int, ...]]) -> np.ndarray:
    """Every cell ``reach`` reaches plus one run: an OR of ``reach`` shifted by each run."""
    size = reach.shape[0]
    nxt = np.zeros_like(reach)
    for r in runs:
        if max(r) >= size:
            continue
        dst = tuple(slice(c, size) for c in r)
        src = tuple(slice(0, size - c) for c in r)
        nxt[dst] |= reach[src]
    return nxt


def _convolved(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Every cell (below the grid's size) that a cell of ``a`` plus a cell of ``b`` reaches: a
    convolution by FFT, thresholded (path counts stay far inside float64's exact range, so
    rounding never flips a cell)."""
    size, kinds = a.shape[0], a.ndim
    shape, axes = (2 * size - 1,) * kinds, tuple(range(kinds))
    spectrum = np.fft.rfftn(a.astype(float), shape, axes) * np.fft.rfftn(b.astype(float), shape, axes)
    counts = np.fft.irfftn(spectrum, shape, axes)
    return counts[(slice(0, size),) * kinds] > 0.5


def _summed(reach: np.ndarray, runs: set[tuple[int, ...]], vpp: int) -> np.ndarray:
    """``_shifted`` applied ``vpp`` times, as sums of ``vpp`` runs built by doubling: about
    ``2 log2(vpp)`` convolutions instead of ``vpp`` passes over every run."""
    size = reach.shape[0]
    base = np.zeros_like(reach)
    for r in runs:
        if max(r) < size:
            base[r] = True
    while vpp:
        if vpp & 1:
            reach = _convolved(reach, base)
        vpp >>= 1
        if vpp:
            base = _convolved(base, base)
    return reach


def several_kinds_one_chunk(ctx: JobContext, lay: ResolvedLayout) -> bool:
    return len(ctx.kinds) > 1 and lay.vpp == 1 and lay.pp > 1


def per_stage_layers(lay: ResolvedLayout) -> list[int]:
    return [sum(lay.stage_layers[j] for j in range(s, len(lay.stage_layers), lay.pp)) for s in range(lay.pp)]
