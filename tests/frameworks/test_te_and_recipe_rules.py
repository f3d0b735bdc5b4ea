"""Rules read in Transformer Engine, Megatron-Core 0.14 and the frameworks' precision recipes: MLA
has no FlashAttention-2 in TE, Bridge's fp16 MoE and fp8 ZeRO-0, torchtitan's missing NVFP4, the
Bridge launch's attention variables and its CUDA_DEVICE_MAX_CONNECTIONS on Megatron-FSDP."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.framework_targets import candidate_frameworks
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, ModelSpec, PlanRequest, TrainingSpec

DEEPSEEK = {"preset": "deepseek-v3"}
LLAMA = {"preset": "llama3-8b"}


def _ids(model: dict[str, Any], **knobs: Any) -> set[str]:
    training = TrainingSpec(seq_len=4096, global_batch_size=256, **knobs)
    return {p.id for p in candidate_frameworks(training, ModelSpec(**model))}


@pytest.mark.parametrize("fid", ["megatron-lm", "megatron-bridge"])
def test_no_flash_attention_2_for_mla(fid: str) -> None:
    """TE disables FlashAttention-2 when key and value head sizes differ; --attention-backend flash
    (NVTE_FLASH_ATTN alone) then leaves no kernel and the run stops at its first forward."""
    assert _ids(DEEPSEEK, framework=fid, attention_kernel="flash2") == set()
    assert _ids(DEEPSEEK, framework=fid, attention_kernel="unfused") == {fid}
    assert _ids(DEEPSEEK, framework=fid, attention_kernel="flash3") == {fid}
    assert _ids(LLAMA, framework=fid, attention_kernel="flash2") == {fid}


def test_deepseek_on_a100_names_the_kernel_megatron_runs() -> None:
    """Before Hopper the job's kernel defaults to flash2: with Megatron-LM named, the plan runs on
    no framework and its note says which kernel to give."""
    body = {"model": DEEPSEEK, "training": {"seq_len": 4096, "global_batch_size": 4096, "framework": "megatron-lm"},
            "cluster": {"preset": "dgx-a100", "num_gpus": 2048}, "search": {"top_k": 1}}  # fmt: skip
    [top] = plan(PlanRequest.model_validate(body)).plans
    assert top.frameworks == [] and any("attention_kernel flash3, cuDNN fused, on Hopper" in n for n in top.notes)
    body["training"]["attention_kernel"] = "flash3"  # costed (and launched) as flash2 on A100: no way around
    [top] = plan(PlanRequest.model_validate(body)).plans
    assert top.frameworks == [] and top.launch.megatron == ""
    body["training"]["attention_kernel"] = "unfused"
    [top] = plan(PlanRequest.model_validate(body)).plans
    assert top.frameworks == ["megatron-lm"] and "--attention-backend unfused" in top.launch.megatron


def test_megatron_bridge_runs_no_fp16_moe_job() -> None:
    assert (
        _ids({"preset": "mixtral-8x7b"}, framework="megatron-bridge", precision="fp16", grad_reduce_in_fp32=False)
        == set()
    )
    assert _ids(LLAMA, framework="megatron-bridge", precision="fp16", grad_reduce_in_fp32=False) == {"megatron-bridge"}


def _bridge_fp8(zero_stage: int, pp: int = 1) -> Any:
    body = {"model": LLAMA, "training": {"seq_len": 4096, "global_batch_size": 256, "precision": "fp8",
            "framework": "megatron-bridge"}, "cluster": {"preset": "dgx-h100", "num_gpus": 16},
            "config": {"tp": 1, "pp": pp, "zero_stage": zero_stage}}  # fmt: skip
    return evaluate(EvaluateRequest.model_validate(body))


def test_megatron_bridge_fp8_keeps_fp8_weights_only_with_the_distributed_optimizer() -> None:
    """Its fp8 recipes set fp8_param_gather, which only the distributed optimizer re-quantizes."""
    assert _bridge_fp8(0).frameworks == [] and _bridge_fp8(0, pp=4).frameworks == []
    assert _bridge_fp8(1).frameworks == ["megatron-bridge"]
    assert _bridge_fp8(1, pp=4).frameworks == ["megatron-bridge"]


def test_torchtitan_runs_no_fp4_job() -> None:
    assert _ids(LLAMA, framework="torchtitan", precision="fp4") == set()
    assert _ids(LLAMA, framework="torchtitan", precision="fp8") == {"torchtitan"}


def _bridge_plan(config: dict[str, Any], gpu: str = "h100-sxm-80gb", kernel: str | None = None) -> Any:
    training: dict[str, Any] = {"seq_len": 4096, "global_batch_size": 256, "framework": "megatron-bridge"}
    if kernel:
        training["attention_kernel"] = kernel
    body = {"model": {"preset": "llama3-70b"}, "training": training,
            "cluster": {"preset": "dgx-h100", "gpu": gpu, "num_gpus": 64}, "config": config}  # fmt: skip
    return evaluate(EvaluateRequest.model_validate(body))


def test_bridge_launch_selects_the_costed_attention_kernel_through_te() -> None:
    p = _bridge_plan({"tp": 4, "pp": 2, "zero_stage": 1}, kernel="unfused")
    assert p.frameworks == ["megatron-bridge"]
    assert p.launch.nemo_env == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}
    assert "model.attention_backend=unfused" in p.launch.nemo and p.launch.megatron_env == {}


def test_bridge_megatron_fsdp_with_tp_says_bridge_sets_one_connection() -> None:
    note = "Megatron-Bridge sets CUDA_DEVICE_MAX_CONNECTIONS=1 for TP/CP before Blackwell"
    fsdp_tp = _bridge_plan({"tp": 4, "pp": 1, "zero_stage": 3})
    assert fsdp_tp.frameworks == ["megatron-bridge"] and any(n.startswith(note) for n in fsdp_tp.notes)
    assert not any(n.startswith(note) for n in _bridge_plan({"tp": 4, "pp": 2, "zero_stage": 1}).notes)
    assert not any(n.startswith(note) for n in _bridge_plan({"tp": 4, "pp": 1, "zero_stage": 3}, gpu="b200").notes)
    # Qwen3's recipe has no comm_overlap section: Bridge never reaches its setter
    qwen = {"model": {"preset": "qwen3-30b-a3b"}, "training": {"seq_len": 4096, "global_batch_size": 256,
            "framework": "megatron-bridge"}, "cluster": {"preset": "dgx-h100", "num_gpus": 64},
            "config": {"tp": 4, "pp": 1, "ep": 1, "zero_stage": 3}}  # fmt: skip
    qwen_plan = evaluate(EvaluateRequest.model_validate(qwen))
    assert qwen_plan.frameworks == ["megatron-bridge"] and not any(n.startswith(note) for n in qwen_plan.notes)
