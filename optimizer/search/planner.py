"""The search's phases as the methods of one ``Planner`` (see ``optimizer.search`` for the method):
``enumerate`` the layout space, ``bound`` it, ``cost`` layouts in bound order (the main loop, its
queue and running best times as attributes), ``split`` (CP-SAT over layer splits) and ``finish``
(ranking, solver statistics, warnings and the explanation of an answer without plans)."""

from __future__ import annotations

import heapq
import math
import time

from optimizer.cost import Estimate, best_estimate, build_context
from optimizer.cost.rules import ResolvedLayout
from optimizer.framework_runs import running_frameworks
from optimizer.results import SolverInfo
from optimizer.search.beyond import BeyondGroup, smallest_bound
from optimizer.search.bounds import SpaceBounds
from optimizer.search.explain import memory_explanation, no_layout_explanation
from optimizer.search.framework_space import Targets, space_frameworks
from optimizer.search.ranking import BestTimes, family_key, pick
from optimizer.search.result import SearchResult, SearchStatus
from optimizer.search.screen import Unfit, screen_memory
from optimizer.search.space import (
    UNEVEN_DEPTHS_DEFAULT_MAX,
    LayoutBlock,
    Reach,
    SpaceBudget,
    SpaceTimedOut,
    count_layouts,
    layout_blocks,
)
from optimizer.search.split_floors import split_floor_at_vpp_s, split_floor_s
from optimizer.search.splits import POOL_MARGIN_S, SOLVE_WORK_LIMIT, SplitBudget, SplitOutcome, layout_key, solve_splits
from optimizer.search.steps import (
    POOL_EXTRA,
    bound_space,
    expand_group,
    final_top_k,
    least_memory,
    outside_pool,
    rank_key,
    solver_status,
    unfit_of,
)
from optimizer.specs import JobSpec, PlanRequest
from optimizer.units import GIB

_TIME_OUT_ADVICE = "raise the time limit or narrow search.fix / search.allow"


class Planner:
    """One search of ``request``: ``run`` calls the phases in order; each may also be called
    alone (``enumerate`` then ``bound`` then ``cost`` then ``split``) to look at its state."""

    def __init__(self, request: PlanRequest, space_memory_bytes: float) -> None:
        self.t0 = time.perf_counter()
        self.spec = spec = request.search
        self.job = request.job_spec()
        self.ctx = build_context(self.job)
        self.headroom = spec.memory_headroom_gib * GIB if spec.memory_headroom_gib is not None else None
        self.usable_bytes = self.ctx.usable_bytes(self.headroom)
        self.deadline = self.t0 + spec.time_limit_s
        self.budget_end = self.deadline - 0.2 * spec.time_limit_s  # keep a fifth of the time for CP-SAT
        self.space_memory_bytes = space_memory_bytes
        self.info = SolverInfo()
        self.blocks: list[LayoutBlock] = []
        self.bounds: SpaceBounds | None = None
        self.groups: list[BeyondGroup] = []  # micro-batch groups beyond the default bound
        self.pool_size = spec.top_k + POOL_EXTRA
        self.fitting: list[Estimate] = []
        self.n_fitting = 0  # includes fitting layouts screened out of the pool without a full estimate
        self.kth_best = BestTimes(spec.top_k, spec.diverse)  # the k best step times seen (per family when diverse)
        self.pool_best = BestTimes(self.pool_size, spec.diverse)
        self.pipelined: list[tuple[float, ResolvedLayout]] = []  # costed layouts with a layer split to choose
        self.smallest: Unfit | None = None  # the costed layout needing the least memory
        self.never_fit: list[tuple[int, int]] = []  # (family, 1 for its deeper layouts) passed over by the memory floor
        self.proved = True
        self.next_bound: float | None = None
        self.costed = 0
        self.warnings: list[str] = []
        # the bound-ordered queue (``bound``): the families' sorted entries and the heap
        self.static_bounds: list[float] = []
        self.static_seqs: list[int] = []
        self.pos = 0
        self.queue: list[tuple[float, int, ResolvedLayout | BeyondGroup]] = []  # expanded members, beyond groups
        self.seq = 0
        self.targets: Targets | None = None  # the frameworks searched for (``split``)
        self.split_outcome = SplitOutcome()

    def run(self) -> SearchResult:
        """Every phase in order: the top-k of the request, or why there is none."""
        early = self.enumerate() or self.bound()
        if early is not None:
            return early
        self.cost()
        return self.finish(self.split())

    # -- enumerate and bound -------------------------------------------------------------------

    def enumerate(self) -> SearchResult | None:
        """List the layout space in blocks; an answer without plans when it holds no layout or
        the time ran out listing it."""
        spec = self.spec
        try:
            budget = SpaceBudget(self.budget_end, self.space_memory_bytes)
            self.blocks = list(layout_blocks(self.job, spec, Reach.ALL, budget))
        except SpaceTimedOut as exc:
            self.info = SolverInfo(candidates_enumerated=exc.layouts)
            return self._no_plan("feasible", "UNKNOWN", (
                f"search.time_limit_s = {spec.time_limit_s} s ran out while enumerating the layouts of the space "
                f"({exc.layouts:,} so far), before any was costed: {_TIME_OUT_ADVICE}"
            ))  # fmt: skip
        self.info = SolverInfo(candidates_enumerated=count_layouts(self.blocks))
        if not self.blocks:
            budget = SpaceBudget(self.deadline, self.space_memory_bytes)  # to explain it
            return self._no_plan("infeasible", "INFEASIBLE", no_layout_explanation(self.job, spec, budget))
        return None

    def bound(self) -> SearchResult | None:
        """Bound every family of the space (``bound_space``) and seed the bound-ordered queue;
        an answer without plans when the time ran out bounding."""
        self.bounds, self.groups = bound_space(self.ctx, self.blocks, self.usable_bytes, self.budget_end)
        if self.bounds is None:
            return self._no_plan("feasible", "UNKNOWN", (
                f"search.time_limit_s = {self.spec.time_limit_s} s ran out while bounding the "
                f"{self.info.candidates_enumerated:,} layouts of the space, before any was costed: {_TIME_OUT_ADVICE}"
            ))  # fmt: skip
        # Bound-ordered queue of layouts and of families whose deeper interleavings are unresolved;
        # a family enters at the smallest of its deeper members' bounds, so popping in bound order
        # visits every layout in bound order. The families' entries are sorted once (``bounds``); the
        # members of families expanded on the way go to a heap, and the two are merged. Ties pop in
        # sequence order (enumeration order, then expanded members in the order they were expanded).
        self.static_bounds, self.static_seqs = self.bounds.queue_order()
        self.pos = 0
        self.queue = []
        self.seq = 2 * self.bounds.num_families
        for group in self.groups:  # bounded family by family only when the costing reaches them
            heapq.heappush(self.queue, (group.bound, self.seq, group))
            self.seq += 1
        return None

    def _no_plan(self, status: SearchStatus, solver: str, explanation: str) -> SearchResult:
        """An answer without plans, decided before any layout was costed."""
        self.info.status = solver
        self.info.wall_time_s = time.perf_counter() - self.t0
        return SearchResult(status=status, estimates=(), solver=self.info, job=self.job, explanation=explanation)

    # -- bound-ordered costing -------------------------------------------------------------------

    def cost(self) -> None:
        """Cost layouts in bound order until the next bound exceeds the k-th best time (or the
        time runs out): everything not costed provably cannot enter the top-k."""
        n_static = len(self.static_bounds)
        while self.pos < n_static or self.queue:
            queue = self.queue
            from_static = self.pos < n_static and (
                not queue or (self.static_bounds[self.pos], self.static_seqs[self.pos]) < (queue[0][0], queue[0][1])
            )
            bound = self.static_bounds[self.pos] if from_static else queue[0][0]
            if self._stops_at(bound):
                break
            lay = self._pop_static() if from_static else self._pop_queue()
            if lay is not None:
                self._cost_layout(bound, lay)
        self.info.candidates_fitting_memory = self.n_fitting

    def _stops_at(self, bound: float) -> bool:
        """True when the costing ends at ``bound``: nothing from here on can enter the top-k, or
        the time for costing ran out (then optimality is not proved)."""
        if self.kth_best.full and bound > self.kth_best.value:
            self.next_bound = bound
            return True
        if time.perf_counter() > self.budget_end:
            self.proved = False
            self.next_bound = bound
            return True
        return False

    def _pop_static(self) -> ResolvedLayout | None:
        """The next family entry of the sorted queue: its first layout to cost, or None when the
        family fits under no rank order or split, or when the entry stands for its deeper
        interleavings (which go to the heap, but those that cannot enter the top-k)."""
        bounds, kth_best = self.bounds, self.kth_best
        assert bounds is not None
        family, is_deeper = divmod(self.static_seqs[self.pos], 2)
        self.pos += 1
        if bounds.memory_floor[family] > self.usable_bytes:
            # fits in memory under no rank order or split (nor do its deeper layouts, which
            # share the floor and so never enter the heap), so it is no plan; an infeasible
            # job's explanation names the smallest memory need, so keep it until some fits
            if not self.n_fitting:
                self.never_fit.append((family, is_deeper))
            return None
        fam = bounds.family(family)
        if not is_deeper:
            return fam.first
        if kth_best.full:
            # the depths whose split floor (every rank order and split) is above the k-th
            # best time would be dropped when popped: leave them unresolved
            limit = kth_best.value + POOL_MARGIN_S
            # depths whose bound is above the k-th best time would never be popped either
            depths = tuple(
                v for v in fam.more_vpps
                if bounds.depth_bound(self.ctx, family, v) <= kth_best.value
                and split_floor_at_vpp_s(self.ctx, fam.first, v) <= limit
            )  # fmt: skip
            fam = fam._replace(more_vpps=depths)
        for member in fam.expand(self.job):
            heapq.heappush(self.queue, (bounds.member_bound(self.ctx, family, member), self.seq, member))
            self.seq += 1
        return None

    def _pop_queue(self) -> ResolvedLayout | None:
        """The next heap entry: a layout to cost, or None for a beyond-bound group (expanded)."""
        entry = heapq.heappop(self.queue)[2]
        if isinstance(entry, BeyondGroup):
            kth = self.kth_best.value if self.kth_best.full else math.inf
            self.seq = expand_group(
                self.ctx, self.job, entry, self.usable_bytes, kth, self.queue, self.seq, self.budget_end
            )
            return None
        return entry

    def _cost_layout(self, bound: float, lay: ResolvedLayout) -> None:
        """Cost ``lay`` (bound ``bound``) unless it provably cannot enter the top-k, and record it."""
        kth_best, ctx = self.kth_best, self.ctx
        if kth_best.beaten(lay, bound - POOL_MARGIN_S):
            return  # its family already has a faster plan (search.diverse): it cannot be a plan
        if lay.pp > 1 and kth_best.full and split_floor_s(ctx, lay) > kth_best.value + POOL_MARGIN_S:
            return  # no rank order and no layer split of it can enter the top-k
        self.costed += 1
        if lay.pp > 1:
            self.pipelined.append((bound, lay))
        screen = screen_memory(ctx, lay, self.headroom)
        if screen is not None and not screen.fits_memory:
            unfit = Unfit(lay, screen.peak_memory_bytes)
        elif screen is not None and outside_pool(ctx, lay, screen, self.pool_best):
            self.n_fitting += 1
            return
        else:
            est = best_estimate(ctx, lay, headroom_bytes=self.headroom)
            if est.fits_memory:
                self.n_fitting += 1
                self.fitting.append(est)
                kth_best.push(est.layout, est.step_time_s)
                self.pool_best.push(est.layout, est.step_time_s)
                return
            unfit = Unfit(lay, est.peak_memory_bytes, est)
        self.smallest = least_memory(self.smallest, unfit)

    # -- layer splits ----------------------------------------------------------------------------

    def split(self) -> list[Estimate]:
        """CP-SAT over the layer splits of the costed pipelined layouts that could enter the
        top-k; the top-k of the merged answers, each layout once at its best split, simplest."""
        spec, job = self.spec, self.job
        self.fitting.sort(key=rank_key)
        pool = pick(self.fitting, self.pool_size, spec.diverse)
        self.targets = targets = space_frameworks(job, spec)
        if targets.take_stage_counts:
            split_key = family_key if spec.diverse else layout_key
            budget = SplitBudget(spec.top_k, self.deadline, self.headroom, job.model.num_layers or 0, split_key)
            self.split_outcome = solve_splits(self.ctx, pool, self.pipelined, self.kth_best.value, budget)
        else:  # no target framework takes per-stage layer counts: the uniform split is the only one
            self.split_outcome = SplitOutcome()
        self.info.candidates_to_solver = self.split_outcome.models_solved
        # The pool's uniform-split estimates are exact float scores: merge them with the CP-SAT
        # answers (which may carry better splits) and keep each layout once, at its best split.
        best_by_layout: dict[tuple, Estimate] = {}
        for est in [*pool, *self.split_outcome.results]:
            if not est.fits_memory:
                continue
            key = layout_key(est.layout)
            if key not in best_by_layout or rank_key(est) < rank_key(best_by_layout[key]):
                best_by_layout[key] = est
        ranked = sorted(best_by_layout.values(), key=rank_key)
        return final_top_k(self.ctx, job, spec, ranked, self.headroom)

    # -- ranking and finishing -------------------------------------------------------------------

    def finish(self, results: list[Estimate]) -> SearchResult:
        """The answer: solver statistics and status, warnings, and the plans' estimates or why
        there are none."""
        info, split = self.info, self.split_outcome
        info.proved_optimal = self.proved and split.proved and split.status == "OPTIMAL" and bool(results)
        info.status = solver_status(info.proved_optimal, bool(results))
        next_bound = self.next_bound
        if split.open_floor is not None:  # the optimum may be an unsolved split with this floor or more
            next_bound = split.open_floor if next_bound is None else min(next_bound, split.open_floor)
            self.next_bound = next_bound
        if info.proved_optimal:
            info.objective_bound = results[0].step_time_s
        elif results:  # the optimum is the best costed plan or something with a bound >= next_bound
            info.objective_bound = min(results[0].step_time_s, next_bound if next_bound is not None else float("inf"))
        else:
            info.objective_bound = next_bound
        info.wall_time_s = time.perf_counter() - self.t0
        if split.open_floor is not None:
            self.warnings.append(
                f"not every layer split that could enter the top-k was solved exactly (time limit, a split model "
                f"stopped at its work limit ({SOLVE_WORK_LIMIT:g} deterministic units, about 1 s), a split table "
                f"too wide to tabulate, or a model with "
                f"several layer kinds whose per-mix table is too large); best remaining bound {split.open_floor:.3f} s"
            )
        if not self.proved:
            self.warnings.append(
                f"time limit reached after costing {self.costed} of {info.candidates_enumerated} layouts; best "
                f"remaining bound {next_bound:.3f} s"
            )
        if not results:
            return self._none_fits()
        self._plan_warnings(results[0])
        status: SearchStatus = "optimal" if info.proved_optimal else "feasible"
        return SearchResult(status, tuple(results), info, self.job, tuple(self.warnings))

    def _none_fits(self) -> SearchResult:
        """No layout fits in memory: not proved when the time ran out, else the answer names the
        smallest memory need (costing the layouts passed over by their floor as needed)."""
        info = self.info
        if not self.proved:
            return SearchResult("feasible", (), info, self.job, tuple(self.warnings), (
                f"no layout that fits in memory was found within search.time_limit_s = {self.spec.time_limit_s} s "
                f"({self.costed} of {info.candidates_enumerated} layouts costed); infeasibility is not proved: "
                f"{_TIME_OUT_ADVICE}"
            ))  # fmt: skip
        info.status = "INFEASIBLE"
        bounds = self.bounds
        assert bounds is not None
        # every layout was costed or passed over: cost those passed over by ascending memory floor
        # while the floor is not above the smallest need found
        self.never_fit.sort(key=lambda entry: bounds.memory_floor[entry[0]])
        for family, is_deeper in self.never_fit:
            smallest = self.smallest
            if smallest is not None and bounds.memory_floor[family] > smallest.peak_memory_bytes:
                break
            if smallest is not None and time.perf_counter() > self.deadline:
                self.warnings.append(
                    "the time limit ran out while looking for the layout needing the least memory: "
                    "the explanation names the least found"
                )
                break
            fam = bounds.family(family)
            for member in fam.expand(self.job) if is_deeper else [fam.first]:
                self.smallest = least_memory(self.smallest, unfit_of(self.ctx, member, self.headroom))
        least = self.smallest.resolve(self.ctx, self.headroom) if self.smallest else None
        return SearchResult("infeasible", (), info, self.job, tuple(self.warnings), memory_explanation(least, self.job))

    def _plan_warnings(self, best: Estimate) -> None:
        """Warn about parts of the space left out that may hold a faster plan than ``best``, and
        about a job no framework's stack runs; note beyond-default layouts bounded below it."""
        bounds, info, job = self.bounds, self.info, self.job
        assert bounds is not None
        skipped_bound = bounds.left_out_bound(self.ctx, best.step_time_s)
        if skipped_bound < best.step_time_s:
            info.left_out_depths_bound_s = skipped_bound
            left_out = bounds.left_out_count()
            self.warnings.append(
                f"interleaving depths with unequal chunks (pp * vpp not dividing num_layers = {job.model.num_layers}) "
                f"were not searched: for a model whose dense and MoE layers alternate they would add {left_out:,} "
                f"layouts, more than the default space takes ({UNEVEN_DEPTHS_DEFAULT_MAX:,}); their layouts' lower "
                f"bound is {skipped_bound:.3f} s, below the best plan's {best.step_time_s:.3f} s, so one of them may "
                "be faster (the bound is loose: often none is): name the depths in search.allow.vpp (1-8) to search "
                "them too (slower; docs/search.md)"
            )
        if self.targets is not None and not self.targets.stack_matched:
            self.warnings.append(stack_warning(job, best))
        beyond_bound = bounds.beyond_bound(self.usable_bytes)
        above = min(beyond_bound, best.step_time_s)
        beyond_bound = min(beyond_bound, smallest_bound(self.ctx, self.groups, self.usable_bytes, above, self.deadline))
        if beyond_bound < best.step_time_s:  # searched in bound order with the rest: say so
            info.beyond_default_bounds_s = beyond_bound


def stack_warning(job: JobSpec, best: Estimate) -> str:
    """The warning for a job whose training.* knobs no framework's stack runs at every layout size:
    what the plans follow, and whether the best plan still runs somewhere (the TP knobs act only
    with tp above 1, pp_comm_overlap only with pp above 1)."""
    rules = job.training.framework or "every framework"
    tp_tier = best.placement.get("tp")
    runs = [
        p.id
        for p in running_frameworks(job.training, best.layout, job.model, best.order, tp_tier, job.gpu_generation)[0]
    ]
    if runs:
        return (
            f"no framework's stack runs the job's model and training.* knobs at every layout size (docs/frameworks.md: each "
            f"profile's [stack]): the best plan runs on {', '.join(runs)}; a plan lists only a framework whose stack "
            "runs the knobs at the plan's sizes, and one that lists none says why in its notes"
        )
    return (
        "no framework's stack runs the job's model and training.* knobs (docs/frameworks.md: each profile's [stack]; "
        f"the plans' notes name the knob); the plans follow the layout rules of {rules}; a plan lists only a "
        "framework whose stack runs the knobs at the plan's sizes (the TP knobs act only with tp above 1, "
        "pp_comm_overlap only with pp above 1)"
    )
