"""Uneven interleaving (``pp * vpp`` not dividing the layers): which depths the default space holds,
plans they find, and chunk-level split models of alternating layer kinds."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.cost import build_context, estimate, resolve_layout
from optimizer.search.cpsat import Candidate, SplitModel
from optimizer.search.fit_limits import stage_fit_limits
from optimizer.search.space import enumerate_layouts
from optimizer.search.split_tables import certified_split_range, split_tables
from optimizer.service import search_plans
from optimizer.specs import JobSpec, Layout, PlanRequest
from tests.search.search_helpers import _request
from tests.search.test_search import check_against_oracle

# 9 layers on 2 stages x 2, 3 or 4 chunks: no depth divides them evenly. For a model with one
# layer kind the default space interleaves anyway (uneven chunks); checked against the brute force.
JOB_UNEVEN_INTERLEAVING = {
    "model": {"name": "generated", "num_layers": 9, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000},
    "training": {"seq_len": 4096, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 2,
        "fix": {"tp": 1, "pp": 2, "cp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
    },
}

# The same with dense and MoE layers alternating: uneven depths when named, or when they add few
# layouts.
JOB_UNEVEN_INTERLEAVING_MIXED = {
    **JOB_UNEVEN_INTERLEAVING,
    "model": {
        **JOB_UNEVEN_INTERLEAVING["model"],
        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024, "layer_frequency": 2},
    },
    "search": {**JOB_UNEVEN_INTERLEAVING["search"], "allow": {"vpp": [1, 2, 4]}},
}
# MoE layers after a dense first one: every depth, however many layouts.
JOB_UNEVEN_INTERLEAVING_DENSE_FIRST = {
    **JOB_UNEVEN_INTERLEAVING,
    "model": {
        **JOB_UNEVEN_INTERLEAVING["model"],
        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024, "first_dense_layers": 1},
    },
}


def _searched_vpps(job: dict[str, Any]) -> set[int]:
    req = _request(job)
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    return {lay.vpp for lay in enumerate_layouts(spec, req.search)}


def test_uneven_interleaving_is_searched_by_default_for_one_layer_kind() -> None:
    assert _searched_vpps(JOB_UNEVEN_INTERLEAVING) == {1, 2, 3, 4}
    response = check_against_oracle(JOB_UNEVEN_INTERLEAVING)
    assert response.plans[0].config.vpp > 1  # the uneven interleaving wins here


def test_uneven_interleaving_of_alternating_layer_kinds_is_searched_when_named_or_few(monkeypatch) -> None:
    mixed = JOB_UNEVEN_INTERLEAVING_MIXED
    assert _searched_vpps(mixed) == {1, 2, 4}
    unnamed = {**mixed, "search": {"fix": mixed["search"]["fix"]}}
    assert _searched_vpps(unnamed) == {1, 2, 3, 4}  # they add few layouts: in the default space
    monkeypatch.setattr("optimizer.search.space.UNEVEN_DEPTHS_DEFAULT_MAX", 0)
    assert _searched_vpps(unnamed) == {1}
    assert _searched_vpps(mixed) == {1, 2, 4}
    assert _searched_vpps(JOB_UNEVEN_INTERLEAVING_DENSE_FIRST) == {1, 2, 3, 4}  # not alternating: every depth
    check_against_oracle(mixed)
    check_against_oracle(JOB_UNEVEN_INTERLEAVING_DENSE_FIRST)


@pytest.mark.slow
def test_deepseek_v3_default_space_interleaves_unevenly() -> None:
    """61 layers, 3 of them dense: no pp x vpp divides them. The MoE layers follow the dense ones
    without alternating, so the default space has every depth, as when all are named."""
    job = {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    }
    default = _searched_vpps(job)  # 194,408 layouts: enumerated once
    assert default == _searched_vpps({**job, "search": {"allow": {"vpp": list(range(1, 9))}}})
    assert default == set(range(1, 9))
    named = {**job, "search": {"allow": {"vpp": [1, 2]}}}
    assert _searched_vpps(named) == {1, 2}


def test_uneven_interleaving_finds_a_faster_llama_405b_plan() -> None:
    """Llama 3.1 405B has 126 layers: with pp 16 no depth divides them. Without interleaving the
    planner answers TP8 PP32 (6.26 s, its sends blocking as Megatron runs a non-interleaved
    pipeline); up to 8 chunks a stage it finds TP4 PP16 with 7 uneven chunks per stage (2 or 1
    layers each), 17% faster. The whole space adds nothing faster: its
    best beyond the default bounds is TP8 PP8 with 15 chunks a stage (5.38 s)."""
    base = {
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 2048},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16384},
    }
    flat = search_plans(_request({**base, "search": {"allow": {"vpp": [1]}}}))
    default = search_plans(_request({**base, "search": {"allow": {"vpp": list(range(1, 9))}}}))
    whole = search_plans(_request(base))
    assert whole.status == default.status == flat.status == "optimal"
    f, d = flat.plans[0], default.plans[0]
    assert (f.config.tp, f.config.pp, f.config.vpp) == (8, 32, 1)
    assert f.step_time_s == pytest.approx(6.261, abs=1e-3)
    assert (d.config.tp, d.config.pp, d.config.vpp) == (4, 16, 7)
    assert d.step_time_s == pytest.approx(5.210, abs=1e-3)
    assert sorted(set(d.config.stage_layers)) == [1, 2] and sum(d.config.stage_layers) == 126
    assert whole.plans[0].config == d.config and whole.plans[0].step_time_s == d.step_time_s
    assert whole.solver.beyond_default_bounds_s is not None  # searched, bound below the best
    beyond = [p for p in whole.plans if p.config.vpp > 8]
    assert {(p.config.tp, p.config.pp, p.config.vpp) for p in beyond} == {(8, 8, 15)}
    assert beyond[0].step_time_s == pytest.approx(5.384, abs=1e-3)


def test_uneven_depths_find_a_faster_deepseek_v3_plan_on_nvl72(without_expert_host_floor: None) -> None:
    """DeepSeek-V3 (3 dense + 58 MoE layers) on 9,216 GB200 NVL72, costed without the host floor
    on small expert GEMMs (with it, 32 local experts at EP8 are host bound and EP256 without
    pipelining wins): TP1 CP2 PP8 with 7 uneven chunks per stage, 22% faster than the best plan
    without interleaving (TP2 CP2 PP16, its sends blocking as Megatron runs a non-interleaved
    pipeline), proved optimal by default. Its interleaved split models are
    chunk-level CP-SAT models; without presolve some stopped at their 1 s limit and the answer
    was only `feasible`."""
    base = {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 4608},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 9216},
    }
    default = search_plans(_request({**base, "search": {"time_limit_s": 60}}))
    assert default.status == "optimal"
    best = default.plans[0]
    assert (best.config.tp, best.config.pp, best.config.vpp, best.config.ep) == (1, 8, 7, 8)
    assert best.step_time_s == pytest.approx(0.7902, abs=1e-4)
    assert len(best.config.stage_layers) == 56 and sum(best.config.stage_layers) == 61
    assert not any("unequal chunks" in w for w in default.warnings)
    assert default.solver.left_out_depths_bound_s is None
    flat = search_plans(_request({**base, "search": {"time_limit_s": 60, "allow": {"vpp": [1]}}}))
    assert flat.status == "optimal"
    assert flat.plans[0].step_time_s == pytest.approx(1.0193, abs=1e-4)
    assert best.step_time_s < 0.82 * flat.plans[0].step_time_s


def test_uneven_depths_that_add_few_layouts_are_in_the_default_space() -> None:
    """Llama 4 Maverick (MoE on every second layer) on 256 H100: its uneven depths add 21,400
    layouts, under ``UNEVEN_DEPTHS_DEFAULT_MAX``, so the default space is the named one: same
    families, same plan (TP1 PP2 CP2 EP128 with 12 chunks a stage, ZeRO-1, 1.906 s: no ZeRO-2/3
    with pipelines, nor for an MoE model with bf16 gradients on Megatron-LM), nothing left out to
    report."""
    from optimizer.search.space import UNEVEN_DEPTHS_DEFAULT_MAX, blocks_with_uneven_depths_apart, layout_families

    base = {"model": {"preset": "llama4-maverick"}, "training": {"seq_len": 4096, "global_batch_size": 512},
            "cluster": {"preset": "dgx-h100", "num_gpus": 256}}  # fmt: skip
    default, named = _request(base), _request({**base, "search": {"allow": {"vpp": list(range(1, 9))}}})
    job = JobSpec(model=default.model, training=default.training, cluster=default.cluster)
    assert (
        sum(
            len(b.variants) * len(b.skipped_vpps)
            for b in blocks_with_uneven_depths_apart(job, default.search)
            if b.base.etp == 1
        )  # the count the default maximum takes: experts whole
        == 21_400
        < UNEVEN_DEPTHS_DEFAULT_MAX
    )
    assert list(layout_families(job, default.search)) == list(layout_families(job, named.search))
    planned = search_plans(default)
    assert planned.status == "optimal"
    assert planned.plans[0].step_time_s == pytest.approx(1.9059, abs=1e-4)
    assert (planned.plans[0].config.pp, planned.plans[0].config.ep, planned.plans[0].config.zero_stage) == (2, 128, 1)
    assert planned.plans[0].config.vpp == 12
    assert planned.solver.left_out_depths_bound_s is None
    assert not any("unequal chunks" in w for w in planned.warnings)


JOB_ALTERNATING_MOE = {
    "model": {"preset": "mixtral-8x22b", "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 16384,
                                                 "layer_frequency": 2, "first_dense_layers": 1}},
    "training": {"seq_len": 4096, "global_batch_size": 512},
    "cluster": {"preset": "dgx-h100", "num_gpus": 256},
}  # fmt: skip


def test_depths_left_out_by_default_are_the_uneven_ones_of_alternating_kind_models() -> None:
    """A family's depths the default space leaves out are exactly those the named space adds:
    uneven ones (``pp * vpp`` not dividing the layers) of a model whose layer kinds alternate
    (here 42,528 layouts at a batch of 1,024, above ``UNEVEN_DEPTHS_DEFAULT_MAX``); none for one-kind models, for
    MoE layers after dense ones (DeepSeek-V3), or when the request names depths."""
    from optimizer.search.space import UNEVEN_DEPTHS_DEFAULT_MAX, layout_families

    # every recompute mode named: with Megatron-LM's four alone (no ZeRO-2/3 with pp > 1) the uneven
    # depths add 28,352 layouts, under the default maximum, so the default space holds them; at a
    # batch of 512 (or tp at most num_kv_heads = 8, as every framework runs it) even all six add fewer
    wide = {**JOB_ALTERNATING_MOE, "training": {"seq_len": 4096, "global_batch_size": 1024}}
    modes = ["none", "core_attn", "selective", "op", "moe", "full"]
    default = _request({**wide, "search": {"allow": {"recompute": modes}}})
    named = _request({**wide, "search": {"allow": {"recompute": modes, "vpp": list(range(1, 9))}}})
    job = JobSpec(model=default.model, training=default.training, cluster=default.cluster)
    layers = job.model.num_layers
    named_depths = {_key_without_vpp(f.first): (f.first.vpp, *f.more_vpps) for f in layout_families(job, named.search)}
    left_out = 0
    for fam in layout_families(job, default.search):
        depths = named_depths[_key_without_vpp(fam.first)]
        assert sorted((fam.first.vpp, *fam.more_vpps, *fam.skipped_vpps)) == sorted(depths)
        assert all(layers % (fam.first.pp * v) for v in fam.skipped_vpps)
        left_out += len(fam.skipped_vpps)
    assert left_out > 0
    blocks_left_out = sum(len(b.variants) * len(b.skipped_vpps) for b in _layout_blocks_of(default) if b.base.etp == 1)
    assert blocks_left_out == 42_528 > UNEVEN_DEPTHS_DEFAULT_MAX
    assert not any(f.skipped_vpps for f in layout_families(job, named.search))
    for preset in ("llama3-70b", "deepseek-v3"):
        other = _request({**JOB_ALTERNATING_MOE, "model": {"preset": preset}})
        other_job = JobSpec(model=other.model, training=other.training, cluster=other.cluster)
        assert not any(f.skipped_vpps for f in layout_families(other_job, other.search))


def _layout_blocks_of(req: PlanRequest) -> list:
    from optimizer.search.space import layout_blocks

    return list(layout_blocks(JobSpec(model=req.model, training=req.training, cluster=req.cluster), req.search))


def _key_without_vpp(lay) -> tuple:
    """A layout's identity without its interleaving depth and layer split."""
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage, lay.recompute, lay.sequence_parallel)


def test_chunk_split_of_alternating_layer_kinds_is_proved() -> None:
    """Mixtral-8x22B with MoE on every second layer (a dense first layer), 256 H100, TP1 PP2 EP8
    with 7 chunks per stage, no recompute: no layer split that fits in memory is below 3.07 s. A
    chunk's kind mix depends on where it starts. With a (first layer, count) table per chunk
    CP-SAT proved the bound in milliseconds only once the model stated that the stages' layer
    counts and MoE layers add up to the model's (without those two sums: no answer after 3 s, nor
    after 30 s on its siblings); the chunks now follow the kinds' repeat (``kind_period``)."""
    job = JobSpec.model_validate({
        "model": {"preset": "mixtral-8x22b", "moe": {"num_experts": 8, "top_k": 2,
                  "expert_ffn_hidden_size": 16384, "layer_frequency": 2, "first_dense_layers": 1}},
        "training": {"seq_len": 4096, "global_batch_size": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    })  # fmt: skip
    ctx = build_context(job)
    lay = resolve_layout(job, Layout(tp=1, pp=2, cp=1, ep=8, vpp=7, micro_batch_size=1, zero_stage=2, recompute="none"))
    cand = estimate(ctx, lay, ("tp", "cp", "dp", "pp"))
    assert not cand.fits_memory  # the even split (4 layers per chunk); uneven ones may fit
    limits = stage_fit_limits(ctx, cand)
    tables = split_tables(ctx, cand, certified_split_range(ctx, cand, 3.07, max(limits)))
    assert tables.by_mix is not None and tables.exact
    model = SplitModel([Candidate(cand, tables, cand.capacity_bytes, 56)], cand.step_time_s)
    assert model.solve([], 2.0, 3.07).status == "INFEASIBLE"
