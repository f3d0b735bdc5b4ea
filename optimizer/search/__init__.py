"""Planner search: exact enumeration with bounds, then CP-SAT over layouts and layer splits.

1. ``space.layout_blocks`` lists every valid regular layout (uniform split), grouped by all
   but the interleaving depth (families) and by all but ZeRO stage and recompute (blocks), and
   ``bounds.space_bounds`` bounds every family at once as numpy arrays. The space reaches past
   the default bounds on ``vpp`` and ``micro_batch_size`` (``Reach.ALL``: blocks of their own,
   costed in bound order like the rest; ``beyond`` leaves out micro-batch blocks that cannot fit).
2. Each gets a split- and placement-independent lower bound (``compute_lower_bound_s``); layouts
   are costed in bound order with the full cost model (best rank order onto the tiers) until the
   bound exceeds the pool's worst time: everything not costed provably cannot enter the top-k.
   A family's deeper interleavings are resolved only when the smallest of their bounds is reached.
   A family whose memory floor (``lower_bounds.memory_floor_bytes``) is above the usable capacity
   fits under no rank order or split and is passed over.
   Once k layouts that fit in memory are costed, a pipelined layout whose split floor (every rank
   order and layer split) is above the k-th best time is dropped without costing.
3. CP-SAT chooses the layer split (per-stage layer counts under per-stage memory limits, exact
   cost tables) of every costed pipelined layout, in every distinct geometry of its rank orders,
   whose split floor is below the running k-th best time: the pool's best layouts first, then
   the rest by ascending floor until the next floor exceeds the k-th best time.
4. Every answer is re-scored by the float cost model and ranked with explicit tie-breaks.
"""

from __future__ import annotations

from optimizer.search.fixed_values import check_named_values
from optimizer.search.planner import Planner
from optimizer.search.result import SearchResult
from optimizer.search.runtime import (
    DEFAULT_SPACE_MEMORY_BYTES,
    cyclic_gc_paused,
    space_memory_budget,
    space_memory_bytes,
)
from optimizer.search.steps import POOL_EXTRA, bound_space
from optimizer.specs import PlanRequest

__all__ = [
    "DEFAULT_SPACE_MEMORY_BYTES",
    "POOL_EXTRA",
    "Planner",
    "SearchResult",
    "bound_space",
    "cyclic_gc_paused",
    "search",
    "space_memory_budget",
]


def search(request: PlanRequest) -> SearchResult:
    """The top-k of ``request`` (see the module docstring) as ranked estimates
    (``optimizer.service`` makes them plans); a layout space that would take more memory than
    ``space_memory_budget`` allows is a ``SpaceTooLarge`` error."""
    check_named_values(request.job_spec(), request.search)
    with cyclic_gc_paused():
        return Planner(request, space_memory_bytes()).run()
