"""Can a layer split make every pipeline stage this fast? An exact test of a relaxation.

The split phase of the search asks, before it builds a CP-SAT model for a (layout, rank order),
whether any layer split could reach the k-th best step time. The step is at least
``(m + (pp-1)/vpp)`` times the slowest stage, so that asks whether every stage's time can be at
most some ``stage_time_s``, where a stage's time is at least the sum of its layers' times (plus
the LM head on the last stage), each stage holds between ``min_layers`` (one per chunk) and its
memory limit of layers, and the stages hold all layers.

``stage_split_reaches`` answers that exactly for a relaxation: layers of each kind may sit on any
stage (the real split keeps them in model order). Stages hold whole layers, which is what the
average-stage floor misses: DeepSeek-V3's 58 MoE and 3 dense layers on 8 stages leave some stage
with 8 MoE layers, about 7% more than the average stage; a memory limit that caps some stages
pushes the other stages' counts up further.

One or two layer kinds (the dense-first and MoE-frequency models have two); with more, or when
the exact test would cost more than ``MAX_WORK`` steps, the answer is True (nothing ruled out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_WORK = 50_000
"""Largest ``stages x (fewer-kind layers + 1)^2`` the test runs (about 10 ms in Python)."""
TIME_TOLERANCE = 1e-9
"""Relative slack on ``stage_time_s``: sums of layer times round differently from stage tables."""


def stage_split_reaches(
    stage_time_s: float,
    kind_times_s: Sequence[float],
    kind_counts: Sequence[int],
    head_s: float,
    min_layers: int,
    max_layers: Sequence[int],
) -> bool:
    """True unless no split of the layers (``kind_counts[k]`` of kind ``k``, each taking
    ``kind_times_s[k]``) over ``len(max_layers)`` stages, stage ``s`` holding between
    ``min_layers`` and ``max_layers[s]`` layers of any kinds and the last one also the head
    (``head_s``), has every stage's time at most ``stage_time_s``."""
    stages = len(max_layers)
    if len(kind_times_s) > 2 or stages == 0 or not math.isfinite(stage_time_s):
        return True
    if len(kind_times_s) == 1:
        few_time, few_count, many_time, many_count = 0.0, 0, kind_times_s[0], kind_counts[0]
    else:
        a, b = (0, 1) if kind_counts[0] <= kind_counts[1] else (1, 0)
        few_time, few_count = kind_times_s[a], kind_counts[a]
        many_time, many_count = kind_times_s[b], kind_counts[b]
    if many_time <= 0 or few_time < 0 or stages * (few_count + 1) ** 2 > MAX_WORK:
        return True
    slack = TIME_TOLERANCE * max(abs(stage_time_s), 1e-30)
    # best[u]: the most layers of the more common kind the stages so far can hold with u layers
    # of the other kind among them (every stage within its time and its layer counts)
    best = {0: 0}
    for s, most in enumerate(max_layers):
        budget = stage_time_s - (head_s if s == stages - 1 else 0.0) + slack
        if budget < 0 or most < min_layers:
            return False
        nxt: dict[int, int] = {}
        for used, held in best.items():
            for few in range(min(few_count - used, most) + 1):
                rest = budget - few * few_time
                if rest < 0:
                    break
                many = min(int(rest // many_time), most - few)
                if few + many < min_layers:
                    continue
                k = used + few
                if nxt.get(k, -1) < held + many:
                    nxt[k] = held + many
        if not nxt:
            return False
        best = nxt
    return best.get(few_count, -1) >= many_count
