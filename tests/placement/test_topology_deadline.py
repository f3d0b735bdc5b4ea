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
    assert f"ran out after {len(limits)} of {total} candidate node sets" in answer.warnings[-1]


def test_a_limit_that_covers_every_set_changes_nothing() -> None:
    request = _request(60.0)
    limits: list[float] = []
    answer = plan_on_topology(request, _slow_search(limits))
    assert len(limits) == len(node_set_options(request.cluster)) and all(v <= 60.0 for v in limits)
    assert not any("ran out" in w for w in answer.warnings)
    assert answer.status == "optimal"
