"""What the top-k is a choice between, and the plans' simplest form.

``search.diverse`` (the default) makes the top-k the best plan of each of k layout families (the
parallel sizes ``tp, pp, dp, cp, ep``): the search's running k-th best time is then the k-th best
family's, so its bounds prune exactly what cannot enter that answer. Plans that differ only in a
setting that does not change the step (ZeRO-1 and ZeRO-2 at the same time) are one plan, reported
in its simplest form: the lowest ZeRO stage, then the least recompute, with the same step time,
fitting in memory and running on the same frameworks (``simplest``).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from optimizer.cost import Estimate, estimate
from optimizer.cost.rules import ResolvedLayout
from optimizer.frameworks import kv_heads_to_split, layout_problem
from optimizer.modes import RecomputeMode
from optimizer.search.framework_space import target_profiles

LEAST_RECOMPUTE = (
    RecomputeMode.NONE,
    RecomputeMode.CORE_ATTN,
    RecomputeMode.OP,
    RecomputeMode.SELECTIVE,
    RecomputeMode.MOE,
    RecomputeMode.FULL,
)
"""Recompute modes from least to most re-run work (the order ``simplest`` tries them in)."""


def family_key(lay: ResolvedLayout) -> tuple:
    """A layout family: its parallel sizes."""
    return lay.family


class BestTimes:
    """The ``size`` best step times seen, per layout (``diverse`` false) or per family (true)."""

    def __init__(self, size: int, diverse: bool) -> None:
        self.size = size
        self.diverse = diverse
        self._heap: list[float] = []  # max-heap (negated), per layout
        self._best: dict[tuple, float] = {}  # per family
        self._value = float("inf")
        self._stale = False

    def push(self, lay: ResolvedLayout, step_s: float) -> None:
        if not self.diverse:
            heapq.heappush(self._heap, -step_s)
            if len(self._heap) > self.size:
                heapq.heappop(self._heap)
            return
        key = family_key(lay)
        if step_s < self._best.get(key, float("inf")):
            self._best[key] = step_s
            self._stale = True

    def beaten(self, lay: ResolvedLayout, bound_s: float) -> bool:
        """Per family: its best time so far is below ``bound_s`` (a bound of ``lay`` under every
        rank order and split), so ``lay`` cannot become its family's plan."""
        return self.diverse and bound_s > self._best.get(family_key(lay), float("inf"))

    @property
    def full(self) -> bool:
        return len(self._heap if not self.diverse else self._best) >= self.size

    @property
    def value(self) -> float:
        """The ``size``-th best time (infinity until ``full``)."""
        if not self.diverse:
            return -self._heap[0] if self.full else float("inf")
        if self._stale:
            smallest = heapq.nsmallest(self.size, self._best.values())
            self._value = smallest[-1] if len(smallest) >= self.size else float("inf")
            self._stale = False
        return self._value


def pick(ranked: list[Estimate], size: int, diverse: bool) -> list[Estimate]:
    """The first ``size`` of ``ranked`` (already in rank order), one per family when ``diverse``."""
    if not diverse:
        return ranked[:size]
    out, seen = [], set()
    for est in ranked:
        key = family_key(est.layout)
        if key not in seen:
            seen.add(key)
            out.append(est)
            if len(out) == size:
                break
    return out


def simplest(ctx, job, est: Estimate, zeros: list[int], recomputes: list[str], headroom: float | None) -> Estimate:
    """``est`` at the lowest ZeRO stage of ``zeros``, then the least recompute of ``recomputes``,
    that steps in the same time (to 1e-9 s), fits and runs on every framework ``est`` runs on."""
    is_moe = job.model.moe is not None
    frameworks = _following(job, est.layout, is_moe)
    for field, values in (
        ("zero_stage", sorted(zeros)),
        ("recompute", [r for r in LEAST_RECOMPUTE if r in recomputes]),
    ):
        for value in values:
            if value == getattr(est.layout, field):
                break
            lay = replace(est.layout, **{field: value})  # type: ignore[arg-type]  # field is zero_stage or recompute, value of its type
            if frameworks and not _following(job, lay, is_moe) >= frameworks:
                continue
            other = estimate(ctx, lay, est.order, headroom_bytes=headroom)
            if other.fits_memory and round(other.step_time_s, 9) == round(est.step_time_s, 9):
                est = other
                break
    return est


def _following(job, lay: ResolvedLayout, is_moe: bool) -> set[str]:
    """The target frameworks whose layout rules ``lay`` follows: those whose stack runs the job's
    knobs or, when none does, the named one (or every one), whose layout rules the plans still
    follow (``framework_space``)."""
    return {
        p.id
        for p in target_profiles(job.training, job.model, job.gpu_generation)[0]
        if layout_problem(p, lay, is_moe, job.training.seq_len, kv_heads_to_split(job.model)) is None
    }
