"""Which recompute modes the search space holds, and restrictions or options it rejects by name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optimizer.cost import resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.search.space import enumerate_layouts
from optimizer.service import search_plans
from optimizer.specs import JobSpec, Layout, PlanRequest, SearchSpec
from tests.search.search_helpers import SMALL_DENSE, _request


def test_moe_block_recompute_is_searched_only_for_moe_models():
    dense = PlanRequest(**SMALL_DENSE)
    spec = JobSpec(model=dense.model, training=dense.training, cluster=dense.cluster)
    assert {lay.recompute for lay in enumerate_layouts(spec, dense.search)} == {"none", "core_attn", "full"}
    moe_req = PlanRequest(
        model={"preset": "mixtral-8x7b"},
        training={"seq_len": 4096, "global_batch_size": 64},
        cluster={"preset": "dgx-h100", "num_gpus": 16},
    )
    moe_spec = JobSpec(model=moe_req.model, training=moe_req.training, cluster=moe_req.cluster)
    assert {lay.recompute for lay in enumerate_layouts(moe_spec, moe_req.search)} == {
        "none",
        "core_attn",
        "moe",
        "full",
    }


def test_moe_block_recompute_on_a_dense_model_names_the_field():
    req = PlanRequest(**SMALL_DENSE)
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    with pytest.raises(InvalidLayout) as err:
        resolve_layout(job, Layout(tp=1, pp=1, recompute="moe"))
    assert err.value.field == "config.recompute" and "MoE" in err.value.reason


def test_unfused_attention_with_context_parallelism_pinned_is_invalid_and_says_why() -> None:
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 16, "attention_kernel": "unfused"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "search": {"fix": {"cp": 2}},
    }
    with pytest.raises(InvalidLayout) as err:
        search_plans(_request(job))
    assert err.value.field == "search.fix.cp" and "training.attention_kernel is 'unfused'" in err.value.reason


def test_op_level_recompute_is_searched_only_when_named() -> None:
    base = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    }
    default = list(enumerate_layouts(JobSpec(**{k: base[k] for k in ("model", "training", "cluster")}), SearchSpec()))
    assert default and all(lay.recompute != "op" for lay in default)
    allowed = PlanRequest.model_validate({**base, "search": {"allow": {"recompute": ["op", "full"]}}})
    job = JobSpec(model=allowed.model, training=allowed.training, cluster=allowed.cluster)
    assert {lay.recompute for lay in enumerate_layouts(job, allowed.search)} == {"op", "full"}
    fixed = PlanRequest.model_validate({**base, "search": {"fix": {"recompute": "op"}}})
    response = search_plans(fixed)
    assert response.status == "optimal" and response.plans[0].config.recompute == "op"
    assert any("op-level selective checkpointing" in n for n in response.plans[0].notes)


def test_restrictions_that_leave_a_knob_without_values_are_invalid_requests() -> None:
    """search.fix / search.allow that leave no ZeRO stage or recompute mode: a 422 naming the
    field, not an 'infeasible' job."""
    base = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8}}  # fmt: skip
    with pytest.raises(InvalidLayout) as pinned:
        search_plans(_request({**base, "search": {"allow": {"zero_stage": [1]}, "fix": {"zero_stage": 2}}}))
    assert pinned.value.field == "search.fix.zero_stage" and "not among search.allow.zero_stage [1]" in str(
        pinned.value
    )
    with pytest.raises(ValidationError, match="search.allow.recompute: 'moe', the only mode allowed"):
        _request({**base, "search": {"allow": {"recompute": ["moe"]}}})
    with pytest.raises(InvalidLayout, match="DeepSpeed runs zero_stage \\[0, 1\\] with pp > 1"):
        search_plans(_request({**base, "training": {**base["training"], "framework": "deepspeed",
                                                    "grad_reduce_in_fp32": True},
                               "search": {"fix": {"zero_stage": 2, "pp": 2}}}))  # fmt: skip
