"""The search's phases alone (``optimizer.search.planner.Planner``) agree with the whole search."""

from __future__ import annotations

import re

import pytest

from optimizer.search import Planner, search
from optimizer.search.runtime import DEFAULT_SPACE_MEMORY_BYTES
from optimizer.search.space import Reach, enumerate_layouts
from optimizer.search.steps import final_top_k, rank_key
from optimizer.specs import JobSpec, PlanRequest

SMALL = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "search": {"top_k": 3, "time_limit_s": 30.0},
}
SMALL_UNPIPELINED = {**SMALL, "search": {**SMALL["search"], "fix": {"pp": 1}}}
HUGE_FOR_ONE_NODE = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 4096, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
}


def _planner(job: dict) -> Planner:
    return Planner(PlanRequest.model_validate(job), DEFAULT_SPACE_MEMORY_BYTES)


def _costed(job: dict) -> Planner:
    planner = _planner(job)
    assert planner.enumerate() is None
    assert planner.bound() is None
    planner.cost()
    return planner


def test_enumerate_counts_every_layout_of_the_space() -> None:
    planner = _planner(SMALL)
    assert planner.enumerate() is None
    request = PlanRequest.model_validate(SMALL)
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    every = sum(1 for _ in enumerate_layouts(job, request.search, Reach.ALL))
    assert every > 100
    assert planner.info.candidates_enumerated == every


def test_costing_alone_finds_the_searchs_top_k_when_nothing_is_pipelined() -> None:
    """Without pipelining there is no layer split to choose: the costing phase's estimates,
    ranked (each layout once, simplest), are the whole search's plans; its k-th best time over
    every variant costed is at most the k-th plan's."""
    planner = _costed(SMALL_UNPIPELINED)
    assert planner.proved and not planner.pipelined
    ranked = sorted(planner.fitting, key=rank_key)
    best = final_top_k(planner.ctx, planner.job, planner.spec, ranked, planner.headroom)
    whole = search(PlanRequest.model_validate(SMALL_UNPIPELINED))
    assert whole.status == "optimal" and len(whole.estimates) == 3
    assert [e.step_time_s for e in best] == pytest.approx([e.step_time_s for e in whole.estimates], rel=1e-9)
    assert [e.layout for e in best] == [e.layout for e in whole.estimates]
    assert planner.kth_best.value <= whole.estimates[-1].step_time_s
    # the costing stopped at a bound above the k-th best, or ran out of layouts
    assert planner.next_bound is None or planner.next_bound > planner.kth_best.value


def test_costing_passes_over_most_of_the_space() -> None:
    planner = _costed(SMALL)
    assert 0 < planner.costed < planner.info.candidates_enumerated
    assert planner.info.candidates_fitting_memory == planner.n_fitting >= 3


def test_split_phase_never_ranks_worse_than_the_uniform_splits() -> None:
    """CP-SAT's layer splits join the uniform-split pool: the split phase's best is at most the
    costing's best uniform-split time, and ``finish`` returns exactly its ranking."""
    planner = _costed(SMALL)
    ranked = planner.split()
    uniform_best = min(e.step_time_s for e in planner.fitting)
    assert ranked and ranked[0].step_time_s <= uniform_best * (1 + 1e-9)
    result = planner.finish(ranked)
    whole = search(PlanRequest.model_validate(SMALL))
    assert [e.step_time_s for e in result.estimates] == pytest.approx(
        [e.step_time_s for e in whole.estimates], rel=1e-9
    )
    assert result.solver.status == whole.solver.status


def test_a_job_that_fits_nowhere_is_an_answer_naming_the_smallest_need() -> None:
    result = search(PlanRequest.model_validate(HUGE_FOR_ONE_NODE))
    assert result.status == "infeasible" and result.estimates == ()
    assert result.solver.status == "INFEASIBLE"
    assert result.explanation is not None
    assert result.explanation.startswith("no layout fits in memory: the smallest per-GPU memory over all layouts is ")
    need = re.search(r"over all layouts is ([0-9.]+) GiB", result.explanation)
    usable = re.search(r"usable capacity ([0-9.]+) GiB", result.explanation)
    assert need and usable and float(need.group(1)) > float(usable.group(1))
