"""The node sets a topology plan compares share the request's ``search.time_limit_s``: each
search gets what is left, and the sets not reached are left out with a warning, not planned
past the limit."""

from __future__ import annotations

import time

from optimizer import service
from optimizer.placement.plan import node_set_options, plan_on_topology
from optimizer.results import PlanResponse
from optimizer.specs import PlanRequest
from tests.placement.test_topology_placement import blocks_racks, job

SEARCH_S = 0.2


def _request(limit_s: float) -> PlanRequest:
    raw = job(blocks_racks(2, 3, 4, busy={"gpu000", "gpu005", "gpu013"}), None)
    raw["search"]["time_limit_s"] = limit_s
    return PlanRequest.model_validate(raw)


def _slow_search(limits: list[float]):
    def search(sub: PlanRequest) -> PlanResponse:
        limits.append(sub.search.time_limit_s)
        time.sleep(SEARCH_S)
        return service.search_plans(sub)

    return search


def test_node_sets_share_the_time_limit() -> None:
    request = _request(0.5)
    total = len(node_set_options(request.cluster))
    assert total > 3  # without num_gpus every whole-node count is compared
    limits: list[float] = []
    start = time.perf_counter()
    answer = plan_on_topology(request, _slow_search(limits))
    assert time.perf_counter() - start < 0.5 + 2 * SEARCH_S + 1.0
    assert 1 <= len(limits) < total
    assert all(b < a for a, b in zip(limits, limits[1:], strict=False))  # each gets what is left
    assert answer.status == "feasible" and not answer.solver.proved_optimal and answer.plans
    # the node sets of counts not reached are not even selected (on large topologies that takes a while)
    assert f"ran out after {len(limits)} of " in answer.warnings[-1]
    assert "larger GPU counts; the others were not planned" in answer.warnings[-1]


def test_a_limit_that_covers_every_set_changes_nothing() -> None:
    request = _request(60.0)
    limits: list[float] = []
    answer = plan_on_topology(request, _slow_search(limits))
    assert len(limits) == len(node_set_options(request.cluster)) and all(v <= 60.0 for v in limits)
    assert not any("ran out" in w for w in answer.warnings)
    assert answer.status == "optimal"


def _unfinished(sub: PlanRequest) -> PlanResponse:
    """A search the time limit cut short before any plan: no plans, nothing proved."""
    response = service.search_plans(sub)
    solver = response.solver.model_copy(update={"proved_optimal": False})
    return response.model_copy(update={"plans": [], "status": "feasible", "solver": solver})


def test_a_node_set_whose_search_was_cut_short_settles_nothing() -> None:
    request = _request(60.0)
    calls: list[int] = []

    def search(sub: PlanRequest) -> PlanResponse:
        calls.append(1)
        return _unfinished(sub) if len(calls) == 1 else service.search_plans(sub)

    answer = plan_on_topology(request, search)
    assert answer.plans and answer.status == "feasible" and not answer.solver.proved_optimal
    assert "1 node sets' searches ended before they finished" in answer.warnings[-1]


def test_node_sets_whose_searches_ended_unfinished_prove_nothing() -> None:
    """Every node set's search cut short before a plan: not "infeasible" (nothing was proved, and
    the free nodes may well fit the job) but a time-out answer saying so."""
    raw = job(blocks_racks(1, 1, 2, busy={"gpu000"}), None)
    raw["model"] = {"preset": "llama3.1-405b"}
    answer = plan_on_topology(PlanRequest.model_validate(raw), _unfinished)
    assert answer.status == "feasible" and not answer.plans and answer.solver.status == "UNKNOWN"
    assert answer.explanation.startswith("no node set's search found a plan within search.time_limit_s (20 s)")
    assert "node sets' searches ended before they finished" in answer.warnings[-1]


def test_a_smallest_fitting_count_not_found_in_time_is_said() -> None:
    """The node sets are settled (no layout fits on them, proved), the search for the smallest
    count that would fit is cut short: infeasible, without the count, and a warning says why."""
    raw = job(blocks_racks(1, 1, 2, busy={"gpu000"}), None)
    raw["model"] = {"preset": "llama3.1-405b"}  # fits on no single free node
    calls: list[int] = []

    def search(sub: PlanRequest) -> PlanResponse:
        calls.append(1)
        return service.search_plans(sub) if sub.cluster.topology is not None else _unfinished(sub)

    answer = plan_on_topology(PlanRequest.model_validate(raw), search)
    assert answer.status == "infeasible" and answer.smallest_fitting_gpus is None
    assert answer.solver.status == "INFEASIBLE"  # proved on these nodes; only the count is unknown
    assert "the smallest GPU count with a fitting layout was not found in time" in answer.warnings[-1]
    # and the explanation claims nothing about the counts never searched
    assert answer.explanation.endswith("the smallest GPU count a layout fits on was not found within the time limit")
    assert "no layout fits on up to" not in answer.explanation


def test_a_large_topology_keeps_to_the_time_limit() -> None:
    """4,096 free nodes and no num_gpus: choosing each count's node sets takes a while, so the
    counts the deadline leaves are not even selected (before, every count's sets were selected
    first, several seconds past any limit)."""
    nodes = [{"name": f"n{i:04d}", "labels": {"b": str(i % 4), "r": f"{i % 64}"}, "free_gpus": 8} for i in range(4096)]
    request = PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 16384},
        "cluster": {"preset": "dgx-h100", "topology": {"levels": ["b", "r"], "nodes": nodes}},
        "search": {"time_limit_s": 0.5},
    })  # fmt: skip
    start = time.perf_counter()
    answer = plan_on_topology(request, service.search_plans)
    assert time.perf_counter() - start < 0.5 + 2.0  # the limit and the documented grace
    assert answer.status != "infeasible" and not answer.solver.proved_optimal
    assert "larger GPU counts; the others were not planned" in answer.warnings[-1]


def test_the_domain_tree_is_built_once_per_node_size(monkeypatch) -> None:
    from optimizer.placement import plan as placement_plan

    calls: list[int] = []
    real = placement_plan.domain_tree

    def counted(topo, g):
        calls.append(g)
        return real(topo, g)

    monkeypatch.setattr(placement_plan, "domain_tree", counted)
    request = _request(60.0)
    counts = list(placement_plan.options_by_count(request.cluster))
    assert len(counts) > 3 and calls == [8]


def test_selection_past_its_deadline_keeps_the_loosest_set_and_the_first_search_runs() -> None:
    """On large topologies choosing the node sets can take the whole limit: past the deadline each
    count keeps its loosest set, and the first set is still searched (``FIRST_SET_MIN_S``)."""
    raw = job(blocks_racks(2, 3, 4, busy={"gpu000", "gpu005", "gpu013"}), 48)
    request = PlanRequest.model_validate(raw)
    unbounded = node_set_options(request.cluster)
    past = node_set_options(request.cluster, deadline=time.perf_counter() - 1.0)
    assert 1 <= len(past) < len(unbounded)
    names = [{tuple(n.name for n in o.choice.nodes) for o in opts} for opts in (past, unbounded)]
    assert names[0] <= names[1]
    limits: list[float] = []
    tiny = request.model_copy(update={"search": request.search.model_copy(update={"time_limit_s": 1e-6})})
    answer = plan_on_topology(tiny, _slow_search(limits))
    assert len(limits) == 1  # searched, though the limit had passed before it
    # the choice of node sets was cut too: no optimality claim, and the warning says so
    assert answer.status != "optimal" and not answer.solver.proved_optimal
    assert any("choosing candidate node sets stopped at the limit" in w for w in answer.warnings)
