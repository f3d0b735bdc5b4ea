"""The default space's bounds (vpp <= 8, micro_batch_size <= 16) are search priorities, not rules.

- Layouts beyond them are searched in bound order (``Reach.ALL``) and ``optimal`` covers them:
  MT-NLG 530B on 2,240 A100, where TP8 PP7 VPP15 scores faster than the best plan inside the
  bounds, and TP4 PP7 VPP15 (Calculon's layout) where ZeRO-2 is allowed; a small job whose best micro-batch is 64, against the oracle.
- ``search.fix`` / ``search.allow`` take any value the layout rules allow (GPT-3 175B with
  ``fix.vpp: 12``), and a pinned value no layout can take is a 422 at its field.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from optimizer.search.brute_force import verify
from optimizer.search.space import MAX_MICRO_BATCH, MAX_VPP, Reach, layout_blocks
from optimizer.specs import JobSpec, PlanRequest

MT_NLG: dict[str, Any] = {
    "model": {
        "name": "mt-nlg-530b", "num_layers": 105, "hidden_size": 20480, "ffn_hidden_size": 81920,
        "num_attention_heads": 128, "vocab_size": 51200, "activation": "gelu", "tied_embeddings": True,
    },
    "training": {"seq_len": 2048, "global_batch_size": 2240, "precision": "bf16"},
    "cluster": {"preset": "dgx-a100", "num_gpus": 2240},
}  # fmt: skip
"""MT-NLG 530B (Smith et al. 2022: 105 layers, hidden 20,480, 128 heads) as Calculon compares it."""
GPT3: dict[str, Any] = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_size": 1536},
    "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
}
TINY: dict[str, Any] = {
    "model": {"name": "tiny", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 32000},
    "training": {"seq_len": 512, "global_batch_size": 512},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def _evaluate(client: TestClient, job: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/evaluate", json={**job, "config": config})
    assert response.status_code == 200, response.text
    return response.json()


def test_mt_nlg_plans_at_least_as_fast_as_calculons_vpp15_layout(client: TestClient) -> None:
    """Calculon's layout (TP4 PP7 VPP15, ZeRO-2, selective recompute) runs on no framework (ZeRO-2
    with pipelines; as ZeRO-1 it needs 102.6 GiB): the default space's best is TP8 PP7 VPP15,
    beyond the old bounds and faster than TP8 PP7 VPP8 inside them. ZeRO-2 reduce-scatters every
    micro-batch's gradients (32 of them here), so Calculon's layout is slower than that plan; with
    ZeRO-2 and selective recompute allowed the planner's best is faster still."""
    calculon = _evaluate(
        client, MT_NLG, {"tp": 4, "pp": 7, "vpp": 15, "micro_batch_size": 1, "zero_stage": 2, "recompute": "selective"}
    )
    depths = list(range(1, MAX_VPP + 1))
    inside = client.post("/plan", json={**MT_NLG, "search": {"top_k": 1, "allow": {"vpp": depths}}})
    response = client.post("/plan", json={**MT_NLG, "search": {"top_k": 3}})
    assert response.status_code == 200 and inside.status_code == 200
    body, best_inside = response.json(), inside.json()["plans"][0]
    top = body["plans"][0]
    assert body["status"] == "optimal"
    # inside the old bounds the best is TP8 PP7 VPP8 at 35.068 s; beyond them TP8 PP7 VPP15, 34.953 s
    assert (best_inside["config"]["tp"], best_inside["config"]["pp"], best_inside["config"]["vpp"]) == (8, 7, 8)
    assert best_inside["step_time_s"] == pytest.approx(35.068, abs=1e-3)
    assert top["step_time_s"] == pytest.approx(34.953, abs=1e-3)
    assert (top["config"]["tp"], top["config"]["pp"], top["config"]["vpp"]) == (8, 7, 15)
    bound = body["solver"]["beyond_default_bounds_s"]
    assert bound is not None and bound < top["step_time_s"]
    assert "so they were searched too (the top plan is one of them)" in body["explanation"]
    # the plan is what /evaluate gives for its layout
    again = _evaluate(client, MT_NLG, {**top["config"], "placement": top["placement"]})
    assert again["step_time_s"] == top["step_time_s"]
    # Calculon's layout scores 35.927 s (and runs on no framework): slower than the top plan
    assert calculon["step_time_s"] == pytest.approx(35.927, abs=1e-3) and calculon["frameworks"] == []
    assert top["step_time_s"] < calculon["step_time_s"]
    allowed = {"zero_stage": [0, 1, 2], "recompute": ["none", "selective", "full"]}
    free = client.post("/plan", json={**MT_NLG, "search": {"top_k": 1, "allow": allowed}}).json()
    assert free["status"] == "optimal"
    best = free["plans"][0]
    assert (best["config"]["tp"], best["config"]["pp"], best["config"]["vpp"], best["config"]["zero_stage"]) == (
        8,
        7,
        15,
        1,
    )
    assert best["step_time_s"] <= top["step_time_s"]
    assert best["step_time_s"] == pytest.approx(34.316, abs=1e-3)


def test_no_bound_reported_when_nothing_beyond_can_win(client: TestClient) -> None:
    body = client.post("/plan", json={**GPT3, "search": {"top_k": 1, "fix": {"tp": 8, "pp": 1}}}).json()
    assert body["status"] == "optimal"
    assert body["solver"]["beyond_default_bounds_s"] is None


def test_fix_vpp_beyond_the_default_bound_plans_what_evaluate_scores(client: TestClient) -> None:
    response = client.post("/plan", json={**GPT3, "search": {"top_k": 2, "fix": {"tp": 4, "pp": 8, "vpp": 12}}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "optimal" and body["plans"]
    for plan in body["plans"]:
        assert (plan["config"]["tp"], plan["config"]["pp"], plan["config"]["vpp"]) == (4, 8, 12)
        again = _evaluate(client, GPT3, {**plan["config"], "placement": plan["placement"]})
        assert again["step_time_s"] == plan["step_time_s"]
    # TP4 PP8 VPP12, micro-batch 2, ZeRO-1 (no ZeRO-2 with pipelines), no recompute
    assert body["plans"][0]["step_time_s"] == pytest.approx(17.090, abs=1e-3)


def test_allow_micro_batch_above_the_default_bound(client: TestClient) -> None:
    body = client.post("/plan", json={**TINY, "search": {"top_k": 1, "allow": {"micro_batch_size": [32]}}}).json()
    assert body["status"] == "optimal"
    assert body["plans"][0]["config"]["micro_batch_size"] == 32


@pytest.mark.parametrize(
    ("fix", "field", "reason"),
    [
        ({"tp": 3}, "tp", "tp (3) does not divide num_gpus (64)"),
        ({"dp": 128}, "dp", "dp (128) does not divide num_gpus (64)"),
        ({"pp": 64}, "pp", "pp (64) exceeds num_layers (32)"),
        ({"micro_batch_size": 3}, "micro_batch_size", "micro_batch_size (3) does not divide global_batch_size (64)"),
        ({"vpp": 17}, "vpp", "at most 16"),
        ({"ep": 2}, "ep", "ep > 1 needs an MoE model"),
    ],
)
def test_fixed_value_no_layout_can_take_is_422_at_its_field(
    client: TestClient, fix: dict[str, int], field: str, reason: str
) -> None:
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"fix": fix},
    }
    response = client.post("/plan", json=job)
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert item["loc"] == ["body", "search", "fix", field]
    assert reason in item["msg"] and item["type"] == "invalid_layout"


def test_allow_list_no_value_of_which_any_layout_can_take_is_422(client: TestClient) -> None:
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"allow": {"tp": [3, 5]}},
    }
    response = client.post("/plan", json=job)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "search", "allow", "tp"]
    # one value some layout can take is enough
    ok = client.post("/plan", json={**job, "search": {"top_k": 1, "allow": {"tp": [3, 2]}}})
    assert ok.status_code == 200 and ok.json()["plans"][0]["config"]["tp"] == 2


def test_beyond_blocks_hold_only_layouts_beyond_the_bounds() -> None:
    req = PlanRequest.model_validate(MT_NLG)
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    default = list(layout_blocks(job, req.search))
    every = list(layout_blocks(job, req.search, Reach.ALL))
    assert not any(b.beyond for b in default)
    inside = [b for b in every if not b.beyond]
    assert [(b.base, b.more_vpps) for b in inside] == [(b.base, b.more_vpps) for b in default]
    beyond = [b for b in every if b.beyond]
    assert beyond
    for block in beyond:
        depths = (block.base.vpp, *block.more_vpps)
        assert block.base.micro_batch_size > MAX_MICRO_BATCH or min(depths) > MAX_VPP
        assert all(block.base.pp * v <= 105 for v in depths)
    assert max(v for b in beyond if b.base.pp == 7 for v in b.more_vpps) == 15  # 105 layers on 7 stages
    assert max(v for b in beyond if b.base.pp == 2 for v in b.more_vpps) == 52


def test_planner_agrees_with_brute_force_when_a_micro_batch_beyond_the_bound_wins() -> None:
    """The oracle costs every layout of the planner's whole space (``Reach.ALL``)."""
    req = PlanRequest.model_validate({**TINY, "search": {"top_k": 3}})
    from optimizer.service import search_plans

    response = search_plans(req)
    assert response.plans[0].config.micro_batch_size == 64 > MAX_MICRO_BATCH
    assert response.solver.beyond_default_bounds_s is not None
    assert verify(req) == []


def test_micro_batch_blocks_left_unbounded_fit_in_no_variant() -> None:
    """``beyond.may_fit`` drops the blocks of micro-batches above 16 whose sibling with the
    largest micro-batch inside the bound fits in no variant: bounded anyway, none of their
    families' memory floors fits (Llama 3.1 405B on 128 H100: 103 of 128 dropped; without ZeRO-2/3
    with pipelines most pipelined siblings fit in no variant)."""
    from optimizer.cost import build_context
    from optimizer.search.beyond import beyond_micro_batch, may_fit
    from optimizer.search.bounds import space_bounds

    req = PlanRequest.model_validate({
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
    })  # fmt: skip
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    usable = ctx.usable_bytes(None)
    blocks = list(layout_blocks(job, req.search, Reach.ALL))
    inner = [b for b in blocks if not beyond_micro_batch(b)]
    outer = [b for b in blocks if beyond_micro_batch(b)]
    kept = may_fit(space_bounds(ctx, inner), outer, usable)
    dropped = [b for b in outer if b not in kept]
    assert (len(outer), len(dropped)) == (128, 103)
    assert not (space_bounds(ctx, dropped).memory_floor <= usable).any()


def test_pinned_values_that_cannot_go_together_name_the_rule(client: TestClient) -> None:
    """Each pinned value alone is valid, together they are not whatever the rest takes: a 422 at
    the field naming the rule (it was a 200 "infeasible"), not a generic "divides evenly"."""
    r = client.post("/plan", json={**GPT3, "search": {"fix": {"tp": 4, "pp": 16, "vpp": 12}}})
    assert r.status_code == 422
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "search", "fix", "vpp"]
    assert "vpp 12 with pp 16 needs pp >= 2 and pp x vpp <= num_layers (96)" in detail["msg"]


@pytest.mark.parametrize("name", ["deepseek-v3", "llama3-70b", "mixtral-8x22b"])
def test_group_bound_rests_on_per_sequence_layer_times(name: str) -> None:
    """``beyond.group_bound`` needs: a layer's bound time per sequence does not grow with the
    micro-batch, its total does not fall, and no recompute mode is faster than none."""
    from itertools import product

    from optimizer.cost import build_context
    from optimizer.search.lower_bounds import lower_bound_layer_totals

    req = PlanRequest.model_validate({
        "model": {"preset": name},
        "training": {"seq_len": 4096, "global_batch_size": 4096},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    })  # fmt: skip
    ctx = build_context(JobSpec(model=req.model, training=req.training, cluster=req.cluster))
    moe = req.model.moe is not None
    modes = ["none", "selective", "full", "op"] + (["moe"] if moe else [])
    checked = 0
    for tp, cp, ep in product([1, 2, 8], [1, 4], [1, 8] if moe else [1]):
        for rc in modes:
            previous = None
            for mbs in [1, 2, 3, 8, 16, 17, 24, 32, 64, 256]:
                time_s = lower_bound_layer_totals(ctx, tp, cp, ep, mbs, tp > 1, rc)[0]
                none_s = lower_bound_layer_totals(ctx, tp, cp, ep, mbs, tp > 1, "none")[0]
                assert time_s >= none_s
                if previous is not None:
                    assert time_s / mbs <= previous[0] / previous[1] * (1 + 1e-12)
                    assert time_s >= previous[0]
                previous = (time_s, mbs)
                checked += 1
    assert checked > 100


def test_group_bound_is_below_every_bound_of_its_blocks() -> None:
    from optimizer.cost import build_context
    from optimizer.search.beyond import beyond_groups, beyond_micro_batch
    from optimizer.search.bounds import space_bounds

    req = PlanRequest.model_validate({
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 256},
    })  # fmt: skip
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    outer = [b for b in layout_blocks(job, req.search, Reach.ALL) if beyond_micro_batch(b)]
    groups = beyond_groups(ctx, outer)
    assert sum(len(g.blocks) for g in groups) == len(outer) > len(groups) > 10
    for group in groups[::5]:
        sb = space_bounds(ctx, group.blocks)
        for f in range(sb.num_families):
            assert group.bound <= sb.first[f]
            fam = sb.family(f)
            for v in fam.more_vpps:
                assert group.bound <= sb.depth_bound(ctx, f, v)


@pytest.mark.parametrize(
    ("fix", "loc", "message"),
    [
        ({"pp": 1, "vpp": 3}, "vpp", "vpp 3 with pp 1 needs pp >= 2"),
        ({"pp": 8, "vpp": 5}, "vpp", "pp x vpp <= num_layers (32)"),
        ({"tp": 8, "pp": 4, "cp": 64}, "cp", "tp 8 x pp 4 x cp 64 = 2048 does not divide num_gpus (1024)"),
        ({"tp": 2, "dp": 1024}, "dp", "tp 2 x dp 1024 = 2048 does not divide num_gpus (1024)"),
        ({"dp": 512, "micro_batch_size": 4}, "micro_batch_size", "micro_batch_size 4 x dp 512 does not divide"),
    ],
)
def test_pins_that_contradict_each_other_are_422s(client: TestClient, fix, loc, message) -> None:
    """Whatever the unpinned fields take, these pins go together in no layout: a 422 at the field
    (they were a 200 'infeasible'); pins that some layout takes stay an answer."""
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    }
    r = client.post("/plan", json={**job, "search": {"fix": fix, "top_k": 1, "time_limit_s": 5}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "search", "fix", loc] and message in detail["msg"]
    fine = client.post("/plan", json={**job, "search": {"fix": {"tp": 2, "dp": 512}, "top_k": 1, "time_limit_s": 5}})
    assert fine.status_code == 200 and fine.json()["plans"][0]["config"]["dp"] == 512
