"""Cheap, exact screening of a layout before the full cost model (``best_estimate``).

The search costs layouts in lower-bound order, and most of those it costs end up neither in the
top-k nor in the CP-SAT pool: they only needed to be looked at to prove that. Two facts let it
skip their full estimates without changing any answer:

- Memory does not depend on the rank order except through ``memory_signature`` (which axes have
  process groups), and that is the same for every order unless ``dp = 1 < cp``. Then one
  order's stage memories give the exact peak ``best_estimate`` would report, so whether the
  layout fits is known without the rank-order search.
- ``step_floor_s`` bounds the step time from below over every rank order. A fitting layout whose
  floor is above the pool's current worst time can enter neither the pool nor the top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.cost import Estimate, JobContext, best_estimate
from optimizer.cost.estimate import peak_memory_bytes
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import AxisGroups
from optimizer.search.orders import any_order_groups


@dataclass
class Unfit:
    """A costed layout that does not fit in memory with its uniform split."""

    layout: ResolvedLayout
    peak_memory_bytes: float
    """Exactly ``best_estimate(...).peak_memory_bytes``."""
    estimate: Estimate | None = None
    """Filled on demand by ``resolve``: only the few offered to CP-SAT need it."""

    def resolve(self, ctx: JobContext, headroom_bytes: float | None) -> Estimate:
        if self.estimate is None:
            self.estimate = best_estimate(ctx, self.layout, headroom_bytes=headroom_bytes)
        return self.estimate


@dataclass(frozen=True)
class Screen:
    peak_memory_bytes: float
    fits_memory: bool
    groups: AxisGroups
    """One rank order's groups (any order gives the same memory)."""


def screen_memory(ctx: JobContext, lay: ResolvedLayout, headroom_bytes: float | None) -> Screen | None:
    """The layout's exact peak memory and fit, or None when it may depend on the rank order."""
    if lay.dp == 1 and lay.cp > 1:
        return None  # the cp x dp group exists only in orders where cp and dp are adjacent
    groups = any_order_groups(ctx, lay)
    peak = peak_memory_bytes(ctx, lay, groups)
    return Screen(peak, peak <= ctx.usable_bytes(headroom_bytes), groups)
