"""MoE plans launch what each framework runs (Megatron-LM 000c4ac2, Megatron-Bridge 6725f7049,
torchtitan 6404b932): the expert all-to-all overlap's schedule, the flex dispatcher's TPxEP
assertion, Bridge's DDP copy of ``delay_wgrad_compute``, the providers' shared-expert overlap and
the models torchtitan ships."""

from __future__ import annotations

import shlex

import pytest

from optimizer.cost.rules import ResolvedLayout
from optimizer.framework_runs import running_frameworks
from optimizer.framework_targets import candidate_frameworks
from optimizer.launch import build_launch
from optimizer.service import evaluate
from optimizer.specs import ClusterSpec, EvaluateRequest, JobSpec, Layout, ModelSpec, TrainingSpec

QWEN3 = ModelSpec.model_validate({"preset": "qwen3-235b-a22b"})
DSV3 = ModelSpec.model_validate({"preset": "deepseek-v3"})


def _resolved(model: ModelSpec, training: TrainingSpec, gpus: int, **layout: object) -> ResolvedLayout:
    job = JobSpec(model=model, training=training, cluster=ClusterSpec(preset="dgx-h100", num_gpus=gpus))
    return ResolvedLayout.from_spec(Layout.model_validate(layout), job)


def _nemo(args: str) -> dict[str, str]:
    return dict(tok.partition("=")[::2] for tok in shlex.split(args))


def test_moe_recompute_and_zero3_do_not_run_with_the_expert_overlap() -> None:
    """The combined 1F1B schedule of --overlap-moe-expert-parallel-comm calls the MoE layer's
    parts one by one: the 'moe' recompute module (a checkpoint around MoELayer.forward) never
    runs, and Megatron-FSDP's TransformerLayer hooks never fire."""
    overlap = TrainingSpec(seq_len=4096, global_batch_size=512, ep_comm_overlap=True, grad_reduce_in_fp32=True)
    plain = overlap.model_copy(update={"ep_comm_overlap": False})
    moe_rc = {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "moe"}
    for training, expected in ((overlap, set()), (plain, {"megatron-lm", "megatron-bridge"})):
        lay = _resolved(QWEN3, training, 256, **moe_rc)
        runs, _ = running_frameworks(training, lay, QWEN3)
        assert {p.id for p in runs} == expected
    z3 = {"tp": 1, "pp": 1, "ep": 8, "micro_batch_size": 1, "zero_stage": 3, "recompute": "none"}
    runs, why = running_frameworks(overlap, _resolved(QWEN3, overlap, 256, **z3), QWEN3)
    assert runs == [] and why
    # without the overlap ZeRO-3 with ep 8 runs on Megatron-LM's Megatron-FSDP; Bridge's Megatron-Core
    # 0.14.0 has no expert-parallel groups in Megatron-FSDP
    runs, why = running_frameworks(plain, _resolved(QWEN3, plain, 256, **z3), QWEN3)
    assert {p.id for p in runs} == {"megatron-lm"}
    # ep 1: the launch asks for no overlap, so ZeRO-3 runs with the knob on
    runs, _ = running_frameworks(overlap, _resolved(QWEN3, overlap, 256, **{**z3, "ep": 1}), QWEN3)
    assert {p.id for p in runs} == {"megatron-lm", "megatron-bridge"}


def test_flex_dispatcher_needs_more_than_one_expert_rank() -> None:
    """DeepEP with ep x etp = 1 launches the all-to-all dispatcher: the flex dispatcher asserts
    "Flex token dispatcher requires TPxEP > 1"; with ep 8 it is flex with DeepEP."""
    training = TrainingSpec(seq_len=4096, global_batch_size=512, moe_dispatcher="deepep")
    one = build_launch(QWEN3, training, _resolved(QWEN3, training, 256, tp=1, pp=8, ep=1, micro_batch_size=1,
                                                    zero_stage=1, recompute="full"), ("megatron", "nemo"))  # fmt: skip
    assert one.megatron is not None and one.nemo is not None
    toks = shlex.split(one.megatron)
    assert toks[toks.index("--moe-token-dispatcher-type") + 1] == "alltoall" and "--moe-enable-deepep" not in toks
    assert _nemo(one.nemo)["model.moe_token_dispatcher_type"] == "alltoall"
    assert "model.moe_enable_deepep" not in _nemo(one.nemo)
    eight = build_launch(QWEN3, training, _resolved(QWEN3, training, 256, tp=1, pp=8, ep=8, micro_batch_size=1,
                                                      zero_stage=1, recompute="full"), ("megatron", "nemo"))  # fmt: skip
    assert eight.megatron is not None and "--moe-token-dispatcher-type flex --moe-enable-deepep" in eight.megatron


def test_bridge_expert_overlap_sets_the_ddp_field_and_shared_experts_stay_serial() -> None:
    """Bridge copies delay_wgrad_compute into the DDP config only with the distributed optimizer,
    so the overrides name it; the DeepSeek provider turns the shared-expert overlap on, which the
    plan does not cost, whatever the dispatcher."""
    training = TrainingSpec(seq_len=4096, global_batch_size=1024, ep_comm_overlap=True)
    lay = _resolved(DSV3, training, 1024, tp=1, pp=8, vpp=2, ep=64, micro_batch_size=1, zero_stage=0,
                    recompute="none")  # fmt: skip
    nemo = _nemo(build_launch(DSV3, training, lay, ("nemo",)).nemo or "")
    assert nemo["comm_overlap.delay_wgrad_compute"] == nemo["ddp.delay_wgrad_compute"] == "true"
    plain = training.model_copy(update={"ep_comm_overlap": False})
    nemo = _nemo(build_launch(DSV3, plain, lay, ("nemo",)).nemo or "")
    assert nemo["model.moe_shared_expert_overlap"] == "false" and "ddp.delay_wgrad_compute" not in nemo


@pytest.mark.parametrize(("preset", "runs"), [("qwen3-235b-a22b", False), ("mixtral-8x22b", False),
                                              ("gpt3-175b", False), ("llama4-maverick", True), ("llama3-70b", True)])  # fmt: skip
def test_torchtitan_runs_the_models_it_ships(preset: str, runs: bool) -> None:
    """torchtitan's train specs: llama3 (dense, SwiGLU), llama4 and deepseek_v3 (MoE with shared
    experts); Qwen3 and Mixtral MoE and GELU models are not registered."""
    training = TrainingSpec(seq_len=4096, global_batch_size=256, framework="torchtitan")
    model = ModelSpec.model_validate({"preset": preset})
    assert bool(candidate_frameworks(training, model)) is runs


def test_notes_for_bridge_current_scaling_and_the_te_version() -> None:
    """An fp8 plan with the 'moe' recompute (layernorm among its modules: per-tensor current
    scaling) on Bridge runs its first and last layer in bf16; a Megatron-LM plan with the expert
    overlap and overlapped gradient reduction needs Transformer Engine 2.8."""
    req = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 512, "precision": "fp8", "grad_reduce_in_fp32": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "config": {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "moe"},
    }
    plan = evaluate(EvaluateRequest.model_validate(req))
    assert "megatron-bridge" in plan.frameworks
    assert any(n.startswith("Megatron-Bridge: bf16_with_fp8_current_scaling_mixed") for n in plan.notes)
    overlap = {**req, "training": {**req["training"], "ep_comm_overlap": True, "precision": "bf16"},
               "config": {**req["config"], "recompute": "none"}}  # fmt: skip
    plan = evaluate(EvaluateRequest.model_validate(overlap))
    assert "megatron-lm" in plan.frameworks
    assert any("needs Transformer Engine 2.8" in n for n in plan.notes)
    assert not any(n.startswith("Megatron-Bridge: bf16_with_fp8") for n in plan.notes)


def test_a_pinned_zero3_with_pinned_ep_under_the_overlap_is_refused_at_its_field() -> None:
    """Megatron-LM named, the expert overlap on, ep 8 and ZeRO-3 pinned: no layout runs it, so
    the pin is a 422 at search.fix.zero_stage naming the rule (it was an empty answer)."""
    from optimizer.errors import InvalidLayout
    from optimizer.service import plan
    from optimizer.specs import PlanRequest

    req = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 512, "ep_comm_overlap": True, "framework": "megatron-lm",
                     "grad_reduce_in_fp32": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"fix": {"zero_stage": 3, "ep": 8, "pp": 1}},
    }  # fmt: skip
    with pytest.raises(InvalidLayout) as exc:
        plan(PlanRequest.model_validate(req))
    assert exc.value.field == "search.fix.zero_stage" and "with ep > 1" in exc.value.reason
    ep1 = {**req, "search": {"fix": {"zero_stage": 3, "ep": 1, "pp": 1}}}
    assert plan(PlanRequest.model_validate(ep1)).plans  # ep 1: no overlap, ZeRO-3 runs


@pytest.mark.parametrize(("ep", "etp", "runs"), [(64, 1, True), (128, 1, True), (128, 2, False), (64, 4, False)])
def test_deepep_runs_the_group_sizes_it_has_configs_for(ep: int, etp: int, runs: bool) -> None:
    """DeepEP's recommended configs cover 2-160 ranks (2, 4, ..., 128, 144, 160) and it asserts on
    other sizes: an expert group (ep x etp) of 256 runs on no framework with `deepep`."""
    training = TrainingSpec(seq_len=4096, global_batch_size=4096, moe_dispatcher="deepep", grad_reduce_in_fp32=True)
    lay = _resolved(DSV3, training, 4096, tp=4, pp=16, ep=ep, etp=etp, micro_batch_size=1, zero_stage=1,
                    recompute="full")  # fmt: skip
    found, why = running_frameworks(training, lay, DSV3)
    assert bool(found) is runs, why
    if not runs:
        assert any("expert groups (ep x etp)" in w for w in why)
    alltoall = training.model_copy(update={"moe_dispatcher": "alltoall"})
    assert running_frameworks(alltoall, _resolved(DSV3, alltoall, 4096, tp=4, pp=16, ep=ep, etp=etp,
                                                  micro_batch_size=1, zero_stage=1, recompute="full"), DSV3)[0]  # fmt: skip
