"""The floors in the planner's layout bound: exposed data-parallel time and per-GPU memory.

The search orders and prunes layouts on a bound that holds for every rank order and every layer
split (at least one layer per stage). Two of its parts are checked here against the cost model
itself, on generated layouts over the ZeRO stages the space keeps, hierarchical and flat
collectives, dense and MoE models and context parallelism (whose rank orders may separate ``cp``
from ``dp``), with the uniform split and random ones, in every rank order:

- ``dp_exposed_floor_s`` stays below the step's exposed data-parallel time;
- ``memory_floor_bytes`` stays below the peak per-GPU memory (a layout above the usable capacity
  is passed over: it fits under no split).

Each must also be worth having: somewhere on these layouts it reaches at least half of what it
bounds, so a floor of zero fails. And passing layouts over by memory must not change what an
infeasible job's explanation names.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from optimizer.cost import best_estimate, build_context, estimate, resolve_layout
from optimizer.cost.head import head_time_s
from optimizer.cost.topology import every_order
from optimizer.search.lower_bounds import (
    dp_exposed_floor_s,
    lower_bound_layer_totals,
    memory_floor_bytes,
)
from optimizer.search.space import enumerate_layouts
from optimizer.service import search_plans
from optimizer.specs import JobSpec, PlanRequest, SearchSpec
from optimizer.units import GIB

JOBS: dict[str, dict[str, Any]] = {
    "llama3-8b, 64 H100, hierarchical": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 1024, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    },
    "llama3-8b, 64 H100, flat": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64, "dp_collectives": "flat"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    },
    "llama3-8b, 64 H100, blocking data-parallel collectives": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 128, "dp_comm_overlap": False},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    },
    "mixtral-8x7b, 128 H100": {
        "model": {"preset": "mixtral-8x7b"},
        "training": {"seq_len": 4096, "global_batch_size": 128},
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
    },
    "qwen3-30b-a3b, 144 GB200 NVL72": {
        "model": {"preset": "qwen3-30b-a3b"},
        "training": {"seq_len": 8192, "global_batch_size": 144},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 144},
    },
}
SAMPLES = 36
"""Layouts drawn per job (a third of them per ZeRO stage present); each is checked in every rank
order."""


def _random_split(rng: random.Random, layers: int, chunks: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, layers), chunks - 1))
    bounds = (0, *cuts, layers)
    return tuple(bounds[i + 1] - bounds[i] for i in range(chunks))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_floors_are_below_every_rank_order_and_split(name: str) -> None:
    job = JobSpec.model_validate(JOBS[name])
    ctx = build_context(job)
    spec = SearchSpec(allow={"zero_stage": [0, 1, 2, 3], "vpp": [1, 2, 3]})
    rng = random.Random(7)
    layouts = list(enumerate_layouts(job, spec))
    by_zero = {z: [lay for lay in layouts if lay.zero_stage == z] for z in range(4)}
    assert sum(bool(lays) for lays in by_zero.values()) >= 3  # ZeRO-2 may dominate ZeRO-1 out of the space
    layers = job.model.num_layers or 0
    checked = 0
    dp_share = memory_share = 0.0
    for z in range(4):
        for lay in rng.sample(by_zero[z], min(SAMPLES // 3, len(by_zero[z]))):
            totals = lower_bound_layer_totals(
                ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute, lay.etp
            )
            block = lay.ep * lay.etp  # the ranks that split the experts
            dp_floor = dp_exposed_floor_s(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, block, lay.pp,
                                          lay.num_micro_batches, totals, head_time_s(ctx, lay))  # fmt: skip
            memory_floor = memory_floor_bytes(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, block, lay.pp, totals)
            chunks = len(lay.stage_layers)
            splits = [lay] + [replace(lay, stage_layers=_random_split(rng, layers, chunks)) for _ in range(2)
                              if lay.pp > 1]  # fmt: skip
            for split in splits:
                for order in every_order(lay.sizes()):
                    est = estimate(ctx, split, order)
                    exposed = est.breakdown_s["dp_comm"]
                    assert dp_floor <= exposed * (1 + 1e-12), (lay, split.stage_layers, order)
                    assert memory_floor <= est.peak_memory_bytes * (1 + 1e-12), (lay, split.stage_layers, order)
                    if exposed > 0:
                        dp_share = max(dp_share, dp_floor / exposed)
                    memory_share = max(memory_share, memory_floor / est.peak_memory_bytes)
                    checked += 1
    assert checked >= 100
    assert dp_share >= 0.5 and memory_share >= 0.5


def test_dp_floor_takes_the_dp_group_alone_when_an_order_separates_cp_and_dp() -> None:
    """With ``cp > 1`` a rank order that puts another axis between ``cp`` and ``dp`` runs the
    dense collectives over the ``dp`` group alone (``topology.axis_groups``): the floor covers it."""
    job = JobSpec.model_validate(JOBS["llama3-8b, 64 H100, hierarchical"])
    ctx = build_context(job)
    from optimizer.specs import Layout

    lay = resolve_layout(job, Layout(tp=2, pp=2, cp=2, zero_stage=0, micro_batch_size=1, recompute="none"))
    totals = lower_bound_layer_totals(ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel,
                                      lay.recompute)  # fmt: skip
    floor = dp_exposed_floor_s(ctx, 0, lay.dp, lay.cp, lay.tp, lay.ep, lay.pp, lay.num_micro_batches, totals,
                               head_time_s(ctx, lay))  # fmt: skip
    separated = [o for o in every_order(lay.sizes()) if abs(o.index("cp") - o.index("dp")) > 1]
    assert separated
    exposed = [estimate(ctx, lay, o).breakdown_s["dp_comm"] for o in every_order(lay.sizes())]
    assert 0 < floor <= min(exposed) * (1 + 1e-12)


def test_an_infeasible_job_names_the_smallest_memory_over_every_layout() -> None:
    """Dense 1T on 8 H100: every layout's memory floor is above the capacity, so the search
    passes them all over, then costs them for the explanation, which names the smallest peak
    memory over every layout (as costing each one gives it)."""
    body = {
        "model": {"name": "dense-1t", "num_layers": 128, "hidden_size": 25600, "num_attention_heads": 160,
                  "vocab_size": 128256},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    }  # fmt: skip
    req = PlanRequest.model_validate(body)
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    usable = ctx.capacity_bytes - ctx.cal.memory_headroom_bytes
    layouts = list(enumerate_layouts(job, req.search))
    floors = [
        memory_floor_bytes(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, lay.ep, lay.pp, lower_bound_layer_totals(
            ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute))
        for lay in layouts
    ]  # fmt: skip
    assert min(floors) > usable
    smallest = min(best_estimate(ctx, lay).peak_memory_bytes for lay in layouts)
    response = search_plans(req)
    assert response.status == "infeasible"
    assert f"is {smallest / GIB:.1f} GiB on stage" in response.explanation
