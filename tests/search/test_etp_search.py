"""Expert tensor parallelism in the search: the default space (``etp`` 1 and ``tp``, MoE models,
where a target framework runs it), ``search.allow`` / ``search.fix``, the framework profiles,
and agreement with the brute-force oracle on jobs whose space holds ``etp > 1``."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.errors import InvalidLayout
from optimizer.search.space import Reach, enumerate_layouts
from optimizer.service import search_plans as search
from optimizer.specs import JobSpec, PlanRequest
from tests.search.test_search import check_against_oracle

MOE_JOB: dict[str, Any] = {
    "model": {
        "name": "g", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "ffn_hidden_size": 512,
        "vocab_size": 1024, "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024},
    },
    "training": {"seq_len": 1024, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {"top_k": 3, "allow": {"vpp": [1], "recompute": ["none", "full"], "zero_stage": [1]}},
}  # fmt: skip


def _space(job: dict[str, Any]) -> list:
    req = PlanRequest.model_validate(job)
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    return list(enumerate_layouts(spec, req.search, Reach.ALL))


def _with(job: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**job, **{k: v for k, v in changes.items() if k != "training"}}
    if "training" in changes:
        out["training"] = {**job["training"], **changes["training"]}
    return out


def test_default_space_has_etp_one_and_tp() -> None:
    space = _space(MOE_JOB)
    pairs = {(lay.tp, lay.etp) for lay in space}
    assert {(2, 2), (4, 4), (2, 1), (4, 1)} <= pairs
    assert all(lay.etp in (1, lay.tp) for lay in space)
    for lay in space:  # the expert block tiles tp x cp x dp
        assert (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.etp) == 0


def test_allow_widens_and_fix_pins_etp() -> None:
    wide = _space(
        _with(MOE_JOB, search={**MOE_JOB["search"], "allow": {**MOE_JOB["search"]["allow"], "etp": [1, 2, 4, 8]}})
    )
    assert {(lay.tp, lay.etp) for lay in wide} >= {(1, 2), (1, 4), (2, 4), (1, 8)}
    pinned = _space(_with(MOE_JOB, search={**MOE_JOB["search"], "fix": {"etp": 4}}))
    assert pinned and {lay.etp for lay in pinned} == {4}


def test_dense_models_search_etp_one_and_reject_a_pinned_etp() -> None:
    dense = {**MOE_JOB, "model": {k: v for k, v in MOE_JOB["model"].items() if k != "moe"}}
    assert {lay.etp for lay in _space(dense)} == {1}
    with pytest.raises(InvalidLayout, match="needs an MoE model") as err:
        search(PlanRequest.model_validate(_with(dense, search={"fix": {"etp": 2}})))
    assert err.value.field == "search.fix.etp"


@pytest.mark.parametrize(
    ("framework", "allowed"),
    [("megatron-lm", "any"), ("megatron-bridge", "any"), ("torchtitan", "tp"), ("deepspeed", "one_or_tp")],
)
def test_framework_profiles_bound_the_etp_searched(framework: str, allowed: str) -> None:
    job = _with(MOE_JOB, training={"framework": framework},
                search={"allow": {"vpp": [1], "zero_stage": [1], "etp": [1, 2, 4, 8]}})  # fmt: skip
    space = _space(job)
    assert space
    etps = {lay.etp for lay in space}
    if allowed == "any":
        assert {1, 2, 4, 8} <= etps
    elif allowed == "tp":  # experts split over the dense TP group, EP from dp x cp
        assert all(lay.etp == lay.tp and lay.ep % lay.cp == 0 and (lay.dp * lay.cp) % lay.ep == 0 for lay in space)
        assert {lay.tp for lay in space} >= {1, 2}
    else:
        assert etps >= {1, 2} and all(lay.etp in (1, lay.tp) for lay in space)
        assert all(lay.dp % lay.ep == 0 for lay in space if lay.etp > 1)


@pytest.mark.slow
@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "allgather"])
def test_planner_agrees_with_brute_force_with_etp(dispatcher: str) -> None:
    job = _with(MOE_JOB, training={"moe_dispatcher": dispatcher},
                search={**MOE_JOB["search"], "allow": {**MOE_JOB["search"]["allow"], "etp": [1, 2, 4]}})  # fmt: skip
    response = check_against_oracle(job)
    assert response.plans


@pytest.mark.slow
def test_etp_can_win_and_plans_launch_it() -> None:
    """Few experts, a wide expert FFN and tp 4 pinned: with experts split over the TP group
    (etp 4) the expert GEMMs run on 4x the rows; the plans carry the etp they were costed with."""
    job = _with(MOE_JOB, search={"top_k": 5, "fix": {"tp": 4}, "allow": {"vpp": [1], "zero_stage": [1]}})
    response = check_against_oracle(job)
    for p in response.plans:
        assert p.config.etp in (1, 4)
        if p.launch is not None and p.launch.megatron:
            assert f"--expert-tensor-parallel-size {p.config.etp}" in p.launch.megatron
