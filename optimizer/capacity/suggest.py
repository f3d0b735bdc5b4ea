"""Nearby GPU counts that plan clearly better than the one asked for.

A GPU count whose data-parallel factor cannot divide the global batch forces the rest of it into
model parallelism, often a pipeline with a deep bubble (2,048 sequences on 576 = 9 x 64 GPUs).
When the asked count shows that symptom and planned quickly, the nearest counts without it, one
below and one above within ``SPAN``, are planned with a short time limit; those that beat the asked
count clearly are returned. The added latency is bounded by ``CANDIDATE_TIME_LIMIT_S`` per count.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from optimizer.errors import PlannerError
from optimizer.results import Plan, PlanResponse, Suggestion
from optimizer.specs import PlanRequest

SPAN = 0.25
"""Candidates lie within this fraction of the asked count."""
CANDIDATE_TIME_LIMIT_S = 2.0
"""Search time limit for each candidate count."""
MAX_MAIN_WALL_S = 3.0
"""No suggestions when the asked count took longer than this to plan (candidates would too)."""
BUBBLE_SYMPTOM = 0.10
"""A pipeline bubble above this share of the step is a symptom worth checking."""
MIN_GAIN_FEWER = 0.05
"""Fewer GPUs: at least this much more throughput."""
MIN_GAIN_PER_GPU = 0.10
"""More GPUs: at least this much more throughput per GPU (and more throughput)."""


def odd_batch_factor(num_gpus: int, global_batch: int) -> int:
    """The part of ``num_gpus`` that neither the global batch nor a power of two absorbs: the
    factor model parallelism must take whatever the data-parallel size."""
    rest = num_gpus // math.gcd(num_gpus, global_batch)
    while rest % 2 == 0:
        rest //= 2
    return rest


def candidate_counts(num_gpus: int, global_batch: int, gpus_per_node: int) -> list[int]:
    """Whole-node counts within ``SPAN`` of ``num_gpus``, one below and one above: on each side the
    one with the smallest odd batch factor (the nearest among equals), when that is smaller than
    ``num_gpus``'s (or 1 when ``num_gpus``'s is 1: the bubble, not the batch, was the symptom)."""
    step, odd = gpus_per_node, odd_batch_factor(num_gpus, global_batch)
    below = range((num_gpus - 1) // step * step, 0, -step)
    above = range((num_gpus // step + 1) * step, int((1 + SPAN) * num_gpus) + 1, step)
    out: list[int] = []
    for side in (below, above):
        best: tuple[int, int] | None = None
        for count in side:
            if count < (1 - SPAN) * num_gpus:
                break
            factor = odd_batch_factor(count, global_batch)
            if factor < max(odd, 2) and (best is None or factor < best[0]):
                best = (factor, count)
        if best is not None:
            out.append(best[1])
    return out


def _bubble_share(plan: Plan) -> float:
    return plan.time_breakdown_s.pp_bubble / plan.step_time_s


def _symptoms(request: PlanRequest, best: Plan) -> bool:
    n, gbs = request.cluster.resolved_num_gpus, request.training.global_batch_size or 1
    return odd_batch_factor(n, gbs) > 1 or _bubble_share(best) > BUBBLE_SYMPTOM


def _why(request: PlanRequest, best: Plan, count: int, other: Plan) -> str:
    n, gbs = request.cluster.resolved_num_gpus, request.training.global_batch_size or 1
    parts: list[str] = []
    if count < n:
        parts.append(f"{other.tokens_per_s / best.tokens_per_s - 1:+.0%} tokens/s from {n - count:,} fewer GPUs")
    else:
        gain = other.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu - 1
        parts.append(f"{gain:+.0%} tokens/s per GPU with {count - n:,} more GPUs")
    odd = odd_batch_factor(n, gbs)
    if odd > 1:
        parts.append(
            f"batch divisibility: {gbs:,} sequences per step cannot be split over a factor {odd} of "
            f"{n:,} = {odd} x {n // odd:,} GPUs, so model parallelism must take it"
        )
    parts.append(
        f"pipeline bubble {_bubble_share(best):.0%} of the step at {n:,} GPUs (pp {best.config.pp}, "
        f"{best.config.num_micro_batches} micro-batches) against {_bubble_share(other):.0%} at {count:,} "
        f"(pp {other.config.pp}); MFU {best.mfu:.0%} against {other.mfu:.0%}"
    )
    return "; ".join(parts)


def _clearly_better(best: Plan, count: int, n: int, other: Plan) -> bool:
    if count < n:
        return other.tokens_per_s >= (1 + MIN_GAIN_FEWER) * best.tokens_per_s
    return (
        other.tokens_per_s > best.tokens_per_s
        and other.tokens_per_s_per_gpu >= (1 + MIN_GAIN_PER_GPU) * best.tokens_per_s_per_gpu
    )


def _too_slow(response: PlanResponse) -> bool:
    return response.solver.wall_time_s > MAX_MAIN_WALL_S


def unchecked_warning(request: PlanRequest, response: PlanResponse) -> str | None:
    """The answer's warning when its best plan shows the symptom but the search took too long to
    check nearby counts (``MAX_MAIN_WALL_S``; wall time, so it depends on the machine's load):
    without it, an answer with no suggestions could not be told from one whose check found none."""
    if not response.plans or not _symptoms(request, response.plans[0]) or not _too_slow(response):
        return None
    n, gbs = request.cluster.resolved_num_gpus, request.training.global_batch_size or 1
    if not candidate_counts(n, gbs, request.cluster.gpus_per_node or 1):  # nothing nearby to check
        return None
    return (
        "nearby GPU counts were not checked for a better plan (search.suggest): the job shows what they can cure "
        f"(a GPU count with a factor the global batch does not divide, or a pipeline bubble over {BUBBLE_SYMPTOM:.0%} "
        f"of the step), but its search took {response.solver.wall_time_s:.2f} s, over the {MAX_MAIN_WALL_S:.0f} s "
        "that checking them allows (wall time: a loaded machine reaches it sooner); plan nearby counts, or sweep "
        "num_gpus"
    )


def suggestions(
    request: PlanRequest, response: PlanResponse, search_plans: Callable[[PlanRequest], PlanResponse]
) -> list[Suggestion]:
    """Clearly better nearby GPU counts for ``request`` (whose answer is ``response``), each
    planned with ``search_plans`` (the service's search, passed down)."""
    if not response.plans or not _symptoms(request, response.plans[0]) or _too_slow(response):
        return []
    best = response.plans[0]
    n = request.cluster.resolved_num_gpus
    spec = request.search.model_copy(
        update={"top_k": 1, "suggest": False, "time_limit_s": min(CANDIDATE_TIME_LIMIT_S, request.search.time_limit_s)}
    )
    out: list[Suggestion] = []
    gbs = request.training.global_batch_size or 1
    for count in candidate_counts(n, gbs, request.cluster.gpus_per_node or 1):
        cluster = request.cluster.model_copy(update={"num_gpus": count})
        try:
            answer = search_plans(request.model_copy(update={"cluster": cluster, "search": spec}))
        except PlannerError:  # the request's pins rule this count out, or its space is too large
            continue
        if not answer.plans or not _clearly_better(best, count, n, answer.plans[0]):
            continue
        other = answer.plans[0]
        out.append(
            Suggestion(
                num_gpus=count,
                tokens_per_s=other.tokens_per_s,
                tokens_per_s_per_gpu=other.tokens_per_s_per_gpu,
                step_time_s=other.step_time_s,
                mfu=other.mfu,
                reason=_why(request, best, count, other),
            )
        )
    return out
