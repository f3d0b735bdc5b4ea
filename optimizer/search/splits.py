"""The layer-split phase of the search: CP-SAT picks each candidate's best split.

Each (costed pipelined layout, rank-order geometry) whose split floor is below the running k-th
best time gets its best layer split from its own small CP-SAT model (per-stage layer counts,
per-stage memory limits, exact cost tables over the layer counts such a split can have). First
the pool's layouts in their uniform-best order (the likeliest to improve the top-k, which lowers
the k-th best time and prunes the rest), then every other pair by ascending floor, until the next
floor is above the k-th best time. A pair is settled without a model when no split fits in memory,
when no split within the memory limits could reach the k-th best time in whole layers
(``split_floors.split_may_reach``), or when its tables' cheapest fitting entries already exceed it.
Picking the layout is a minimum over the solved optima: the
same answer as one joint model (``SplitModel`` takes any number of candidates) with
forbid-and-resolve for the top-k, at a fraction of the time.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from optimizer.cost import Estimate, best_estimate
from optimizer.cost.context import JobContext
from optimizer.cost.estimate import estimate
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import AxisGroups, axis_groups
from optimizer.search.cpsat import Candidate, SplitModel
from optimizer.search.fit_limits import limits_admit_split, some_split_may_fit, stage_fit_limits
from optimizer.search.orders import geometry_key
from optimizer.search.split_floors import (
    layers_floor_s,
    order_split_floors,
    split_floor_s,
    split_may_reach,
)
from optimizer.search.split_tables import SplitTables, certified_split_range, split_tables

POOL_MARGIN_S = 2e-9
"""Ranking compares step times rounded to 1e-9 s; a floor this far above a time ranks after it
whatever the rounding."""
SOLVE_WORK_LIMIT = 0.5
"""Deterministic-time limit of one layer-split CP-SAT model, in CP-SAT's machine-independent work
units (about 1 s of wall time on the 2-core reference machine). The models solve in milliseconds:
the slowest measured (a Mixtral-8x22B variant with MoE on every second layer and every depth
named) needs 0.13 units. A model that stops here stops at the same point on any machine and
under any load, so whether it is proved does not depend on them."""
SOLVE_LIMIT_S = 3.0
"""Wall-time guard of one layer-split model, behind ``SOLVE_WORK_LIMIT``: a safety net only."""


@dataclass(frozen=True)
class SplitBudget:
    top_k: int
    deadline: float
    """``time.perf_counter()`` value after which no model is started."""
    headroom_bytes: float | None
    num_layers: int
    key: Callable[[ResolvedLayout], tuple] | None = None
    """What the top-k holds once: a layout (default, ``layout_key``) or a family (``search.diverse``)."""


@dataclass
class SplitOutcome:
    results: list[Estimate] = field(default_factory=list)
    """Re-scored answers (best split per solved pair; fitting or not)."""
    status: str = "OPTIMAL"
    """The worst CP-SAT status of a solve that returned an answer (or timed out)."""
    open_floor: float | None = None
    """The smallest split floor of a pair that was not (exactly) solved: a bound on what it hides."""
    models_solved: int = 0
    stopped: list[tuple[float, Estimate, float, str]] = field(default_factory=list)
    """Pairs whose model stopped at its limit: (floor, uniform estimate, threshold it ran with,
    CP-SAT status)."""

    @property
    def proved(self) -> bool:
        """Every pair that could enter the top-k was solved over exact, certified tables."""
        return self.open_floor is None


def solve_splits(
    ctx: JobContext,
    pool: list[Estimate],
    pipelined: list[tuple[float, ResolvedLayout]],
    kth: float,
    budget: SplitBudget,
) -> SplitOutcome:
    """Best layer splits of every pair that could enter the top-k. ``pool``: the best fitting
    uniform-split estimates; ``pipelined``: every costed pipelined layout with its layout bound;
    ``kth``: the k-th best uniform-split time."""
    out = SplitOutcome()
    key_of = budget.key or layout_key
    best_time = {key_of(e.layout): e.step_time_s for e in pool}  # per layout (or family), as answers come in

    def best_of(lay: ResolvedLayout) -> float:
        """The best time of ``lay``'s layout (family) so far: a split no faster changes nothing."""
        return best_time.get(key_of(lay), float("inf"))

    work = _Work(ctx, pool, pipelined, ctx.usable_bytes(budget.headroom_bytes), budget.deadline)
    while (item := work.next(min(kth, _kth_smallest(best_time.values(), budget.top_k)))) is not None:
        floor, cand, lay, g, threshold = item
        remaining = budget.deadline - time.perf_counter()
        if remaining <= 0:
            _note_open(out, min(floor, work.smallest_key()))
            break
        if budget.key is not None and floor > best_of(lay) + POOL_MARGIN_S:
            continue  # no split of it beats its family's best so far (which only falls): it cannot change the answer
        if cand is None:
            assert g is not None
            cand = estimate(ctx, lay, g.order, headroom_bytes=budget.headroom_bytes, groups=g)  # uniform split
        est = _solve_pair(ctx, cand, floor, min(threshold, best_of(lay)), remaining, budget, out)
        if est is not None:
            out.results.append(est)
            if est.fits_memory:
                k = key_of(est.layout)
                best_time[k] = min(best_time.get(k, est.step_time_s), est.step_time_s)
    if work.timed_out:
        _note_open(out, work.smallest_key())
    kth_final = min(kth, _kth_smallest(best_time.values(), budget.top_k))
    _retry_stopped(ctx, out, lambda lay: min(kth_final, best_of(lay)), budget)
    return out


def _retry_stopped(
    ctx: JobContext, out: SplitOutcome, final: Callable[[ResolvedLayout], float], budget: SplitBudget
) -> None:
    """Solve again, against its final bound (``final``: the k-th best time, or its layout's or
    family's best if lower), each pair whose model stopped at its limit while that bound was
    larger: a tighter bound prunes more and usually proves. A pair whose floor is above it cannot
    change the answer; one that stops again stays open (its floor bounds what it hides)."""
    stopped, out.stopped = out.stopped, []
    for floor, cand, threshold, status in stopped:
        remaining = budget.deadline - time.perf_counter()
        kth = final(cand.layout)
        if floor > kth + POOL_MARGIN_S:
            continue
        if kth >= threshold or remaining <= 0:
            out.stopped.append((floor, cand, threshold, status))
            continue
        est = _solve_pair(ctx, cand, floor, kth, remaining, budget, out)
        if est is not None:
            out.results.append(est)
    for floor, _, _, status in out.stopped:
        out.status = status
        _note_open(out, floor)


class _Work:
    """The (layout, rank-order geometry) pairs to solve, produced lazily in the order the split
    phase wants them: the pool's pipelined layouts in their uniform-best geometry first, then
    every other pair by ascending split floor.

    A layout's per-geometry floors (``order_split_floors``) are computed only when the queue
    reaches its layout bound, which holds for every rank order and split: once the smallest key
    in the queue is above the k-th best time, no pair behind it can enter the top-k, and the
    layouts still unexpanded never need their floors (most of them, once CP-SAT's splits have
    lowered the k-th best time below the uniform splits'). A layout no split of which fits in
    memory in any rank order (``some_split_may_fit``) is dropped then too."""

    _LAYOUT, _PAIR = 0, 1

    def __init__(
        self, ctx: JobContext, pool: list[Estimate], pipelined: list[tuple[float, ResolvedLayout]], cap_bytes: float,
        deadline: float = float("inf"),
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.cap_bytes = cap_bytes
        self.deadline = deadline
        self.timed_out = False
        first = [e for e in pool if e.layout.pp > 1]
        self.in_pool = {(layout_key(e.layout), _geometry_of(ctx, e)) for e in first}
        self.first = deque((split_floor_s(ctx, e.layout), e) for e in first)
        # (key, layout index, entry kind, geometry rank, layout, geometry): ties pop in
        # enumeration order, a layout's pairs in ascending floor order
        self.heap: list[tuple[float, int, int, int, ResolvedLayout, AxisGroups | None]] = [
            (bound, n, self._LAYOUT, 0, lay, None) for n, (bound, lay) in enumerate(pipelined)
        ]
        heapq.heapify(self.heap)

    def smallest_key(self) -> float:
        """A lower bound on the step time of every pair not yet produced."""
        keys = [floor for floor, _ in self.first]
        if self.heap:
            keys.append(self.heap[0][0])
        return min(keys, default=float("inf"))

    def next(self, threshold: float) -> tuple[float, Estimate | None, ResolvedLayout, AxisGroups | None, float] | None:
        """The next pair whose floor is at most ``threshold`` (the current k-th best time), as
        (floor, uniform estimate if known, layout, geometry, threshold); None when no pair left
        can enter the top-k. ``threshold`` never increases between calls. None too when the
        deadline passes while layouts are being expanded (then ``timed_out`` is set)."""
        ctx = self.ctx
        limit = threshold + POOL_MARGIN_S
        while self.first:
            floor, est = self.first.popleft()
            if floor <= limit:
                return floor, est, est.layout, None, threshold
        while self.heap and self.heap[0][0] <= limit:
            key, n, kind, _, lay, g = heapq.heappop(self.heap)
            if kind == self._PAIR:
                return key, None, lay, g, threshold
            if time.perf_counter() > self.deadline:
                heapq.heappush(self.heap, (key, n, kind, 0, lay, g))
                self.timed_out = True
                return None
            if layers_floor_s(ctx, lay) > limit:
                continue  # no split in any rank order is fast enough
            floors = order_split_floors(ctx, lay)
            if floors[0][0] > limit or not some_split_may_fit(ctx, lay, self.cap_bytes):
                continue  # no split in any rank order is fast enough, or fits (_solve_pair's test)
            lkey = layout_key(lay)
            for rank, (floor, g) in enumerate(floors):
                if floor > limit:
                    break
                if (lkey, geometry_key(g)) not in self.in_pool:
                    heapq.heappush(self.heap, (floor, n, self._PAIR, rank, lay, g))
        self.heap.clear()  # everything left is above a threshold that only decreases
        return None


def _solve_pair(
    ctx: JobContext, cand: Estimate, floor: float, threshold: float, remaining: float,
    budget: SplitBudget, out: SplitOutcome,
) -> Estimate | None:  # fmt: skip
    """The best split of one (layout, rank order), re-scored; None when no split can fit or
    reach ``threshold`` (memory limits, the whole-layer test, the certified table range, the
    tables' cheapest entries), or CP-SAT found none."""
    lay = cand.layout
    limits = stage_fit_limits(ctx, cand)
    if not limits_admit_split(limits, lay.vpp, budget.num_layers):
        return None  # no split of this layout fits in memory in this order
    if not split_may_reach(ctx, cand, limits, threshold + POOL_MARGIN_S):
        return None  # whole layers of each kind, within the memory limits: no split is fast enough
    layer_range = certified_split_range(ctx, cand, threshold + POOL_MARGIN_S, max(limits))
    if layer_range is not None and layer_range[0] > layer_range[1]:
        return None  # every split in this order is slower than the k-th best time
    tables = split_tables(ctx, cand, layer_range)
    if layer_range is None or not tables.exact:
        # tabulated over the default range only, or (a per-mix table too large) with each stage's
        # mix of layer kinds taken from the even split: not a proof
        _note_open(out, floor)
    if _tables_floor_s(tables, cand.usable_bytes) > threshold + POOL_MARGIN_S:
        return None  # even each stage's cheapest fitting entry is slower than the k-th best time
    out.models_solved += 1
    # These models solve in milliseconds; the limit is a guard, not a budget to share out.
    candidate = Candidate(cand, tables, cand.capacity_bytes, budget.num_layers)
    res = SplitModel([candidate], cand.step_time_s).solve(
        [], min(remaining, SOLVE_LIMIT_S), threshold + POOL_MARGIN_S, work_limit=SOLVE_WORK_LIMIT
    )
    if res.status not in ("OPTIMAL", "INFEASIBLE"):
        out.stopped.append((floor, cand, threshold, res.status))  # not a proof: solved again at the end
    if res.choice is None:
        return None
    return _rescore(ctx, cand, res.choice.stage_layers, budget.headroom_bytes)


def _tables_floor_s(tables: SplitTables, cap_bytes: float) -> float:
    """A lower bound on the best objective of a split model: each stage takes at least its
    cheapest time, data-parallel and optimizer entries among those that fit in memory."""
    if tables.by_start is not None or tables.by_mix is not None:
        rows = [[e[2:] for e in row] for row in (tables.by_start or tables.by_mix or ())]
    else:
        rows = [list(zip(t, d, o, m, strict=True)) for t, d, o, m in
                zip(tables.time_s, tables.dp_s, tables.optimizer_s, tables.memory_bytes, strict=True)]  # fmt: skip
    worst = [0.0, 0.0, 0.0]
    for row in rows:
        fitting = [e for e in row if e[3] <= cap_bytes]
        if not fitting:
            return float("inf")
        for i in range(3):
            worst[i] = max(worst[i], min(e[i] for e in fitting))
    return tables.steady_coefficient * worst[0] + worst[1] + worst[2] + tables.pp_comm_s


def _note_open(out: SplitOutcome, floor: float) -> None:
    out.open_floor = floor if out.open_floor is None else min(out.open_floor, floor)


def _geometry_of(ctx: JobContext, est: Estimate) -> tuple:
    return geometry_key(axis_groups(ctx.topology, est.order, est.layout.sizes()))


def layout_key(lay: ResolvedLayout) -> tuple:
    """A layout's identity without its layer split."""
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, lay.micro_batch_size, lay.zero_stage, lay.recompute,
            lay.sequence_parallel, lay.etp)  # fmt: skip


def _kth_smallest(values, k: int) -> float:
    """The k-th smallest of ``values`` (infinity when there are fewer)."""
    smallest = heapq.nsmallest(k, values)
    return smallest[-1] if len(smallest) >= k else float("inf")


def _rescore(ctx: JobContext, cand: Estimate, split: tuple[int, ...], headroom: float | None) -> Estimate:
    """Float cost model on the chosen split; keep the uniform split unless the new one is better."""
    if split == cand.layout.stage_layers:
        return cand
    lay: ResolvedLayout = replace(cand.layout, stage_layers=split)
    est = best_estimate(ctx, lay, headroom_bytes=headroom)  # the best rank order may change with the split
    if not cand.fits_memory:
        return est
    if est.fits_memory and est.step_time_s < cand.step_time_s * (1 - 1e-6):
        return est
    return cand
