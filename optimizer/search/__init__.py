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

import gc
import heapq
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from optimizer.cost import Estimate, best_estimate, build_context
from optimizer.cost.rules import ResolvedLayout
from optimizer.results import PlanResponse, SolverInfo
from optimizer.search.beyond import BeyondGroup, beyond_groups, beyond_micro_batch, may_fit, smallest_bound
from optimizer.search.bounds import SpaceBounds, space_bounds
from optimizer.search.fixed_values import check_named_values, fixed_combination_reason
from optimizer.search.floors import split_floor_at_vpp_s, split_floor_s, step_floor_exceeds
from optimizer.search.framework_space import space_frameworks
from optimizer.search.ranking import BestTimes, family_key, pick, simplest
from optimizer.search.screen import Screen, Unfit, screen_memory
from optimizer.search.space import (
    UNEVEN_DEPTHS_DEFAULT_MAX,
    LayoutBlock,
    Reach,
    SpaceBudget,
    SpaceTimedOut,
    _recompute_choices,
    _zero_choices,
    count_layouts,
    empty_choice,
    layout_blocks,
)
from optimizer.search.splits import (
    POOL_MARGIN_S,
    SOLVE_WORK_LIMIT,
    SplitBudget,
    SplitOutcome,
    layout_key,
    solve_splits,
)
from optimizer.specs import JobSpec, PlanRequest, SearchSpec
from optimizer.units import GIB, to_gib

DEFAULT_SPACE_MEMORY_BYTES = 512 * 2**20
"""Memory the layout space of one search may take by default (``SpaceBudget``)."""
POOL_EXTRA = 8
"""Candidates kept beyond top_k for the CP-SAT stage."""


def _rank_key(est: Estimate) -> tuple:
    lay = est.layout
    inter_node = sum(1 for t in est.placement.values() if t not in ("nvlink", "none"))
    return (
        round(est.step_time_s, 9),
        round(est.peak_memory_bytes / GIB, 3),
        inter_node,
        (lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, lay.micro_batch_size, lay.zero_stage, lay.recompute),
        lay.stage_layers,
    )


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while searches run (reference counting still
    frees everything). A large search allocates hundreds of thousands of short-lived acyclic
    objects and the collector's passes over them cost about a quarter of its time (DeepSeek-V3 on
    2,048 GPUs: 3.1 s -> 2.4 s). Collection resumes when the last concurrent search ends, if it
    was on when the first began; a search that ends while others still run collects the young
    generations, so overlapping searches on a busy server do not let cyclic garbage pile up."""
    global _gc_pausers, _gc_was_enabled
    paused = False
    try:
        with _gc_lock:
            if _gc_pausers == 0:
                _gc_was_enabled = gc.isenabled()
                gc.disable()
            _gc_pausers += 1
            paused = True
        yield
    finally:
        if paused:
            with _gc_lock:
                _gc_pausers -= 1
                last = _gc_pausers == 0
                if last and _gc_was_enabled:
                    gc.enable()
            if not last:
                gc.collect(1)


_space_memory_bytes: ContextVar[float] = ContextVar("space_memory_bytes", default=DEFAULT_SPACE_MEMORY_BYTES)


@contextmanager
def space_memory_budget(max_bytes: float) -> Iterator[None]:
    """Searches run inside (in this thread or task) let their layout space take ``max_bytes``."""
    token = _space_memory_bytes.set(max_bytes)
    try:
        yield
    finally:
        _space_memory_bytes.reset(token)


def search(request: PlanRequest) -> PlanResponse:
    """The top-k plans of ``request`` (see the module docstring); a layout space that would take
    more memory than ``space_memory_budget`` allows is a ``SpaceTooLarge`` error."""
    check_named_values(JobSpec(model=request.model, training=request.training, cluster=request.cluster), request.search)
    with cyclic_gc_paused():
        return _search(request, _space_memory_bytes.get())


def _search(request: PlanRequest, space_memory_bytes: float) -> PlanResponse:
    from optimizer.service import to_plan

    t0 = time.perf_counter()
    spec = request.search
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    ctx = build_context(job)
    headroom = spec.memory_headroom_gib * GIB if spec.memory_headroom_gib is not None else None
    usable_bytes = ctx.usable_bytes(headroom)
    deadline = t0 + spec.time_limit_s
    budget_end = deadline - 0.2 * spec.time_limit_s  # keep a fifth of the time for CP-SAT
    try:
        blocks = list(layout_blocks(job, spec, Reach.ALL, SpaceBudget(budget_end, space_memory_bytes)))
    except SpaceTimedOut as exc:
        return _no_plan(SolverInfo(candidates_enumerated=exc.layouts), t0, "feasible", "UNKNOWN", (
            f"search.time_limit_s = {spec.time_limit_s} s ran out while enumerating the layouts of the space "
            f"({exc.layouts:,} so far), before any was costed: raise the time limit or narrow search.fix / search.allow"
        ))  # fmt: skip
    info = SolverInfo(candidates_enumerated=count_layouts(blocks))
    if not blocks:
        return _no_plan(info, t0, "infeasible", "INFEASIBLE", _no_layout_explanation(job, spec))
    bounds, groups = bound_space(ctx, blocks, usable_bytes, budget_end)
    if bounds is None:
        return _no_plan(info, t0, "feasible", "UNKNOWN", (
            f"search.time_limit_s = {spec.time_limit_s} s ran out while bounding the "
            f"{info.candidates_enumerated:,} layouts of the space, before any was costed: raise the time limit "
            "or narrow search.fix / search.allow"
        ))  # fmt: skip
    # Bound-ordered queue of layouts and of families whose deeper interleavings are unresolved;
    # a family enters at the smallest of its deeper members' bounds, so popping in bound order
    # visits every layout in bound order. The families' entries are sorted once (``bounds``); the
    # members of families expanded on the way go to a heap, and the two are merged. Ties pop in
    # sequence order (enumeration order, then expanded members in the order they were expanded).
    static_bounds, static_seqs = bounds.queue_order()
    n_static, pos = len(static_bounds), 0
    queue: list[tuple[float, int, ResolvedLayout | BeyondGroup]] = []  # expanded members, beyond-bound groups
    seq = 2 * bounds.num_families
    for group in groups:  # bounded family by family only when the costing reaches them
        heapq.heappush(queue, (group.bound, seq, group))
        seq += 1
    pool_size = spec.top_k + POOL_EXTRA
    fitting: list[Estimate] = []
    n_fitting = 0  # includes fitting layouts screened out of the pool without a full estimate
    kth_best = BestTimes(spec.top_k, spec.diverse)  # the k best step times seen (per family when diverse)
    pool_best = BestTimes(pool_size, spec.diverse)
    pipelined: list[tuple[float, ResolvedLayout]] = []  # costed layouts with a layer split to choose
    smallest: Unfit | None = None  # the costed layout needing the least memory
    never_fit: list[tuple[int, int]] = []  # (family, 1 for its deeper layouts) passed over by the memory floor
    proved = True
    next_bound: float | None = None
    costed = 0
    while pos < n_static or queue:
        from_static = pos < n_static and (
            not queue or (static_bounds[pos], static_seqs[pos]) < (queue[0][0], queue[0][1])
        )
        bound = static_bounds[pos] if from_static else queue[0][0]
        if kth_best.full and bound > kth_best.value:
            next_bound = bound  # nothing from here on can enter the top-k
            break
        if time.perf_counter() > budget_end:
            proved = False
            next_bound = bound
            break
        if from_static:
            family, is_deeper = divmod(static_seqs[pos], 2)
            pos += 1
            if bounds.memory_floor[family] > usable_bytes:
                # fits in memory under no rank order or split (nor do its deeper layouts, which
                # share the floor and so never enter the heap), so it is no plan; an infeasible
                # job's explanation names the smallest memory need, so keep it until some fits
                if not n_fitting:
                    never_fit.append((family, is_deeper))
                continue
            fam = bounds.family(family)
            if is_deeper:
                if kth_best.full:
                    # the depths whose split floor (every rank order and split) is above the k-th
                    # best time would be dropped when popped: leave them unresolved
                    limit = kth_best.value + POOL_MARGIN_S
                    # depths whose bound is above the k-th best time would never be popped either
                    depths = tuple(
                        v for v in fam.more_vpps
                        if bounds.depth_bound(ctx, family, v) <= kth_best.value
                        and split_floor_at_vpp_s(ctx, fam.first, v) <= limit
                    )  # fmt: skip
                    fam = fam._replace(more_vpps=depths)
                for member in fam.expand(job):
                    heapq.heappush(queue, (bounds.member_bound(ctx, family, member), seq, member))
                    seq += 1
                continue
            lay = fam.first
        else:
            entry = heapq.heappop(queue)[2]
            if isinstance(entry, BeyondGroup):
                kth = kth_best.value if kth_best.full else math.inf
                seq = _expand_group(ctx, job, entry, usable_bytes, kth, queue, seq, budget_end)
                continue
            lay = entry
        if kth_best.beaten(lay, bound - POOL_MARGIN_S):
            continue  # its family already has a faster plan (search.diverse): it cannot be a plan
        if lay.pp > 1 and kth_best.full and split_floor_s(ctx, lay) > kth_best.value + POOL_MARGIN_S:
            continue  # no rank order and no layer split of it can enter the top-k
        costed += 1
        if lay.pp > 1:
            pipelined.append((bound, lay))
        screen = screen_memory(ctx, lay, headroom)
        if screen is not None and not screen.fits_memory:
            unfit = Unfit(lay, screen.peak_memory_bytes)
        elif screen is not None and _outside_pool(ctx, lay, screen, pool_best):
            n_fitting += 1
            continue
        else:
            est = best_estimate(ctx, lay, headroom_bytes=headroom)
            if est.fits_memory:
                n_fitting += 1
                fitting.append(est)
                kth_best.push(est.layout, est.step_time_s)
                pool_best.push(est.layout, est.step_time_s)
                continue
            unfit = Unfit(lay, est.peak_memory_bytes, est)
        smallest = _least_memory(smallest, unfit)
    info.candidates_fitting_memory = n_fitting
    fitting.sort(key=_rank_key)
    kth = kth_best.value
    pool = pick(fitting, pool_size, spec.diverse)
    targets = space_frameworks(job, spec)
    if any(p.parallelism.uneven_stage_layers.value for p in targets.profiles):
        split_key = family_key if spec.diverse else layout_key
        budget = SplitBudget(spec.top_k, deadline, headroom, job.model.num_layers or 0, split_key)
        split = solve_splits(ctx, pool, pipelined, kth, budget)
    else:  # no target framework takes per-stage layer counts: the uniform split is the only one
        split = SplitOutcome()
    results, cp_status, split_proved, open_floor = split.results, split.status, split.proved, split.open_floor
    info.candidates_to_solver = split.models_solved
    # The pool's uniform-split estimates are exact float scores: merge them with the CP-SAT
    # answers (which may carry better splits) and keep each layout once, at its best split.
    best_by_layout: dict[tuple, Estimate] = {}
    for est in [*pool, *results]:
        if not est.fits_memory:
            continue
        key = layout_key(est.layout)
        if key not in best_by_layout or _rank_key(est) < _rank_key(best_by_layout[key]):
            best_by_layout[key] = est
    results = _final(ctx, job, spec, sorted(best_by_layout.values(), key=_rank_key), headroom)
    info.proved_optimal = proved and split_proved and cp_status == "OPTIMAL" and bool(results)
    info.status = _solver_status(info.proved_optimal, cp_status, bool(results))
    if open_floor is not None:  # the optimum may be an unsolved split with this floor or more
        next_bound = open_floor if next_bound is None else min(next_bound, open_floor)
    if info.proved_optimal:
        info.objective_bound = results[0].step_time_s
    elif results:  # the optimum is the best costed plan or something with a bound >= next_bound
        info.objective_bound = min(results[0].step_time_s, next_bound if next_bound is not None else float("inf"))
    else:
        info.objective_bound = next_bound
    info.wall_time_s = time.perf_counter() - t0
    warnings: list[str] = []
    if open_floor is not None:
        warnings.append(
            f"not every layer split that could enter the top-k was solved exactly (time limit, a split model "
            f"stopped at its work limit ({SOLVE_WORK_LIMIT:g} deterministic units, about 1 s), a split table "
            f"too wide to tabulate, or a model with "
            f"several layer kinds whose per-mix table is too large); best remaining bound {open_floor:.3f} s"
        )
    if not proved:
        warnings.append(
            f"time limit reached after costing {costed} of {info.candidates_enumerated} layouts; best remaining bound "
            f"{next_bound:.3f} s"
        )
    if not results:
        if not proved:
            return PlanResponse(
                status="feasible",
                plans=[],
                solver=info,
                explanation=(
                    f"no layout that fits in memory was found within search.time_limit_s = {spec.time_limit_s} s "
                    f"({costed} of {info.candidates_enumerated} layouts costed); infeasibility is not proved: raise the time "
                    "limit or narrow search.fix / search.allow"
                ),
                warnings=warnings,
            )
        info.status = "INFEASIBLE"
        # every layout was costed or passed over: cost those passed over by ascending memory floor
        # while the floor is not above the smallest need found
        never_fit.sort(key=lambda entry: bounds.memory_floor[entry[0]])
        for family, is_deeper in never_fit:
            if smallest is not None and bounds.memory_floor[family] > smallest.peak_memory_bytes:
                break
            if smallest is not None and time.perf_counter() > deadline:
                warnings.append(
                    "the time limit ran out while looking for the layout needing the least memory: "
                    "the explanation names the least found"
                )
                break
            fam = bounds.family(family)
            for member in fam.expand(job) if is_deeper else [fam.first]:
                smallest = _least_memory(smallest, _unfit(ctx, member, headroom))
        return PlanResponse(
            status="infeasible",
            plans=[],
            solver=info,
            explanation=_memory_explanation(smallest.resolve(ctx, headroom) if smallest else None),
            warnings=warnings,
        )
    best = results[0]
    skipped_bound = bounds.left_out_bound(ctx, best.step_time_s)
    if skipped_bound < best.step_time_s:
        info.left_out_depths_bound_s = skipped_bound
        left_out = bounds.left_out_count()
        warnings.append(
            f"interleaving depths with unequal chunks (pp * vpp not dividing num_layers = {job.model.num_layers}) "
            f"were not searched: for a model whose dense and MoE layers alternate they would add {left_out:,} layouts, "
            f"more than the default space takes ({UNEVEN_DEPTHS_DEFAULT_MAX:,}); their layouts' lower bound is "
            f"{skipped_bound:.3f} s, below the best plan's {best.step_time_s:.3f} s, so one of them may be faster "
            "(the bound is loose: often none is): name the depths in search.allow.vpp (1-8) to search them too "
            "(slower; docs/search.md)"
        )
    if not targets.stack_matched:
        warnings.append(
            "no framework's stack runs the job's training.* knobs (docs/frameworks.md: each profile's [stack]; "
            "the plans' notes name the knob); the plans follow the layout rules of "
            + (f"{job.training.framework}" if job.training.framework else "every framework")
            + " and list none in plan.frameworks"
        )
    beyond_bound = bounds.beyond_bound(usable_bytes)
    above = min(beyond_bound, best.step_time_s)
    beyond_bound = min(beyond_bound, smallest_bound(ctx, groups, usable_bytes, above, deadline))
    if beyond_bound < best.step_time_s:  # searched in bound order with the rest: say so
        info.beyond_default_bounds_s = beyond_bound
    plans = [to_plan(job, e) for e in results]
    status = "optimal" if info.proved_optimal else "feasible"
    return PlanResponse(status=status, plans=plans, solver=info, explanation=None, warnings=warnings)


def _solver_status(proved_optimal: bool, cp_status: str, found: bool) -> str:
    """OPTIMAL only with a proof; FEASIBLE with plans but no proof (a split model stopped at its
    limit keeps CP-SAT's own status); UNKNOWN with neither (the infeasible answer overrides it)."""
    if proved_optimal:
        return "OPTIMAL"
    if not found:
        return "UNKNOWN"
    return cp_status if cp_status not in ("OPTIMAL", "INFEASIBLE") else "FEASIBLE"


def _final(ctx, job: JobSpec, spec: SearchSpec, ranked: list[Estimate], headroom: float | None) -> list[Estimate]:
    """The top-k of ``ranked`` in their simplest form (``ranking.simplest``), each layout once,
    one per family when ``search.diverse``."""
    zeros, rcs = _zero_choices(spec), _recompute_choices(job, spec)
    chosen = [simplest(ctx, job, e, zeros, rcs, headroom) for e in pick(ranked, spec.top_k + POOL_EXTRA, spec.diverse)]
    unique: dict[tuple, Estimate] = {}
    for est in chosen:
        unique.setdefault(layout_key(est.layout), est)
    return pick(sorted(unique.values(), key=_rank_key), spec.top_k, spec.diverse)


def bound_space(
    ctx, blocks: list[LayoutBlock], usable_bytes: float, deadline: float
) -> tuple[SpaceBounds | None, list[BeyondGroup]]:
    """``space_bounds`` of ``blocks`` but those of micro-batches beyond the default bound, which
    are left out when they provably fit in memory under no variant (``beyond.may_fit``) and
    otherwise grouped (``beyond.beyond_groups``) to be bounded when the costing reaches them."""
    inner = [b for b in blocks if not beyond_micro_batch(b)]
    outer = [b for b in blocks if beyond_micro_batch(b)]
    if not inner or not outer:
        return space_bounds(ctx, blocks, deadline), []
    bounds = space_bounds(ctx, inner, deadline)
    if bounds is None:
        return None, []
    return bounds, beyond_groups(ctx, may_fit(bounds, outer, usable_bytes))


def _expand_group(
    ctx, job: JobSpec, group: BeyondGroup, usable_bytes: float, kth: float, queue: list, seq: int, deadline: float
) -> int:
    """Bound ``group``'s blocks and queue their layouts (every depth) whose bound is at most
    ``kth`` and whose memory floor fits; returns the next sequence number. When ``deadline``
    passes while bounding, the group goes back to the queue at its bound, unexpanded (the search
    stops there, its bound the best remaining one)."""
    sb = space_bounds(ctx, group.blocks, deadline)
    if sb is None:
        heapq.heappush(queue, (group.bound, seq, group))
        return seq + 1
    for f in range(sb.num_families):
        if sb.memory_floor[f] > usable_bytes:
            continue
        fam = sb.family(f)
        if sb.first[f] <= kth:
            heapq.heappush(queue, (float(sb.first[f]), seq, fam.first))
            seq += 1
        fam = fam._replace(more_vpps=tuple(v for v in fam.more_vpps if sb.depth_bound(ctx, f, v) <= kth))
        for member in fam.expand(job):
            heapq.heappush(queue, (sb.member_bound(ctx, f, member), seq, member))
            seq += 1
    return seq


def _no_plan(info: SolverInfo, t0: float, status: str, solver_status: str, explanation: str) -> PlanResponse:
    """An answer without plans, decided before any layout was costed."""
    info.status = solver_status
    info.wall_time_s = time.perf_counter() - t0
    return PlanResponse(status=status, plans=[], solver=info, explanation=explanation)


def _least_memory(smallest: Unfit | None, unfit: Unfit) -> Unfit:
    """The one of the two needing less memory (the earlier, ``smallest``, on a tie)."""
    return unfit if smallest is None or unfit.peak_memory_bytes < smallest.peak_memory_bytes else smallest


def _unfit(ctx, lay: ResolvedLayout, headroom_bytes: float | None) -> Unfit:
    """The peak memory of a layout known not to fit (``screen_memory``, or the full estimate)."""
    screen = screen_memory(ctx, lay, headroom_bytes)
    if screen is not None:
        return Unfit(lay, screen.peak_memory_bytes)
    est = best_estimate(ctx, lay, headroom_bytes=headroom_bytes)
    return Unfit(lay, est.peak_memory_bytes, est)


def _outside_pool(ctx, lay: ResolvedLayout, screen: Screen, pool_best: BestTimes) -> bool:
    """True when a fitting layout provably ranks after ``pool_size`` layouts already costed.

    The pool's worst time only decreases as layouts are costed, so such a layout is outside the
    final pool (and the top-k) too; its full estimate cannot change the answer.
    """
    if not pool_best.full:
        return False
    return step_floor_exceeds(ctx, lay, screen.groups, pool_best.value + POOL_MARGIN_S)


def _no_layout_explanation(job: JobSpec, spec: SearchSpec) -> str:
    knob = empty_choice(job, spec)
    if knob is not None:
        return f"no valid layout: search.fix / search.allow leave no {knob} the search can use" + (
            " ('moe' recompute needs an MoE model)" if knob == "recompute" and job.model.moe is None else ""
        )
    pinned = fixed_combination_reason(job, spec)
    if pinned is not None:
        return f"no valid layout: {pinned}"
    t = job.training
    m = job.model
    return (
        f"no valid layout: with num_gpus={job.cluster.num_gpus}, global_batch_size={t.global_batch_size}, "
        f"num_attention_heads={m.num_attention_heads}, num_kv_heads={m.num_kv_heads}, num_layers={m.num_layers} "
        "no combination of tp/pp/cp/dp (and the search.fix / search.allow restrictions) divides evenly "
        "with micro-batches >= pp"
        + ("; training.attention_kernel 'unfused' allows only cp = 1" if t.attention_kernel == "unfused" else "")
    )


def _memory_explanation(best: Estimate | None) -> str:
    """Name the smallest per-GPU memory need over all layouts (all were costed) against capacity."""
    if best is None:
        return "no layout fits in memory"
    lay = best.layout
    cap = to_gib(best.usable_bytes)
    return (
        f"no layout fits in memory: the smallest per-GPU memory over all layouts is "
        f"{to_gib(best.peak_memory_bytes):.1f} GiB on stage {best.peak_stage} "
        f"(tp={lay.tp} pp={lay.pp} cp={lay.cp} ep={lay.ep} micro_batch_size={lay.micro_batch_size}, "
        f"ZeRO-{lay.zero_stage}, {lay.recompute} recompute); usable capacity "
        f"{cap:.1f} GiB ({to_gib(best.capacity_bytes):.1f} GiB minus {to_gib(best.headroom_bytes):.1f} GiB headroom)"
    )
