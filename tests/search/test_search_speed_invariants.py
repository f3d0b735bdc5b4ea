"""The shortcuts the search takes for speed, checked against the full cost model on real jobs.

- ``step_time_s`` is bit-identical to ``estimate(...).step_time_s`` for every rank order.
- ``screen_memory`` reports exactly ``best_estimate``'s peak memory and fit (or declines).
- ``step_floor_s`` never exceeds the best step time over rank orders; ``step_floor_exceeds``
  agrees with it.
- ``kind_time_floor`` never exceeds a layer kind's time under any rank order.
- ``family_bound`` (the closed-form minimum over a layout family's depths) equals the minimum of
  ``bound_at_vpp`` over them.
- ``split_floor_s`` never exceeds the best step time of any layer split, and is tight where a
  loose floor once let hundreds of layouts through (MoE data-parallel terms).
"""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from optimizer.cost import best_estimate, build_context, estimate
from optimizer.cost.estimate import step_time_s
from optimizer.cost.stage import layout_kind_costs
from optimizer.cost.topology import axis_groups
from optimizer.search.floors import kind_time_floor, step_floor_exceeds, step_floor_s
from optimizer.search.lower_bounds import bound_at_vpp, family_bound, lower_bound_terms
from optimizer.search.screen import screen_memory
from optimizer.search.space import enumerate_layouts
from optimizer.search.split_floors import split_floor_s
from optimizer.specs import JobSpec, PlanRequest

pytestmark = pytest.mark.slow

JOBS: dict[str, dict[str, Any]] = {
    "llama3-8b, 64 H100": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 256},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    },
    "mixtral-8x22b, 128 H100": {
        "model": {"preset": "mixtral-8x22b"},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
    },
    "deepseek-v3, 288 GB200 NVL72": {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 576},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 288},
    },
}
STRIDE = 199
"""Check every STRIDE-th layout (the spaces have 9,687 to 166,576; a prime stride, so it does not
follow the enumeration's period), plus, for each value of a knob (``KNOBS``) the stride misses,
the first layout with it: 51 to 840 layouts per job, every value of every knob among them."""
KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage", "recompute",
         "sequence_parallel")  # fmt: skip


def _spread(layouts: list) -> list:
    """Every STRIDE-th of ``layouts`` and the first one with each knob value those leave out."""
    sample = layouts[::STRIDE]
    for knob in KNOBS:
        missed = {getattr(lay, knob) for lay in layouts} - {getattr(lay, knob) for lay in sample}
        sample += [next(lay for lay in layouts if getattr(lay, knob) == value) for value in sorted(missed)]
    return sample


@cache
def _sample(name: str):
    """The job's context and its ``_spread`` sample, built once for all the tests that read them."""
    req = PlanRequest.model_validate(JOBS[name])
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    layouts = list(enumerate_layouts(job, req.search))
    assert layouts
    return ctx, _spread(layouts)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_step_time_matches_estimate(name: str) -> None:
    ctx, layouts = _sample(name)
    for lay in layouts:
        for order in ctx.rank_orders(lay.sizes()):
            groups = axis_groups(ctx.topology, order, lay.sizes())
            assert step_time_s(ctx, lay, groups) == estimate(ctx, lay, order, groups=groups).step_time_s


@pytest.mark.parametrize("name", sorted(JOBS))
def test_screen_and_floor_against_best_estimate(name: str) -> None:
    ctx, layouts = _sample(name)
    screened = 0
    for lay in layouts:
        best = best_estimate(ctx, lay)
        screen = screen_memory(ctx, lay, None)
        if screen is not None:
            screened += 1
            assert screen.peak_memory_bytes == best.peak_memory_bytes
            assert screen.fits_memory == best.fits_memory
            if best.fits_memory:
                floor = step_floor_s(ctx, lay, screen.groups)
                assert floor <= best.step_time_s
                for threshold in (floor * 0.99, floor, floor * 1.01, best.step_time_s):
                    assert step_floor_exceeds(ctx, lay, screen.groups, threshold) == (floor > threshold)
        if not best.fits_memory:
            continue
        # the floor is below every order the plan may take (JobContext.rank_orders), not just the best one's
        for order in ctx.rank_orders(lay.sizes()):
            est = estimate(ctx, lay, order)
            if screen is not None:
                assert step_floor_s(ctx, lay, screen.groups) <= est.step_time_s
    assert screened > len(layouts) // 2


@pytest.mark.parametrize("name", sorted(JOBS))
def test_kind_time_floor_is_a_floor(name: str) -> None:
    ctx, layouts = _sample(name)
    for lay in layouts:
        floor = kind_time_floor(ctx, lay)
        for order in ctx.rank_orders(lay.sizes()):
            costs = layout_kind_costs(ctx, lay, axis_groups(ctx.topology, order, lay.sizes()))
            assert all(f <= c.time_s for f, c in zip(floor, costs, strict=True))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_family_bound_is_the_smallest_member_bound(name: str) -> None:
    ctx, layouts = _sample(name)
    pipelined = [lay for lay in layouts if lay.pp > 1]
    rng = random.Random(1)
    checked = 0
    for lay, terms in zip(pipelined, lower_bound_terms(ctx, pipelined), strict=True):
        for vpps in ((1, 2, 3, 4, 5, 6, 7, 8), (2, 3), (2, 4, 8), tuple(sorted(rng.sample(range(1, 9), 4)))):
            # the sends' weight on the depth grows with the pipeline send; scale it to move the optimum
            for scale in (0.0, 1.0, 30.0, 1000.0):
                t = (*terms[:3], terms[3] * scale)
                expected = min(bound_at_vpp(ctx, t, lay.pp, v, lay.num_micro_batches) for v in vpps)
                assert family_bound(ctx, t, lay.pp, vpps, lay.num_micro_batches) == expected
                checked += 1
    assert checked > 100


def _random_split(rng: random.Random, layers: int, chunks: int) -> tuple[int, ...]:
    """``chunks`` positive layer counts summing to ``layers``."""
    cuts = sorted(rng.sample(range(1, layers), chunks - 1))
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_split_floor_below_every_split(name: str) -> None:
    ctx, layouts = _sample(name)
    rng = random.Random(0)
    layers = len(ctx.layer_kind)
    checked = 0
    for lay in layouts:
        if lay.pp == 1:
            continue
        floor = split_floor_s(ctx, lay)
        splits = [lay.stage_layers] + [_random_split(rng, layers, lay.pp * lay.vpp) for _ in range(3)]
        for split in splits:
            est = best_estimate(ctx, replace(lay, stage_layers=split))
            assert floor <= est.step_time_s, (lay, split)
            checked += 1
    assert checked


@pytest.mark.parametrize("zero_stage, best_split_s", [(2, 1.4377), (3, 2.5786)])
def test_split_floor_is_tight_for_moe_data_parallel_terms(zero_stage: int, best_split_s: float) -> None:
    """Mixtral 8x22B on 2,048 H100, TP2 PP2 DP512 EP8, 7 chunks per stage, 2 micro-batches: the
    uniform split is the best and its step is dominated by exposed expert-gradient (ZeRO-2) or
    per-layer gather (ZeRO-3) time. The floor once left that term out (1.0 s for both) by taking
    layer and communication geometries from different rank orders and, for ZeRO-3 and small
    dense layers, only the last bucket / first gather."""
    req = PlanRequest.model_validate(
        {
            "model": {"preset": "mixtral-8x22b"},
            "training": {"seq_len": 4096, "global_batch_size": 1024, "attention_kernel": "flash2"},
            "cluster": {"preset": "dgx-h100", "num_gpus": 2048},
            # named: no framework runs ZeRO-2/3 with pp > 1, so the default space leaves them out
            "search": {"allow": {"zero_stage": [zero_stage], "recompute": ["none"]}},
        }
    )
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    (lay,) = [
        lay
        for lay in enumerate_layouts(job, req.search)
        if (lay.tp, lay.pp, lay.dp, lay.ep, lay.vpp, lay.micro_batch_size, lay.recompute, lay.zero_stage)
        == (2, 2, 512, 8, 7, 1, "none", zero_stage)
        and lay.etp == 1  # experts whole (the default space also has etp = tp)
    ]
    best = best_estimate(ctx, lay).step_time_s
    assert best == pytest.approx(best_split_s, rel=1e-3)
    assert 0.99 * best <= split_floor_s(ctx, lay) <= best


def _reference_limits(ctx, lay, groups, cap: float) -> list[int]:
    """Per stage, the most layers for which some kind mix the stage could hold fits in memory:
    every count tried, no monotonicity assumed (interleaved stages may hold any mix)."""
    from optimizer.cost.stage import stage_memory_bytes
    from optimizer.search.split_mixes import mix_vectors

    totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
    most = len(ctx.layer_kind) - (lay.pp - 1) * lay.vpp
    limits = []
    for s in range(lay.pp):
        fitting = [
            n for n in range(lay.vpp, most + 1)
            if any(stage_memory_bytes(ctx, lay, groups, s, mix) <= cap for mix in mix_vectors(n, totals))
        ]  # fmt: skip
        limits.append(max(fitting, default=lay.vpp - 1))
    return limits


FIT_LIMIT_JOBS = {
    "deepseek-v3, 288 GB200": ("deepseek-v3", "gb200-nvl72", 288, 576),
    "deepseek-v3, 576 GB200": ("deepseek-v3", "gb200-nvl72", 576, 1152),
    "llama3-70b, 40 H100": ("llama3-70b", "dgx-h100", 40, 80),
}


@pytest.mark.parametrize("name", sorted(FIT_LIMIT_JOBS))
def test_stage_fit_limits_of_interleaved_stages(name: str) -> None:
    """Interleaved stages: each stage's limit is the most layers some kind mix fits (checked
    against trying every count; the middle stages step up from their predecessor's limit), and no
    split that fits in memory puts more layers on a stage. For DeepSeek-V3 (3 dense + 58 MoE
    layers) the limits once were "no limit", so hundreds of split models per job proved what
    memory alone rules out."""
    from optimizer.search.fit_limits import some_split_may_fit, stage_fit_limits
    from optimizer.search.orders import order_geometries
    from optimizer.search.split_mixes import per_stage_layers

    model, cluster, num_gpus, global_batch_size = FIT_LIMIT_JOBS[name]
    req = PlanRequest.model_validate({
        "model": {"preset": model},
        "training": {"seq_len": 4096, "global_batch_size": global_batch_size},
        "cluster": {"preset": cluster, "num_gpus": num_gpus},
        "search": {"allow": {"vpp": [2, 3, 4]}},
    })  # fmt: skip
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    rng = random.Random(1)
    # 16 interleaved layouts at random (memory binds on most of them: asserted below)
    layouts = rng.sample([lay for lay in enumerate_layouts(job, req.search) if lay.vpp > 1], 16)
    layers = len(ctx.layer_kind)
    binding = fitting = 0
    for lay in layouts:
        est = best_estimate(ctx, lay)
        limits = stage_fit_limits(ctx, est)
        cap = est.capacity_bytes - est.headroom_bytes
        assert limits == _reference_limits(ctx, lay, axis_groups(ctx.topology, est.order, lay.sizes()), cap), lay
        # the split phase's layout-level test (early exits, every rank order) agrees with the limits
        admitted = [_reference_limits(ctx, lay, g, cap) for g in order_geometries(ctx, lay)[2]]
        assert some_split_may_fit(ctx, lay, cap) == any(min(r) >= lay.vpp and sum(r) >= layers for r in admitted), lay
        most = layers - (lay.pp - 1) * lay.vpp
        binding += any(n < most for n in limits)
        for _ in range(4):
            split = replace(lay, stage_layers=_random_split(rng, layers, lay.pp * lay.vpp))
            other = estimate(ctx, split, est.order)
            if other.fits_memory:
                fitting += 1
                assert all(n <= lim for n, lim in zip(per_stage_layers(split), limits, strict=True))
    assert binding > len(layouts) // 2  # memory binds on most of these layouts
    assert fitting  # and some random splits fit


@pytest.mark.parametrize("name", sorted(FIT_LIMIT_JOBS))
def test_some_split_may_fit_is_exact(name: str) -> None:
    """``some_split_may_fit``'s early exits (one layer per chunk on stage 0; the pigeonhole probe of
    the largest-limit stages at ``ceil(layers / pp)``) answer exactly what the full per-stage
    limits do, in every rank order, including layouts whose largest limit is that share."""
    from optimizer.search.fit_limits import signature_fit_limits, some_split_may_fit
    from optimizer.search.orders import order_geometries

    model, cluster, num_gpus, global_batch_size = FIT_LIMIT_JOBS[name]
    req = PlanRequest.model_validate({
        "model": {"preset": model},
        "training": {"seq_len": 4096, "global_batch_size": global_batch_size},
        "cluster": {"preset": cluster, "num_gpus": num_gpus},
        "search": {"allow": {"vpp": [1, 2, 3, 4]}},
    })  # fmt: skip
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    layers = len(ctx.layer_kind)
    rng = random.Random(2)
    pipelined = [lay for lay in enumerate_layouts(job, req.search) if lay.pp > 1]
    at_share = admitted = 0
    for lay in rng.sample(pipelined, min(100, len(pipelined))):  # 100 at random: some at the share, some admitted
        cap = ctx.capacity_bytes - ctx.cal.memory_headroom_bytes
        full = [signature_fit_limits(ctx, lay, g, cap) for g in order_geometries(ctx, lay)[2]]
        expected = any(min(r) >= lay.vpp and sum(r) >= layers for r in full)
        assert some_split_may_fit(ctx, lay, cap) == expected, lay
        admitted += expected
        at_share += any(max(r) == -(-layers // lay.pp) for r in full)
    assert admitted and at_share


@pytest.mark.parametrize("name", sorted(JOBS))
def test_split_floor_at_a_depth_is_the_members_floor(name: str) -> None:
    """``split_floor_at_vpp_s`` (the floor of a family's layout at another interleaving depth,
    without resolving it: the search leaves deeper layouts above the k-th best time unresolved)
    is bit-identical to ``split_floor_s`` of the resolved layout at that depth. Both share one
    memo entry, so each is computed from an empty memo."""
    from optimizer.search.space import layout_families
    from optimizer.search.split_floors import split_floor_at_vpp_s

    req = PlanRequest.model_validate({**JOBS[name], "search": {"allow": {"vpp": list(range(1, 9))}}})
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    checked = 0
    for fam in list(layout_families(job, req.search))[::STRIDE]:
        for member in fam.expand(job):
            ctx.caches.clear()
            expected = split_floor_s(ctx, member)
            ctx.caches.clear()
            assert split_floor_at_vpp_s(ctx, fam.first, member.vpp) == expected
            checked += 1
    assert checked > 20
