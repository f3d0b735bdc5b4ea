"""A framework that always overlaps a ZeRO stage's data-parallel collectives (Megatron-FSDP at
ZeRO-2/3) does not run it as costed when the job blocks them (``training.dp_comm_overlap`` false)."""

from __future__ import annotations

from optimizer import service
from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import profile
from optimizer.specs import EvaluateRequest, ModelSpec, PlanRequest

DENSE = ModelSpec(preset="llama3-8b")

GPT3 = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_size": 1536},
    "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
}
ZERO3 = {"tp": 4, "pp": 1, "micro_batch_size": 3, "zero_stage": 3, "recompute": "none"}


def _training(framework: str, overlap: bool):
    return PlanRequest.model_validate(
        {**GPT3, "training": {**GPT3["training"], "framework": framework, "dp_comm_overlap": overlap}}
    ).training


def test_the_profiles_say_which_stages_always_overlap() -> None:
    assert profile("megatron-lm").parallelism.zero_stages_always_overlapped.value == (2, 3)
    assert profile("megatron-bridge").parallelism.zero_stages_always_overlapped.value == (2, 3)
    assert profile("deepspeed").parallelism.zero_stages_always_overlapped.value == ()


def test_megatron_blocking_runs_no_sharded_gradients() -> None:
    (overlapped,) = candidate_frameworks(_training("megatron-lm", True), DENSE)
    (blocking,) = candidate_frameworks(_training("megatron-lm", False), DENSE)
    assert overlapped.parallelism.zero_stages_without_pp.value == (0, 1, 2, 3)
    assert blocking.parallelism.zero_stages_without_pp.value == (0, 1)
    assert "megatron_fsdp.py" in blocking.parallelism.zero_stages_without_pp.source
    (deepspeed,) = candidate_frameworks(_training("deepspeed", False), DENSE)
    assert 3 in deepspeed.parallelism.zero_stages_without_pp.value


def test_a_blocking_zero3_layout_runs_on_deepspeed_not_megatron() -> None:
    def frameworks(framework: str) -> list[str]:
        training = {**GPT3["training"], "framework": framework, "dp_comm_overlap": False}
        return service.evaluate(
            EvaluateRequest.model_validate({**GPT3, "training": training, "config": ZERO3})
        ).frameworks

    assert frameworks("deepspeed") == ["deepspeed"]
    assert frameworks("megatron-lm") == []


def test_blocking_megatron_plans_use_no_megatron_fsdp() -> None:
    training = {**GPT3["training"], "framework": "megatron-lm", "dp_comm_overlap": False}
    answer = service.plan(PlanRequest.model_validate({**GPT3, "training": training, "search": {"top_k": 3}}))
    assert answer.plans and all(p.config.zero_stage <= 1 for p in answer.plans)
    assert all("--use-megatron-fsdp" not in (p.launch.megatron or "") for p in answer.plans)
