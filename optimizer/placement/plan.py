"""Plans on the free nodes of ``cluster.topology``: choose the nodes, then the layout.

For each GPU count (the one asked, or with ``num_gpus`` omitted, powers of two up to all free
nodes), the candidate node sets (``select.candidate_sets``) are each planned by the unchanged search
on the tiers they give (``node_tiers``). The best plan by ``search.objective`` wins (``throughput``:
tokens/s per GPU; the others: the capacity model's ``objective_value`` per delivered token, so that
``time_to_train`` takes the fastest count, ``cost`` and ``energy`` the cheapest per token), ties
going to fewer nodes, then the most compact set (fewest NVLink domains, then fewest domains of each
coarser level).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from optimizer.capacity.annotate import objective_value, resolve_inputs
from optimizer.errors import InvalidLayout
from optimizer.job_warnings import shared_nodes_warning
from optimizer.placement.outputs import build_assignment
from optimizer.placement.select import Choice, Domain, candidate_sets, domain_tree, node_shares, rank_order
from optimizer.results import Plan, PlanResponse, SolverInfo
from optimizer.specs import ClusterSpec, EvaluateRequest, PlanRequest
from optimizer.topology_spec import ClusterTopology, NodeAssignment, TopologyNode

MAX_DOMAINS_LISTED = 64


@dataclass(frozen=True)
class Option:
    gpus_per_node: int
    choice: Choice


@dataclass
class Outcome:
    option: Option
    request: PlanRequest
    """The request planned: the job on this option's nodes."""
    response: PlanResponse


def gpus_per_node_for(topo: ClusterTopology, gpn: int, num_gpus: int) -> int | None:
    """GPUs per node for a job of ``num_gpus``: the largest divisor of the node size that divides
    the job and leaves enough nodes with that many free (None: none does)."""
    for g in node_shares(gpn):
        if num_gpus % g == 0 and sum(1 for n in topo.nodes if n.free_gpus >= g) >= num_gpus // g:
            return g
    return None


def job_counts(c: ClusterSpec) -> list[tuple[int, int]]:
    """(GPUs per node, nodes) pairs to plan: the asked count, or powers of two up to all free nodes
    (whole nodes; where no node is wholly free, the largest share of a node, a divisor of its
    size, that some nodes have free)."""
    topo = c.topology
    assert topo is not None and c.gpus_per_node
    if c.num_gpus is not None:
        g = gpus_per_node_for(topo, c.gpus_per_node, c.num_gpus)
        return [] if g is None else [(g, c.num_gpus // g)]
    g, full = c.gpus_per_node, 0
    for g in node_shares(c.gpus_per_node):
        full = sum(1 for n in topo.nodes if n.free_gpus >= g)
        if full:
            break
    counts = sorted({1 << k for k in range(full.bit_length()) if 1 << k <= full} | ({full} if full else set()))
    return [(g, n) for n in counts]


def on_nodes(c: ClusterSpec, nodes: list[TopologyNode], g: int) -> ClusterSpec:
    """The cluster restricted to ``nodes`` (rank order), assigned: what the cost model scores."""
    topo = c.topology
    assert topo is not None
    placed = topo.model_copy(
        update={"nodes": list(nodes), "assignment": NodeAssignment(nodes=[n.name for n in nodes], gpus_per_node=g)}
    )
    return c.model_copy(update={"topology": placed, "num_gpus": len(nodes) * g})


FIRST_SET_MIN_S = 1.0
"""The first node set's search gets at least this long, even past the request's time limit (on a
large topology, choosing the sets can take the whole limit)."""
EVALUATE_SELECTION_S = 10.0
"""/evaluate on a topology without an assignment: time for choosing its candidate node sets (then
the loosest set of each GPU count and those found so far)."""


def node_set_options(c: ClusterSpec, deadline: float | None = None) -> list[Option]:
    """Every candidate node set of the job's GPU counts (``options_by_count``, all of them)."""
    return [opt for count in options_by_count(c, deadline) for opt in count]


def options_by_count(c: ClusterSpec, deadline: float | None = None) -> Iterator[list[Option]]:
    """The candidate node sets of each GPU count in turn (one set for an assignment), computed as
    they are asked for: on a large topology each count's selection takes a while, so a caller
    with a deadline stops asking, and past ``deadline`` each count's selection stops at the sets
    found so far and its loosest (``candidate_sets``)."""
    topo = c.topology
    assert topo is not None
    if topo.assignment is not None:
        by_name = {n.name: n for n in topo.nodes}
        g = topo.assignment.gpus_per_node or c.gpus_per_node
        nodes = [by_name[x] for x in topo.assignment.nodes]
        yield [Option(g, Choice(tuple(nodes), ()))]  # type: ignore[arg-type]
        return
    trees: dict[int, Domain] = {}
    for g, n in job_counts(c):
        tree = trees.get(g)
        if tree is None:
            tree = trees[g] = domain_tree(topo, g)
        yield [Option(g, ch) for ch in candidate_sets(topo, g, n, tree, deadline)]


def objective_score(out: Outcome) -> float:
    """What the request's ``search.objective`` minimises for the outcome's best plan (compared
    across GPU counts, so ``throughput`` is per GPU), to ``SCORE_DIGITS`` significant digits: node
    sets within that of each other are ties, which go to the most compact (a 0.0003% faster step
    is no reason to spread a job over more switches)."""
    best = out.response.plans[0]
    objective = out.request.search.objective
    if objective == "throughput":
        return float(f"{-best.tokens_per_s_per_gpu:.{SCORE_DIGITS}g}")
    return float(f"{objective_value(objective, resolve_inputs(out.request), best):.{SCORE_DIGITS}g}")


SCORE_DIGITS = 5
"""Significant digits node sets are compared in: far finer than the cost model's accuracy."""


def _key(out: Outcome) -> tuple:
    return (objective_score(out), len(out.option.choice.nodes), out.option.choice.compactness)


def within(request: PlanRequest, deadline: float) -> PlanRequest | None:
    """``request`` with its search time limit cut to what is left before ``deadline`` (a
    ``time.perf_counter`` value); None when nothing is left."""
    left = deadline - time.perf_counter()
    if left <= 0:
        return None
    limit = min(request.search.time_limit_s, left)
    return request.model_copy(update={"search": request.search.model_copy(update={"time_limit_s": limit})})


def plan_on_topology(request: PlanRequest, search: Callable[[PlanRequest], PlanResponse]) -> PlanResponse:
    """Plan ``request`` on its topology's free nodes (``search`` plans one node set). The node
    sets share the request's ``search.time_limit_s``: each search gets what is left, and sets
    not reached in time are left out of the answer (not proved optimal; a warning says so)."""
    t0 = time.perf_counter()
    deadline = t0 + request.search.time_limit_s
    c = request.cluster
    outcomes, cut = _search_node_sets(request, search, deadline)
    found = [o for o in outcomes if o.response.plans]
    if not found and (cut.reached < cut.total or cut.counts_left or cut.unsettled):
        return _timed_out(request, cut, time.perf_counter() - t0)
    if not found:
        smallest, complete = smallest_fitting(request, search, deadline)
        answer = _infeasible(c, outcomes, smallest, complete, time.perf_counter() - t0)
        return _cut_short(answer, cut._replace(smallest_cut=not complete))
    best = min(found, key=_key)
    return _cut_short(_answer(c, best, outcomes, time.perf_counter() - t0), cut)


def _search_node_sets(
    request: PlanRequest, search: Callable[[PlanRequest], PlanResponse], deadline: float
) -> tuple[list[Outcome], Cut]:
    """Each candidate node set planned in turn with what is left of the time limit; the node sets
    of GPU counts the deadline leaves unreached are not computed (``Cut.counts_left``)."""
    c, total = request.cluster, 0
    outcomes: list[Outcome] = []
    counts = 1 if c.topology is not None and c.topology.assignment is not None else len(job_counts(c))
    done = 0
    selection_cut = False
    for options in options_by_count(c, deadline):
        selection_cut = selection_cut or time.perf_counter() >= deadline  # chosen past it: maybe cut
        done += 1
        total += len(options)
        for opt in options:
            # the first node set is searched even when choosing the sets used up the time limit
            first = time.perf_counter() + FIRST_SET_MIN_S if not outcomes else deadline
            sub = within(
                request.model_copy(update={"cluster": on_nodes(c, list(opt.choice.nodes), opt.gpus_per_node)}),
                max(deadline, first),
            )
            if sub is None:
                break
            outcomes.append(Outcome(opt, sub, search(sub)))
        if time.perf_counter() >= deadline:
            break
    unsettled = sum(not settled(o.response) for o in outcomes)
    cut = Cut(request.search.time_limit_s, len(outcomes), total, unsettled, False, counts - done, selection_cut)
    return outcomes, cut


def settled(response: PlanResponse) -> bool:
    """Whether one node set's search finished: its best plan proved optimal, or no layout fits
    (proved). A search the time limit cut short with no plan settles nothing."""
    return response.solver.proved_optimal or response.status == "infeasible"


class Cut(NamedTuple):
    """How far a topology plan got within its time limit."""

    limit_s: float
    reached: int
    total: int
    unsettled: int
    smallest_cut: bool
    counts_left: int = 0
    """GPU counts whose node sets were not computed before the deadline."""
    selection_cut: bool = False
    """The deadline stopped choosing some count's node sets (its less compact sets were not tried)."""


def _cut_short(response: PlanResponse, cut: Cut) -> PlanResponse:
    """``response`` with a warning and no optimality claim when the time limit left node sets
    unsearched or unsettled, or cut the search for the smallest fitting count short."""
    said = []
    if cut.reached < cut.total or cut.counts_left:
        more = f" and the node sets of {cut.counts_left} larger GPU counts" if cut.counts_left else ""
        said.append(
            f"it ran out after {cut.reached} of {cut.total} candidate node sets{more}; the others were not planned"
        )
    if cut.unsettled:
        said.append(f"{cut.unsettled} node sets' searches ended before they finished")
    if cut.smallest_cut:
        said.append("the smallest GPU count with a fitting layout was not found in time")
    if cut.selection_cut:
        said.append("choosing candidate node sets stopped at the limit, so some were not considered")
    if not said:
        return response
    warning = f"search.time_limit_s ({cut.limit_s:g} s): " + "; ".join(said)
    # no proof either way, unless no layout fits on these nodes (proved; only a count was not found)
    solver_status = "FEASIBLE" if response.plans else "INFEASIBLE" if response.status == "infeasible" else "UNKNOWN"
    solver = response.solver.model_copy(update={"proved_optimal": False, "status": solver_status})
    status = "feasible" if response.plans else response.status
    return response.model_copy(update={"solver": solver, "status": status, "warnings": [*response.warnings, warning]})


def _timed_out(request: PlanRequest, cut: Cut, wall_s: float) -> PlanResponse:
    """No node set's search found a plan before the time limit, and some were not searched or not
    finished: nothing is proved either way (``feasible``, ``UNKNOWN``), and the answer says so."""
    answer = PlanResponse(
        status="feasible",
        plans=[],
        solver=SolverInfo(status="UNKNOWN", wall_time_s=wall_s),
        explanation=(
            f"no node set's search found a plan within search.time_limit_s ({cut.limit_s:g} s): {cut.reached} "
            f"node sets searched, {cut.unsettled} of them unfinished; nothing is proved either way: raise the "
            "limit" + (", or give cluster.num_gpus" if request.cluster.num_gpus is None else "")
        ),
        free_gpus_by_level=free_by_level(request.cluster),
    )
    return _cut_short(answer, cut)


def _answer(c: ClusterSpec, best: Outcome, outcomes: list[Outcome], wall_s: float) -> PlanResponse:
    topo = c.topology
    assert topo is not None
    nodes, g = list(best.option.choice.nodes), best.option.gpus_per_node
    plans = [
        p.model_copy(update={"assignment": build_assignment(topo, nodes, g, p.placement, len(outcomes))})
        for p in best.response.plans
    ]
    solver = best.response.solver.model_copy(
        update={
            "wall_time_s": wall_s,
            "proved_optimal": all(settled(o.response) for o in outcomes) and best.response.solver.proved_optimal,
        }
    )
    status = "optimal" if solver.proved_optimal else "feasible"
    shared = shared_nodes_warning(g, c.gpus_per_node or g, len(nodes))
    warnings = [*best.response.warnings, *([shared] if shared else [])]
    return best.response.model_copy(update={"plans": plans, "solver": solver, "status": status, "warnings": warnings})


def free_by_level(c: ClusterSpec) -> dict[str, dict[str, int]]:
    """Free GPUs per domain of each switch level (largest first, at most ``MAX_DOMAINS_LISTED``)."""
    topo = c.topology
    assert topo is not None
    out = {}
    for depth, level in enumerate(topo.switch_levels()):
        free: dict[str, int] = {}
        for n in topo.nodes:
            key = "/".join(topo.path(n)[: depth + 1])
            free[key] = free.get(key, 0) + n.free_gpus
        top = sorted(free.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_DOMAINS_LISTED]
        out[level] = dict(top)
    return out


def smallest_fitting(
    request: PlanRequest, search: Callable[[PlanRequest], PlanResponse], deadline: float
) -> tuple[Plan | None, bool]:
    """The best plan at the smallest count of whole nodes (1, 2, 4, ... up to every node of the
    topology, busy or not) with a layout that fits, on an empty cluster of the same node type
    and network (the preset's tiers), or None; and whether that answer is complete (False when
    ``deadline`` passed first or a smaller count's search ended unfinished)."""
    c = request.cluster
    assert c.topology is not None and c.gpus_per_node
    limit = len(c.topology.nodes)
    nodes, complete = 1, True
    while nodes <= limit:
        sub = within(
            request.model_copy(
                update={"cluster": c.model_copy(update={"topology": None, "num_gpus": nodes * c.gpus_per_node})}
            ),
            deadline,
        )
        if sub is None:
            return None, False
        resp = search(sub)
        if resp.plans:
            return resp.plans[0], complete
        complete = complete and settled(resp)
        nodes *= 2
    return None, complete


def _infeasible(
    c: ClusterSpec, outcomes: list[Outcome], smallest: Plan | None, complete: bool, wall_s: float
) -> PlanResponse:
    topo = c.topology
    assert topo is not None and c.gpus_per_node
    free = sum(n.free_gpus for n in topo.nodes)
    with_free = sum(1 for n in topo.nodes if n.free_gpus > 0)
    full = sum(1 for n in topo.nodes if n.free_gpus >= c.gpus_per_node)
    by_level = free_by_level(c)
    coarse = topo.switch_levels()[0]
    biggest = max(by_level[coarse].values(), default=0)
    have = (
        f"{free} GPUs free on {with_free} of {len(topo.nodes)} nodes ({full} nodes wholly free; at most {biggest} "
        f"in one {coarse} domain)"
    )
    if outcomes:
        last = outcomes[-1]  # the largest count tried (counts ascend)
        n = len(last.option.choice.nodes) * last.option.gpus_per_node
        tried = sorted({len(o.option.choice.nodes) * o.option.gpus_per_node for o in outcomes})
        counts = f" (tried {', '.join(str(x) for x in tried)} GPUs)" if len(tried) > 1 else ""
        why = f"no layout fits on {n} GPUs of the free nodes{counts}: {last.response.explanation}"
    elif c.num_gpus is not None and c.num_gpus > free:
        why = f"asked for {c.num_gpus} GPUs; only {free} are free"
    elif c.num_gpus is not None:
        why = (
            f"asked for {c.num_gpus} GPUs; no node size dividing {c.gpus_per_node} that divides {c.num_gpus} "
            "has enough nodes with that many free"
        )
    else:
        why = "no node has all its GPUs free"
    if smallest is not None:
        lay, n = (
            smallest.config,
            smallest.config.tp * smallest.config.pp * smallest.config.cp * (smallest.config.dp or 1),
        )
        need = (
            f"; the smallest fitting layout needs {n} GPUs ({n // c.gpus_per_node} whole nodes; on an empty cluster: "
            f"tp={lay.tp} pp={lay.pp} cp={lay.cp} dp={lay.dp} ep={lay.ep}, {smallest.step_time_s:.3f} s a step)"
        )
    elif complete:
        need = f"; no layout fits on up to {len(topo.nodes) * c.gpus_per_node} GPUs of this node type"
    else:
        need = "; the smallest GPU count a layout fits on was not found within the time limit"
    solver = SolverInfo(status="INFEASIBLE", wall_time_s=wall_s)
    return PlanResponse(
        status="infeasible",
        plans=[],
        solver=solver,
        explanation=f"{why}; {have}{need}",
        free_gpus_by_level=by_level,
        smallest_fitting_gpus=n if smallest is not None else None,
    )


def evaluate_on_topology(request: EvaluateRequest, score: Callable[[EvaluateRequest], Plan]) -> Plan:
    """Score the layout on the assigned nodes, or with no assignment on the candidate node set of
    ``num_gpus`` (or the layout's size) that scores fastest; the plan carries its assignment."""
    c = request.cluster
    topo = c.topology
    assert topo is not None and c.gpus_per_node
    if c.num_gpus is None and topo.assignment is None:
        lay = request.config
        size = lay.stated_gpus
        if size == 0:
            raise InvalidLayout("cluster.num_gpus", "give num_gpus, config.dp or topology.assignment")
        c = c.model_copy(update={"num_gpus": size})
    options = node_set_options(c, time.perf_counter() + EVALUATE_SELECTION_S)
    if not options:
        raise InvalidLayout("cluster.num_gpus", f"{c.num_gpus} GPUs do not fit on the free nodes: {free_by_level(c)}")
    scored = []
    for opt in options:
        nodes = list(opt.choice.nodes) if topo.assignment is not None else rank_order(topo, list(opt.choice.nodes))
        plan = score(request.model_copy(update={"cluster": on_nodes(c, nodes, opt.gpus_per_node)}))
        scored.append((round(plan.step_time_s, 9), opt.choice.compactness, plan, nodes, opt.gpus_per_node))
    _, _, plan, nodes, g = min(scored, key=lambda s: (s[0], s[1]))
    shared = shared_nodes_warning(g, c.gpus_per_node or g, len(nodes))
    notes = [*plan.notes, *([shared] if shared else [])]
    return plan.model_copy(
        update={"assignment": build_assignment(topo, nodes, g, plan.placement, len(scored)), "notes": notes}
    )
