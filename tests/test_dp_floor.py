"""The data-parallel floor in the layout bound (``estimate.dp_exposed_floor_s``).

The planner's layout bound counts a floor on the slowest stage's exposed data-parallel time. The
search prunes on that bound, so the floor must stay below the exposed data-parallel time the cost
model gives in every rank order and every layer split (at least one layer per stage). Checked on
generated layouts over the ZeRO stages the space keeps, hierarchical and flat collectives, dense and MoE models,
context parallelism (whose rank orders may separate ``cp`` from ``dp``), with the uniform split
and random ones. The floor must also be worth having: on these layouts it reaches at least half
of the exposed time somewhere, so a floor of zero fails.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from optimizer.cost import build_context, estimate, resolve_layout
from optimizer.cost.estimate import dp_exposed_floor_s, head_time_s, lower_bound_layer_totals
from optimizer.cost.topology import candidate_orders
from optimizer.search.space import enumerate_layouts
from optimizer.specs import JobSpec, SearchSpec

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
def test_dp_floor_is_below_every_rank_order_and_split(name: str) -> None:
    job = JobSpec.model_validate(JOBS[name])
    ctx = build_context(job)
    spec = SearchSpec(allow={"zero_stage": [0, 1, 2, 3], "vpp": [1, 2, 3]})
    rng = random.Random(7)
    layouts = list(enumerate_layouts(job, spec))
    by_zero = {z: [lay for lay in layouts if lay.zero_stage == z] for z in range(4)}
    assert sum(bool(lays) for lays in by_zero.values()) >= 3  # ZeRO-2 may dominate ZeRO-1 out of the space
    layers = job.model.num_layers or 0
    checked = 0
    best_share = 0.0
    for z in range(4):
        for lay in rng.sample(by_zero[z], min(SAMPLES // 3, len(by_zero[z]))):
            totals = lower_bound_layer_totals(
                ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute
            )
            floor = dp_exposed_floor_s(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, lay.ep, lay.pp,
                                       lay.num_micro_batches, totals, head_time_s(ctx, lay))  # fmt: skip
            chunks = len(lay.stage_layers)
            splits = [lay] + [replace(lay, stage_layers=_random_split(rng, layers, chunks)) for _ in range(2)
                              if lay.pp > 1]  # fmt: skip
            for split in splits:
                for order in candidate_orders(lay.sizes()):
                    exposed = estimate(ctx, split, order).breakdown_s["dp_comm"]
                    assert floor <= exposed * (1 + 1e-12), (lay, split.stage_layers, order)
                    if exposed > 0:
                        best_share = max(best_share, floor / exposed)
                    checked += 1
    assert checked >= 100
    assert best_share >= 0.5


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
    separated = [o for o in candidate_orders(lay.sizes()) if abs(o.index("cp") - o.index("dp")) > 1]
    assert separated
    exposed = [estimate(ctx, lay, o).breakdown_s["dp_comm"] for o in candidate_orders(lay.sizes())]
    assert 0 < floor <= min(exposed) * (1 + 1e-12)
