"""How a model's layers are split over pipeline chunks by default (a pure function of two
counts, used by the request checks, the cost model and the launch arguments alike)."""

from __future__ import annotations


def even_split(num_layers: int, chunks: int) -> list[int]:
    """Layers per chunk, as even as possible; extra layers go to the middle chunks.

    The first chunk holds the embedding and the most in-flight activations, the last the LM
    head and loss, so they are the ones that get the smaller share.
    """
    base, extra = divmod(num_layers, chunks)
    split = [base] * chunks
    middle = (chunks - 1) / 2
    for c in sorted(range(chunks), key=lambda c: (abs(c - middle), c))[:extra]:
        split[c] += 1
    return split
