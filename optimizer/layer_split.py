"""How a model's layers are split over pipeline chunks by default (a pure function of two
counts, used by the request checks, the cost model and the launch arguments alike)."""

from __future__ import annotations

import functools


def even_split(num_layers: int, chunks: int) -> list[int]:
    """Layers per chunk, as even as possible; extra layers go to the middle chunks.

    The first chunk holds the embedding and the most in-flight activations, the last the LM
    head and loss, so they are the ones that get the smaller share.
    """
    return list(_even_split(num_layers, chunks))


def is_uneven(stage_layers: tuple[int, ...] | list[int]) -> bool:
    """Whether a split differs from ``even_split`` of its layers over its chunks."""
    return list(stage_layers) != even_split(sum(stage_layers), len(stage_layers))


@functools.lru_cache(maxsize=4096)
def _even_split(num_layers: int, chunks: int) -> tuple[int, ...]:
    """``even_split`` as a tuple, memoised (the search resolves tens of thousands of layouts of a
    few distinct depths)."""
    base, extra = divmod(num_layers, chunks)
    split = [base] * chunks
    middle = (chunks - 1) / 2
    for c in sorted(range(chunks), key=lambda c: (abs(c - middle), c))[:extra]:
        split[c] += 1
    return tuple(split)
