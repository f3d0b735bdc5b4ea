"""Framework rules that hold for some jobs only (``[[<framework>.when]]`` in
``optimizer/data/frameworks.toml``), each read in the framework's source at the profile's version:
plans list a framework only when it runs the job as costed, the search with a framework named
keeps to what it runs, and the launch arguments say what the framework needs."""

from __future__ import annotations

import shlex
import tomllib
from typing import Any

import pytest

from optimizer.errors import InvalidLayout
from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import profile
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, JobSpec, ModelSpec, PlanRequest, TrainingSpec

MIXTRAL = {"preset": "mixtral-8x7b"}
DEEPSEEK = {"preset": "deepseek-v3"}
SCOUT = {"preset": "llama4-scout"}
"""An MoE model torchtitan ships (llama4: a shared expert); it has no Mixtral."""


def _training(**knobs: Any) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, global_batch_size=256, **knobs)


def _ids(training: TrainingSpec, model: dict[str, Any]) -> set[str]:
    return {p.id for p in candidate_frameworks(training, ModelSpec(**model))}


def _plan(model: dict[str, Any], gpus: int, search: dict[str, Any] | None = None, **knobs: Any) -> Any:
    return plan(PlanRequest.model_validate({
        "model": model, "training": {"seq_len": 4096, "global_batch_size": 256, **knobs},
        "cluster": {"preset": "dgx-h100", "num_gpus": gpus}, "search": {"top_k": 5, **(search or {})},
    }))  # fmt: skip


def test_megatron_lm_runs_no_fp16_moe_job() -> None:
    assert "megatron-lm" not in _ids(_training(precision="fp16"), MIXTRAL)
    assert "megatron-lm" in _ids(_training(precision="fp16"), {"preset": "llama3-8b"})
    reason = profile("megatron-lm").stack_problem(_training(precision="fp16"), ModelSpec(**MIXTRAL))
    assert reason is not None and "'Expert parallelism is not supported with fp16 training.'" in reason


@pytest.mark.parametrize("fid", ["megatron-lm", "megatron-bridge"])
def test_dispatchers_megatron_core_0_14_runs(fid: str) -> None:
    def runs(**knobs: Any) -> bool:
        return _ids(_training(framework=fid, **knobs), MIXTRAL) == {fid}

    assert not runs(moe_dispatcher="hybridep")
    assert runs(moe_dispatcher="deepep")
    assert not runs(moe_dispatcher="deepep", moe_capacity_factor=1.25)
    assert runs(moe_dispatcher="alltoall", moe_capacity_factor=1.25)
    assert not runs(moe_dispatcher="allgather", ep_comm_overlap=True)
    assert runs(moe_dispatcher="alltoall", ep_comm_overlap=True)


def test_deepep_plans_enable_deepep_on_the_flex_dispatcher() -> None:
    response = _plan(MIXTRAL, 64, moe_dispatcher="deepep", framework="megatron-lm")
    best = response.plans[0]
    assert best.frameworks == ["megatron-lm"] and best.launch.megatron
    args = shlex.split(best.launch.megatron)
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert "--moe-enable-deepep" in args and "--moe-flex-dispatcher-backend" not in args


def test_the_expert_all_to_all_overlap_keeps_megatron_to_interleaved_pipelines_without_full_recompute() -> None:
    search = {"allow": {"pp": [2, 4]}, "top_k": 8}
    response = _plan(MIXTRAL, 64, search, ep_comm_overlap=True, framework="megatron-lm")
    assert response.plans
    assert any(p.config.ep > 1 for p in response.plans)
    for p in response.plans:
        assert p.frameworks == ["megatron-lm"]
        if p.config.ep > 1:
            assert p.config.vpp > 1 and p.config.recompute != "full"
            args = shlex.split(p.launch.megatron)
            assert "--overlap-moe-expert-parallel-comm" in args
            # interleaving: virtual stages, or (an uneven split) the layout string that implies them
            assert "--num-virtual-stages-per-pipeline-rank" in args or "--pipeline-model-parallel-layout" in args
    job = {"model": MIXTRAL, "training": {"seq_len": 4096, "global_batch_size": 256, "ep_comm_overlap": True},
           "cluster": {"preset": "dgx-h100", "num_gpus": 64}}  # fmt: skip
    flat = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 2, "pp": 2, "ep": 8, "recompute": "none"}}))
    assert flat.frameworks == [] and any("expert-parallel pipelines only interleaved" in n for n in flat.notes)


def test_deepspeed_runs_no_moe_and_overlaps_only_zero2_and_3_without_pipelines() -> None:
    assert not candidate_frameworks(_training(framework="deepspeed"), ModelSpec(**MIXTRAL))  # no MoE at all
    overlap = candidate_frameworks(
        _training(framework="deepspeed", dp_comm_overlap=True), ModelSpec(preset="llama3-8b")
    )
    par = overlap[0].parallelism
    assert par.zero_stages_without_pp.value == (2, 3) and par.zero_stages_with_pp.value == ()
    response = _plan({"preset": "llama3-8b"}, 64, framework="deepspeed", dp_comm_overlap=True)
    assert {(p.config.zero_stage, p.config.pp) for p in response.plans} <= {(2, 1), (3, 1)}


def test_torchtitan_splits_experts_over_tp_and_borrows_ep_from_dp_and_cp() -> None:
    response = _plan(SCOUT, 64, {"allow": {"tp": [2]}}, framework="torchtitan")
    assert response.plans
    for p in response.plans:
        c = p.config
        assert c.etp == c.tp == 2 and c.ep % c.cp == 0 and (c.dp * c.cp) % c.ep == 0
        toml = tomllib.loads(p.launch.torchtitan)
        assert "expert_tensor_parallel_degree" not in toml["parallelism"]


def test_torchtitan_runs_deepseek_v3_uncompiled_and_async_tp_without_tp() -> None:
    titan = JobSpec(model=DEEPSEEK, training=_training(framework="torchtitan"),
                    cluster={"preset": "dgx-h100", "num_gpus": 64})  # fmt: skip
    assert titan.training.fused_kernels is False  # the profile's default for MLA models
    compiled = _training(framework="torchtitan", fused_kernels=True)
    assert "torch.compile is not supported yet for deepseekv3" in (
        profile("torchtitan").stack_problem(compiled, ModelSpec(**DEEPSEEK)) or "")  # fmt: skip
    # an MLA model with async TP runs without TP; in fp8 it does not run at all (its experts
    # would stay bf16: test_torchtitan_runs_no_fp8_moe)
    overlap = _training(framework="torchtitan", tp_comm_overlap=True, fused_kernels=False)
    mla = candidate_frameworks(overlap, ModelSpec(**DEEPSEEK))[0]
    assert mla.sizes_problem(2, 1, 1, 1, 1, False, True) is not None
    assert mla.sizes_problem(1, 1, 1, 1, 1, False, False) is None
    assert not candidate_frameworks(_training(framework="torchtitan", precision="fp8", fused_kernels=False),
                                    ModelSpec(**DEEPSEEK))  # fmt: skip


def test_bridge_turns_the_shared_expert_overlap_off_where_megatron_core_refuses_it() -> None:
    job = {"model": DEEPSEEK, "cluster": {"preset": "dgx-h100", "num_gpus": 256}}
    config = {"tp": 2, "pp": 8, "vpp": 2, "ep": 16, "recompute": "selective"}

    def nemo(**knobs: Any) -> dict[str, str]:
        training = {"seq_len": 4096, "global_batch_size": 512, "framework": "megatron-bridge", **knobs}
        result = evaluate(EvaluateRequest.model_validate({**job, "training": training, "config": config}))
        assert result.frameworks == ["megatron-bridge"], result.notes
        return dict(tok.partition("=")[::2] for tok in shlex.split(result.launch.nemo))

    # off always: Megatron-Core refuses it with these two, and elsewhere the plan does not cost it
    assert nemo()["model.moe_shared_expert_overlap"] == "false"
    assert nemo(ep_comm_overlap=True)["model.moe_shared_expert_overlap"] == "false"
    assert nemo(moe_dispatcher="deepep")["model.moe_shared_expert_overlap"] == "false"


def test_the_overlap_rules_leave_layouts_without_expert_parallelism_alone() -> None:
    """The launch asks for the all-to-all overlap only with ep > 1: at ep = 1 Megatron runs
    plain pipelines and full recompute with the knob on, as costed."""
    job = {"model": MIXTRAL, "training": {"seq_len": 4096, "global_batch_size": 256, "ep_comm_overlap": True,
                                          "framework": "megatron-lm"},
           "cluster": {"preset": "dgx-h100", "num_gpus": 64}}  # fmt: skip
    flat = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 2, "pp": 2, "ep": 1, "recompute": "full"}}))
    assert flat.frameworks == ["megatron-lm"]
    assert "--overlap-moe-expert-parallel-comm" not in shlex.split(flat.launch.megatron)
    pinned = plan(PlanRequest.model_validate({**job, "search": {"fix": {"ep": 1, "recompute": "full"}}}))
    assert pinned.plans and all(p.frameworks == ["megatron-lm"] for p in pinned.plans)
    with pytest.raises(InvalidLayout, match="runs no recompute 'full' with ep 8"):
        plan(PlanRequest.model_validate({**job, "search": {"fix": {"ep": 8, "recompute": "full"}}}))


def test_torchtitan_says_nothing_of_experts_for_a_dense_model() -> None:
    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64,
                                                          "framework": "torchtitan"},
           "cluster": {"preset": "dgx-h100", "num_gpus": 8}, "config": {"tp": 2, "zero_stage": 3}}  # fmt: skip
    result = evaluate(EvaluateRequest.model_validate(job))
    assert result.frameworks == ["torchtitan"] and "does not run there" not in result.launch.torchtitan


@pytest.mark.parametrize("fid", ["torchtitan"])
def test_frameworks_that_dispatch_with_an_all_to_all_only(fid: str) -> None:
    training = {"framework": fid}
    assert _ids(_training(**training), SCOUT) == {fid}
    for dispatcher in ("allgather", "deepep", "hybridep"):
        assert _ids(_training(moe_dispatcher=dispatcher, **training), SCOUT) == set()
    assert _ids(_training(moe_dispatcher="deepep", **training), {"preset": "llama3-8b"}) == {fid}  # dense: no effect


def test_deepspeed_runs_no_moe_model() -> None:
    """Its MoE layer gates top-1 or top-2 only, with capacity and einsum dispatch (not costed), at
    any gradient dtype; a dense model runs (bf16 with fp32 gradients: pipelines only, see
    test_deepspeed_grad_dtype); fp16 with fp32 gradients does not."""
    for knobs in ({}, {"grad_reduce_in_fp32": True}, {"precision": "fp16"}):
        assert _ids(_training(framework="deepspeed", **knobs), MIXTRAL) == set()
    assert _ids(_training(framework="deepspeed", grad_reduce_in_fp32=True), {"preset": "llama3-8b"}) == {"deepspeed"}
    assert _ids(_training(framework="deepspeed", grad_reduce_in_fp32=True, precision="fp16"),
                {"preset": "llama3-8b"}) == set()  # fmt: skip


def test_torchtitan_runs_no_fp16() -> None:
    assert _ids(_training(framework="torchtitan", precision="fp16"), {"preset": "llama3-8b"}) == set()
    assert _ids(_training(framework="torchtitan", precision="bf16"), {"preset": "llama3-8b"}) == {"torchtitan"}


def test_torchtitan_runs_no_fp8_moe() -> None:
    """Its float8 converter swaps nn.Linear only: grouped experts would stay bf16, costed FP8."""
    assert _ids(_training(framework="torchtitan", precision="fp8"), SCOUT) == set()
    assert _ids(_training(framework="torchtitan", precision="bf16"), SCOUT) == {"torchtitan"}
    assert _ids(_training(framework="torchtitan", precision="fp8"), {"preset": "llama3-8b"}) == {"torchtitan"}


def test_torchtitan_zero0_only_without_context_parallelism() -> None:
    """With cp > 1 torchtitan shards weights over the cp ranks (parallel_dims.fsdp_enabled): a
    ZeRO-0 layout with cp 2 is not DDP there, even with dp 1; at cp 1 and dp 8 it is."""
    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 8192, "global_batch_size": 8,
           "framework": "torchtitan"}, "cluster": {"preset": "dgx-h100", "num_gpus": 8}}  # fmt: skip
    cp = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 4, "cp": 2, "zero_stage": 0}}))
    assert cp.frameworks == [] and any("zero_stage 0 only with data parallelism alone" in n for n in cp.notes)
    ddp = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 1, "zero_stage": 0}}))
    assert ddp.frameworks == ["torchtitan"]


def test_torchtitan_pipelines_say_what_their_memory_leaves_out() -> None:
    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 8192, "global_batch_size": 64,
           "framework": "torchtitan"}, "cluster": {"preset": "dgx-h100", "num_gpus": 16}}  # fmt: skip
    piped = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 2, "pp": 2, "zero_stage": 1}}))
    assert piped.frameworks == ["torchtitan"]
    assert any("sharded fp32 gradient" in n for n in piped.notes), piped.notes
    flat = evaluate(EvaluateRequest.model_validate({**job, "config": {"tp": 2, "zero_stage": 3}}))
    assert not any("sharded fp32 gradient" in n for n in flat.notes)


def test_megatron_bridge_runs_no_fp4_job() -> None:
    """No NVFP4 mixed-precision recipe at Megatron-Bridge v0.1.0rc4 (mixed_precision.py)."""
    dense = {"preset": "llama3-8b"}
    assert "megatron-bridge" not in _ids(_training(precision="fp4"), dense)
    assert "megatron-bridge" in _ids(_training(precision="fp8", grad_reduce_in_fp32=True), dense)
