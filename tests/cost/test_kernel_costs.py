"""Kernel and precision choices: unfused kernels, FP4, attention kernel classes (with their notes
and launch arguments), unfused attention and unfused cross-entropy."""

from __future__ import annotations

import pytest

from optimizer.cost import best_estimate, build_context, resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec, Layout
from tests.cost.cost_helpers import _scored


def test_unfused_kernels_only_slow_the_memory_bound_work():
    def step(fused: bool) -> tuple[float, dict[str, float]]:
        est = _scored(
            "llama3-8b",
            "dgx-h100",
            8,
            {"seq_len": 8192, "global_batch_size": 16, "fused_kernels": fused},
            tp=1,
            pp=1,
            micro_batch_size=2,
            zero_stage=3,
            recompute="selective",
        )[1]
        return est.step_time_s, est.breakdown_s

    (fused_s, fused), (eager_s, eager) = step(True), step(False)
    assert eager["compute"] > fused["compute"]
    assert 1.10 < eager_s / fused_s < 1.25  # torchtitan measured 1.157x / 1.162x with torch.compile
    assert {k: v for k, v in eager.items() if k not in ("compute", "dp_comm")} == pytest.approx(
        {k: v for k, v in fused.items() if k not in ("compute", "dp_comm")}
    )


def test_fp4_runs_gemms_at_the_fp4_rate_and_keeps_fp4_weight_copies():
    from optimizer.cost.memory import FP4_COPY_BYTES, FP8_COPY_BYTES

    def est(precision: str):
        return _scored(
            "llama3-70b",
            "gb200-nvl72",
            72,
            {"seq_len": 8192, "global_batch_size": 72, "precision": precision},
            tp=8,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute="selective",
        )[1]

    bf16, fp8, fp4 = est("bf16"), est("fp8"), est("fp4")
    assert bf16.step_time_s > fp8.step_time_s > fp4.step_time_s
    # GEMMs run at twice the FP8 rate; attention, elementwise work and communication do not speed up
    assert 1.1 < fp8.breakdown_s["compute"] / fp4.breakdown_s["compute"] < 2.0
    w = {p: e.memory[e.peak_stage].weights_bytes for p, e in (("bf16", bf16), ("fp8", fp8), ("fp4", fp4))}
    assert w["fp4"] / w["bf16"] == pytest.approx((2.0 + FP4_COPY_BYTES) / 2.0)
    assert w["fp8"] / w["bf16"] == pytest.approx((2.0 + FP8_COPY_BYTES) / 2.0)


def test_attention_kernel_class_scales_only_the_attention_core():
    """flash3 (Hopper-native kernels) runs the attention core at ``attention_efficiency_flash3``
    instead of ``attention_efficiency``; GPUs before Hopper run flash2-class kernels either way
    (on A100 at a larger share of its peak)."""
    from optimizer.calibration import DEFAULT
    from optimizer.cost.layer import Dims, attention_core_time_s

    def ctx_for(gpu_preset: str, kernel: str):
        job = JobSpec(
            model={"preset": "llama3-8b"},
            training={"seq_len": 32768, "global_batch_size": 8, "attention_kernel": kernel},
            cluster={"preset": gpu_preset, "num_gpus": 8},
        )
        return job, build_context(job, DEFAULT)

    dims = Dims(tp=1, cp=2, ep=1, micro_batch_size=1, sequence_parallel=False, recompute="none")
    (_, h3), (_, h2) = ctx_for("dgx-h100", "flash3"), ctx_for("dgx-h100", "flash2")
    t3, t2 = (attention_core_time_s(c, c.kinds[0], dims) for c in (h3, h2))
    assert t2 / t3 == pytest.approx(DEFAULT.attention_efficiency_flash3 / DEFAULT.attention_efficiency)
    assert DEFAULT.attention_efficiency_flash3 > DEFAULT.attention_efficiency

    lay = Layout(tp=2, pp=1, cp=2, micro_batch_size=1, zero_stage=1, recompute="none")
    (j3, c3), (j2, c2) = ctx_for("dgx-h100", "flash3"), ctx_for("dgx-h100", "flash2")
    e3, e2 = best_estimate(c3, resolve_layout(j3, lay)), best_estimate(c2, resolve_layout(j2, lay))
    assert e3.step_time_s < e2.step_time_s  # 32k tokens: the attention core is a large share
    assert e3.breakdown_s["tp_comm"] == e2.breakdown_s["tp_comm"] > 0
    assert e3.peak_memory_bytes == e2.peak_memory_bytes

    (a3j, a3), (a2j, a2) = ctx_for("dgx-a100", "flash3"), ctx_for("dgx-a100", "flash2")
    # flash2-class on Ampere, at the A100's FlashAttention-2 share of peak (docs/catalog.md)
    assert (
        a3.attention_efficiency
        == a2.attention_efficiency
        == pytest.approx(DEFAULT.attention_efficiency * 0.656 / 0.339)
    )
    assert (
        best_estimate(a3, resolve_layout(a3j, lay)).step_time_s
        == best_estimate(a2, resolve_layout(a2j, lay)).step_time_s
    )


def test_flash3_on_a_gpu_without_it_is_noted():
    req = EvaluateRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 8192, "global_batch_size": 16, "attention_kernel": "flash3"},
            "cluster": {"preset": "dgx-a100", "num_gpus": 8},
            "config": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"},
        }
    )
    assert any("costed as flash2" in n for n in evaluate(req).notes)
    # the default (not set by the job) stays quiet
    quiet = EvaluateRequest.model_validate(
        {**req.model_dump(exclude_none=True), "training": {"seq_len": 8192, "global_batch_size": 16}}
    )
    assert quiet.training.attention_kernel == "flash2"  # the default is the kernel class the GPU has
    assert not any("attention" in n for n in evaluate(quiet).notes)


def test_launch_arguments_name_the_attention_backend_that_was_costed():
    def megatron(preset: str) -> str:
        req = EvaluateRequest.model_validate(
            {
                "model": {"preset": "llama3-8b"},
                "training": {"seq_len": 8192, "global_batch_size": 16},
                "cluster": {"preset": preset, "num_gpus": 8},
                "config": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "full"},
            }
        )
        return evaluate(req).launch.megatron

    assert "--attention-backend fused" in megatron("dgx-h100")
    assert "--attention-backend flash" in megatron("dgx-a100")  # no Hopper-native kernels there


def test_unfused_attention_keeps_the_scores_unless_recomputed_and_forbids_cp():
    """``attention_kernel: unfused`` materialises the s x s scores: Korthikanti et al.'s 5as^2b
    bytes per layer stay for backward with no recompute, none with selective recompute (the
    attention core is re-run); context parallelism needs a fused kernel."""
    from optimizer.cost.layer import UNFUSED_SCORE_BYTES_STORED

    def est(kernel: str, recompute: str, cp: int = 1):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=2,
            pp=1,
            cp=cp,
            micro_batch_size=1,
            zero_stage=1,
            recompute=recompute,
        )[1]

    scores = 32 * UNFUSED_SCORE_BYTES_STORED * 1 * (32 / 2) * 4096**2  # layers x bytes x b x heads/tp x s^2
    none_u, none_f = est("unfused", "none"), est("flash2", "none")
    assert none_u.memory[0].activations_bytes - none_f.memory[0].activations_bytes == pytest.approx(scores)
    sel_u, sel_f = est("unfused", "selective"), est("flash2", "selective")
    assert sel_u.memory[0].activations_bytes == pytest.approx(sel_f.memory[0].activations_bytes)
    # the scores' HBM round trips make the unfused core slower at 4k tokens, and re-running it
    # (selective recompute) costs more than re-running a flash kernel
    assert none_u.breakdown_s["compute"] > none_f.breakdown_s["compute"]
    assert sel_u.breakdown_s["compute"] - none_u.breakdown_s["compute"] > (
        sel_f.breakdown_s["compute"] - none_f.breakdown_s["compute"]
    )
    with pytest.raises(InvalidLayout) as exc:
        est("unfused", "none", cp=2)
    assert exc.value.field == "config.cp"


def test_unfused_hfu_counts_the_masked_half_of_the_scores():
    def est(kernel: str):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=1,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute="selective",
        )

    (ctx, unfused), (_, flash) = est("unfused"), est("flash2")
    tokens = 8 * 4096
    assert unfused.model_flops_per_step == flash.model_flops_per_step
    extra = unfused.hardware_flops_per_step - flash.hardware_flops_per_step
    assert extra == pytest.approx(ctx.flops.attn_core_forward_per_token * 4 * tokens)  # fwd, bwd (2x), recompute


def test_unfused_cross_entropy_holds_twelve_bytes_a_logit():
    """PyTorch's cross_entropy on fp32 logits (torchtitan) holds 12 bytes per logit at its peak,
    Megatron-Core's fused vocab-parallel loss 6: Llama 3 8B on 8 GPUs, 16,384 tokens a GPU."""
    training = {"seq_len": 8192, "global_batch_size": 16}
    fused = _scored("llama3-8b", "dgx-h100", 8, training, tp=1, pp=1, micro_batch_size=2, zero_stage=3,
                    recompute="op")[1]  # fmt: skip
    unfused = _scored("llama3-8b", "dgx-h100", 8, {**training, "cross_entropy": "unfused"}, tp=1, pp=1,
                      micro_batch_size=2, zero_stage=3, recompute="op")[1]  # fmt: skip
    logits = 2 * 8192 * 128256
    extra = unfused.memory[0].activations_bytes - fused.memory[0].activations_bytes
    assert extra == pytest.approx(6 * logits, rel=1e-9)
    assert unfused.step_time_s > fused.step_time_s  # the loss also moves twice the bytes
