"""A plan's notes name the settings of the frameworks that run it, not of the others."""

from __future__ import annotations

from optimizer.plan_notes import DP_OVERLAP_FLAGS, DP_OVERLAP_ZERO3
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest

JOB = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 8192, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 256},
}


def _overlap_note(framework: str | None, config: dict) -> tuple[list[str], str]:
    training = {**JOB["training"], **({"framework": framework} if framework else {})}
    plan = evaluate(EvaluateRequest.model_validate({**JOB, "training": training, "config": config}))
    (note,) = [n for n in plan.notes if "hidden under compute" in n]
    return plan.frameworks, note


def test_the_overlap_note_names_only_the_plans_frameworks() -> None:
    zero3 = {"tp": 2, "pp": 1, "zero_stage": 3, "recompute": "full"}
    frameworks, note = _overlap_note("megatron-lm", zero3)
    assert frameworks == ["megatron-lm"]
    assert DP_OVERLAP_ZERO3["megatron-lm"] in note and "DeepSpeed" not in note and "FSDP2" not in note
    frameworks, note = _overlap_note(None, zero3)  # no framework named: Megatron-LM and DeepSpeed run it
    assert frameworks == ["megatron-lm", "deepspeed"]
    assert DP_OVERLAP_ZERO3["deepspeed"] in note and "FSDP2" not in note
    zero1 = {"tp": 8, "pp": 1, "zero_stage": 1, "recompute": "full"}
    frameworks, note = _overlap_note("megatron-bridge", zero1)
    assert frameworks == ["megatron-bridge"]
    assert DP_OVERLAP_FLAGS["megatron-bridge"] in note and "DeepSpeed" not in note and "--overlap" not in note


def test_a_named_frameworks_plan_has_no_notes_on_the_others_recompute() -> None:
    """torchtitan's selective (costed 'op') on a torchtitan plan: no note on what Megatron's or
    DeepSpeed's recompute would keep; with no framework named the same layout carries them."""
    config = {"tp": 1, "pp": 1, "zero_stage": 3, "recompute": "selective"}
    job = {**JOB, "cluster": {"preset": "dgx-h100", "num_gpus": 8}, "model": {"preset": "llama3-8b"}}
    named = evaluate(EvaluateRequest.model_validate({**job, "training": {**JOB["training"], "framework": "torchtitan"},
                                                     "config": config}))  # fmt: skip
    assert named.frameworks == ["torchtitan"]
    assert not any("Megatron" in n or "DeepSpeed" in n for n in named.notes), named.notes
    portable = evaluate(EvaluateRequest.model_validate({**job, "config": {**config, "recompute": "op"}}))
    assert any(n.startswith("recompute 'op' is torchtitan's") for n in portable.notes)


def test_the_overlap_note_of_a_zero0_plan_names_the_flags_its_launch_sets() -> None:
    """Without ZeRO Megatron's launch sets --overlap-grad-reduce only (--overlap-param-gather needs
    the distributed optimizer), and Megatron-Bridge ddp.overlap_grad_reduce only."""
    zero0 = {"tp": 8, "pp": 1, "zero_stage": 0, "recompute": "full"}
    for framework, flags in (("megatron-lm", "--overlap-grad-reduce"), ("megatron-bridge", "ddp.overlap_grad_reduce")):
        training = {**JOB["training"], "framework": framework}
        plan = evaluate(EvaluateRequest.model_validate({**JOB, "training": training, "config": zero0}))
        (note,) = [n for n in plan.notes if "hidden under compute" in n]
        assert flags in note and "param" not in note
        assert plan.launch is not None
        if framework == "megatron-lm":
            assert "--overlap-grad-reduce" in plan.launch.megatron
            assert "--overlap-param-gather" not in plan.launch.megatron
        else:
            assert "ddp.overlap_grad_reduce=true" in plan.launch.nemo
            assert "ddp.overlap_param_gather=false" in plan.launch.nemo
