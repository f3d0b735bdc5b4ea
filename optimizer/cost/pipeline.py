"""Pipeline schedules: bubbles, in-flight micro-batches and the layer split over stages.

Chunks are numbered in schedule order as Megatron does for the interleaved schedule: chunk
``c = v * pp + stage`` is virtual chunk ``v`` of pipeline stage ``stage``; with ``vpp = 1`` chunk
``c`` is stage ``c``. The first chunk carries the embedding, the last the LM head and loss.
"""

from __future__ import annotations

import numpy as np

from optimizer.cost.num import Num, minimum, select
from optimizer.layer_split import even_split as even_split  # the default split, kept importable from here


def bubble_fraction_gpipe(pp: int, m: int) -> float:
    """Idle fraction of a GPipe / 1F1B step: ``(p-1) / (m+p-1)`` (seed-notes section 4)."""
    return (pp - 1) / (m + pp - 1)


def bubble_over_ideal(pp: int, m: int, vpp: int = 1) -> float:
    """Bubble time relative to the ideal (no-bubble) time: ``(p-1) / (v*m)``."""
    return (pp - 1) / (vpp * m)


def stage_of_chunk(chunk: int, pp: int) -> int:
    return chunk % pp


def in_flight_microbatches(stage: Num, pp: int, vpp: Num, m: Num, extra_warmup: int = 0) -> Num:
    """Micro-batches whose activations a stage holds at its peak, in units of a whole stage.

    1F1B: stage ``i`` holds ``min(m, pp - i)``. Interleaved (Megatron): warm-up of
    ``(pp - i - 1) * 2 + (vpp - 1) * pp`` chunk-micro-batches (``extra_warmup`` more: one with the
    expert all-to-all overlap, ``schedules.py`` at 000c4ac2) plus the one in flight, each chunk
    being ``1/vpp`` of the stage. ``stage``, ``vpp`` and ``m`` may be numpy arrays (broadcast).
    """
    if pp == 1:
        return 1.0
    one_f_one_b = minimum(m, pp - stage)
    if not isinstance(vpp, np.ndarray) and vpp == 1:  # (the split search's many per-stage calls)
        held = one_f_one_b
    else:
        interleaved = minimum(m * vpp, (pp - stage - 1) * 2 + (vpp - 1) * pp + 1 + extra_warmup) / vpp
        held = select(vpp == 1, one_f_one_b, interleaved)
    return held.astype(float) if isinstance(held, np.ndarray) else float(held)
