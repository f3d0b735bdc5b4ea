"""How a pipeline's layers fall into chunks: the chunk split of per-stage layer counts, and the
repeat of the layer kinds that lets the split model count a chunk's kinds from its length."""

from __future__ import annotations

from dataclasses import dataclass


def chunk_split(per_stage: list[int], vpp: int) -> tuple[int, ...]:
    """Layers per chunk in schedule order (chunk ``v*pp + s``) from layers per stage."""
    pp = len(per_stage)
    chunks = [0] * (pp * vpp)
    for s, n in enumerate(per_stage):
        base, extra = divmod(n, vpp)
        for v in range(vpp):
            chunks[v * pp + s] = base + (1 if v >= vpp - extra else 0)
    return tuple(chunks)


@dataclass(frozen=True)
class KindPeriod:
    """Layers from ``offset`` on repeat their kinds every ``length`` layers."""

    offset: int
    length: int
    per_period: tuple[int, ...]
    """Layers of each kind (but the last) in one period."""
    rest_table: tuple[tuple[int, ...], ...]
    """(phase, rest, next phase, layers of each kind but the last among ``rest`` layers from ``phase``)."""


KIND_PERIOD_MAX = 8
"""Longest repeat ``kind_period`` looks for."""


def kind_period(kind_prefix: tuple[tuple[int, ...], ...]) -> KindPeriod | None:
    """How the layer kinds repeat past the fewest first layers (the shortest repeat among those,
    covering at least two periods); None when they do not repeat, or repeat every layer (a chunk
    past those layers then has one mix wherever it starts). ``kind_prefix[k][x]``: layers of kind
    ``k`` among the first ``x``."""
    tracked = len(kind_prefix) - 1
    layers = len(kind_prefix[0]) - 1
    seq = [tuple(kind_prefix[k][x + 1] - kind_prefix[k][x] for k in range(tracked)) for x in range(layers)]
    best: tuple[int, int] | None = None  # (first repeating layer, period)
    for f in range(1, min(KIND_PERIOD_MAX, layers // 2) + 1):
        d = layers - f
        while d > 0 and seq[d - 1] == seq[d - 1 + f]:
            d -= 1
        if layers - d >= 2 * f and (best is None or d < best[0]):
            best = (d, f)
    if best is None or best[1] == 1:
        return None
    d, f = best
    per_period = tuple(sum(seq[d + t][k] for t in range(f)) for k in range(tracked))
    rows = tuple(
        (p, r, (p + r) % f, *(sum(seq[d + (p + t) % f][k] for t in range(r)) for k in range(tracked)))
        for p in range(f) for r in range(f)
    )  # fmt: skip
    return KindPeriod(d, f, per_period, rows)
