"""Plans are costed only in rank orders a framework they target lays out (optimizer/rank_orders.py):
the default (tp, cp, dp, pp from the innermost) everywhere, pipeline stages inside data
parallelism only on Megatron (``--use-tp-pp-dp-mapping``) at the sizes it allows. The search
once took any permutation, and a plan's placement then described ranks no launch produced."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from optimizer.frameworks import load_profiles
from optimizer.rank_orders import DEFAULT_ORDER, PP_INSIDE_DP_ORDER, framework_orders, pp_inside_dp_allowed
from optimizer.service import plan
from optimizer.specs import PlanRequest


def _sizes(tp: int = 1, cp: int = 1, dp: int = 8, pp: int = 2, ep: int = 1, etp: int = 1) -> dict[str, int]:
    return {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp}


def test_each_framework_rule_at_the_sizes_it_names() -> None:
    rules = {fid: str(p.parallelism.pp_inside_dp.value) for fid, p in load_profiles().items()}
    assert rules == {"megatron-lm": "expert_dp_equals_dp", "megatron-bridge": "no_cp_ep", "torchtitan": "never",
                     "deepspeed": "never"}  # fmt: skip
    megatron, bridge = rules["megatron-lm"], rules["megatron-bridge"]
    assert pp_inside_dp_allowed(megatron, _sizes(tp=4), is_moe=False)
    assert not pp_inside_dp_allowed(megatron, _sizes(cp=2), is_moe=False)  # dense expert grid: etp = tp, ep = 1
    assert pp_inside_dp_allowed(megatron, _sizes(tp=2, cp=2, ep=4, etp=1), is_moe=True)  # etp x ep = tp x cp
    assert not pp_inside_dp_allowed(megatron, _sizes(tp=2, ep=4, etp=1), is_moe=True)
    assert pp_inside_dp_allowed(bridge, _sizes(tp=4), is_moe=False)
    assert not pp_inside_dp_allowed(bridge, _sizes(tp=2, cp=1, ep=2, etp=1), is_moe=True)  # 'tp-pp-dp' names no ep
    assert framework_orders(_sizes(tp=4), "never", False) == [DEFAULT_ORDER]
    assert framework_orders(_sizes(tp=4), megatron, False) == [DEFAULT_ORDER, PP_INSIDE_DP_ORDER]
    assert framework_orders(_sizes(pp=1), megatron, False) == [DEFAULT_ORDER]  # nothing to reorder


JOB = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 8192, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "search": {"top_k": 5},
}


def test_a_plan_with_stages_inside_data_parallelism_lists_megatron_and_launches_the_mapping() -> None:
    """Llama 3 8B on 16 H100: the runner-up, TP1 PP2 DP8 with the two stages in one node, runs
    only with Megatron's mapping; torchtitan, asked for, plans the default order only."""
    answer = plan(PlanRequest.model_validate(JOB))
    inside = [p for p in answer.plans if "--use-tp-pp-dp-mapping" in p.launch.megatron]
    assert [(p.config.tp, p.config.pp, p.config.dp) for p in inside] == [(1, 2, 8)]
    assert inside[0].placement["pp"] == "nvlink" and inside[0].placement["dp"] == "leaf"
    assert inside[0].frameworks == ["megatron-lm"] and not inside[0].launch.torchtitan
    for p in answer.plans:
        if p not in inside and p.config.pp > 1 and p.config.dp > 1:
            assert p.placement["pp"] != "nvlink" or p.config.tp * p.config.cp * p.config.dp * p.config.pp <= 8
    titan = plan(PlanRequest.model_validate({**JOB, "training": {**JOB["training"], "framework": "torchtitan"}}))
    for p in titan.plans:
        assert p.frameworks == ["torchtitan"]
        if p.config.pp > 1 and p.config.dp * p.config.cp * p.config.tp >= 8:
            assert p.placement["pp"] != "nvlink"  # stages outside the node-sized data-parallel block


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def test_a_placement_only_an_unrun_order_gives_is_a_422(client: TestClient) -> None:
    """/evaluate of TP2 PP2 DP4 with the tensor groups across nodes needs tp outside dp and pp:
    no framework lays that out, so no rank order realises it."""
    body = {**{k: v for k, v in JOB.items() if k != "search"},
            "config": {"tp": 2, "pp": 2, "placement": {"tp": "leaf"}}}  # fmt: skip
    response = client.post("/evaluate", json=body)
    assert response.status_code == 422, response.text
    item = response.json()["detail"][0]
    assert item["loc"][-1] == "placement" and "no rank order" in item["msg"]
    inside = {**body, "config": {"tp": 2, "pp": 2, "placement": {"pp": "nvlink", "dp": "leaf"}}}
    assert client.post("/evaluate", json=inside).status_code == 200  # Megatron's pp-inside-dp order


def test_groups_match_megatron_in_the_pp_inside_dp_order() -> None:
    """Megatron's tp-cp-ep-pp-dp builds its expert ranks etp-ep-pp-edp: the expert-data-parallel
    group strides over the pipeline stages (ranks 0, 4, 8, 12 for tp2 pp2 dp4 ep2 on 16), where the
    cost model took the stride etp x ep (0, 2, 4, 6: one node). And with cp > 1 this order splits
    the dp x cp sharding group over two strides, which the geometry cannot say: such layouts are
    costed in the default order only."""
    from optimizer.cost import build_context, resolve_layout
    from optimizer.cost.topology import axis_groups
    from optimizer.specs import JobSpec, Layout

    job = JobSpec.model_validate({
        "model": {"preset": "mixtral-8x7b"}, "training": {"seq_len": 4096, "global_batch_size": 32},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    })  # fmt: skip
    ctx = build_context(job)
    lay = resolve_layout(job, Layout(tp=2, pp=2, ep=2, etp=1, zero_stage=1))
    sizes = lay.sizes()
    assert ctx.rank_orders(sizes) == [DEFAULT_ORDER, PP_INSIDE_DP_ORDER]
    inside = axis_groups(ctx.topology, PP_INSIDE_DP_ORDER, sizes)
    assert (inside.edp.size, inside.dp.size) == (4, 4) and inside.edp is inside.dp  # stride tp x pp = 4
    assert inside.edp.outermost_tier == "leaf"  # ranks 0, 4, 8, 12 span two 8-GPU nodes
    default = axis_groups(ctx.topology, DEFAULT_ORDER, sizes)
    assert default.edp.outermost_tier == default.dp.outermost_tier == "nvlink"  # pp outermost: one node
    cp2 = resolve_layout(job, Layout(tp=1, cp=2, pp=2, ep=2, etp=1, zero_stage=1))
    assert pp_inside_dp_allowed("expert_dp_equals_dp", cp2.sizes(), is_moe=True)  # Megatron runs it
    assert ctx.rank_orders(cp2.sizes()) == [DEFAULT_ORDER]  # the cost model does not
