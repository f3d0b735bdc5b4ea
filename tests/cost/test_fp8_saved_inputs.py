"""``training.fp8_saved_inputs``: with fp8 GEMMs a Transformer Engine stack keeps each GEMM's
quantized input for backward (1 byte an element), torchao's float8 linears the 16-bit one. Checked
against hand-computed bytes of one layer, as invariants over every recompute mode, and in the
framework profiles."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.cost import build_context
from optimizer.cost.layer import layer_cost
from optimizer.cost.rules import Dims
from optimizer.cost.topology import axis_groups
from optimizer.frameworks import profile, stack_defaults
from optimizer.modes import RecomputeMode
from optimizer.specs import JobSpec, TrainingSpec

SEQ = 4096
DENSE = {"preset": "llama3-8b"}  # hidden 4,096, SwiGLU FFN 14,336
MOE = {"preset": "mixtral-8x7b"}  # hidden 4,096, 8 experts, top 2


def _job(model: dict[str, Any], precision: str, saved: bool) -> JobSpec:
    return JobSpec(
        model=model,
        training={"seq_len": SEQ, "global_batch_size": 64, "precision": precision, "fp8_saved_inputs": saved},
        cluster={"preset": "dgx-h100", "num_gpus": 8},
    )


def _stored_bytes(model: dict[str, Any], recompute: str, *, precision: str = "fp8", saved: bool = True,
                  tp: int = 1, sp: bool = False) -> float:  # fmt: skip
    job = _job(model, precision, saved)
    ctx = build_context(job)
    kind = next(k for k in ctx.kinds if k.is_moe) if job.model.moe else ctx.kinds[0]
    d = Dims(tp, 1, 1, 1, sp, recompute)
    groups = axis_groups(
        ctx.topology, ("tp", "cp", "ep", "dp", "pp"), {"tp": tp, "cp": 1, "ep": 1, "dp": 8 // tp, "pp": 1}
    )
    return layer_cost(ctx, kind, d, groups).stored_act_bytes


def test_dense_layer_without_recompute_keeps_three_gemm_inputs_in_one_byte() -> None:
    # the two norm outputs (4,096 each, inputs of the QKV and FC1 GEMMs) and the SwiGLU output
    # (14,336, FC2's input): 22,528 elements a token, one byte each instead of two
    saved = _stored_bytes(DENSE, "none")
    kept = _stored_bytes(DENSE, "none", saved=False)
    assert kept - saved == pytest.approx((4096 + 4096 + 14336) * SEQ)


def test_tensor_and_sequence_parallel_split_the_saving() -> None:
    # TP 2 with sequence parallelism: norm outputs split over the sequence, the SwiGLU output over
    # the FFN width
    kept = _stored_bytes(DENSE, "none", saved=False, tp=2, sp=True)
    saved = _stored_bytes(DENSE, "none", tp=2, sp=True)
    assert kept - saved == pytest.approx((4096 + 4096 + 14336) / 2 * SEQ)


def test_megatron_selective_keeps_the_quantized_norm_and_activation_outputs() -> None:
    # core_attn keeps what none keeps apart from the attention core: the same saving
    none_gap = _stored_bytes(DENSE, "none", saved=False) - _stored_bytes(DENSE, "none")
    core_gap = _stored_bytes(DENSE, "core_attn", saved=False) - _stored_bytes(DENSE, "core_attn")
    assert core_gap == pytest.approx(none_gap)


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_modes_that_re_make_the_gemm_inputs_save_nothing_on_a_dense_layer(recompute: str) -> None:
    assert _stored_bytes(DENSE, recompute) == pytest.approx(_stored_bytes(DENSE, recompute, saved=False))


def test_moe_layer_keeps_the_routed_experts_inputs_in_one_byte_under_selective() -> None:
    # each token's top-2 routed copies of the 4,096-wide expert input (times the calibrated
    # routing skew on the busiest rank); the norm outputs are re-made
    skew = build_context(_job(MOE, "fp8", True)).cal.ep_load_imbalance
    gap = _stored_bytes(MOE, "selective", saved=False) - _stored_bytes(MOE, "selective")
    assert gap == pytest.approx(2 * skew * 4096 * SEQ)


@pytest.mark.parametrize("model", [DENSE, MOE])
@pytest.mark.parametrize("recompute", [m.value for m in RecomputeMode])
def test_quantized_inputs_never_need_more_memory(model: dict[str, Any], recompute: str) -> None:
    assert _stored_bytes(model, recompute) <= _stored_bytes(model, recompute, saved=False)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_knob_does_nothing_with_16_bit_gemms(precision: str) -> None:
    assert _stored_bytes(DENSE, "none", precision=precision) == _stored_bytes(
        DENSE, "none", precision=precision, saved=False
    )


def test_profiles_name_the_stack_that_keeps_quantized_inputs() -> None:
    assert stack_defaults("megatron-lm")["fp8_saved_inputs"] is True
    assert stack_defaults("megatron-bridge")["fp8_saved_inputs"] is True
    assert stack_defaults("torchtitan")["fp8_saved_inputs"] is False
    assert (
        TrainingSpec(seq_len=SEQ, global_batch_size=64, precision="fp8", framework="torchtitan").fp8_saved_inputs
        is False
    )


def test_torchtitan_flags_the_knob_only_with_fp8_gemms() -> None:
    titan = profile("torchtitan")
    knobs = stack_defaults("torchtitan")
    fp8 = TrainingSpec(seq_len=SEQ, global_batch_size=64, precision="fp8", **{**knobs, "fp8_saved_inputs": True})
    bf16 = TrainingSpec(seq_len=SEQ, global_batch_size=64, precision="bf16", **{**knobs, "fp8_saved_inputs": True})
    assert "fp8_saved_inputs" in (titan.stack_problem(fp8, _job(DENSE, "fp8", True).model) or "")
    assert titan.stack_problem(bf16, _job(DENSE, "bf16", True).model) is None


def _layer_gap(model: dict[str, Any], recompute: str, moe_layer: bool) -> float:
    """Stored bytes without quantized inputs minus with, for one layer of ``model`` (8 H100,
    TP 1), per token."""
    out = []
    for saved in (False, True):
        ctx = build_context(_job(model, "fp8", saved))
        kind = next(k for k in ctx.kinds if k.is_moe == moe_layer)
        groups = axis_groups(
            ctx.topology, ("tp", "cp", "ep", "dp", "pp"), {"tp": 1, "cp": 1, "ep": 1, "dp": 8, "pp": 1}
        )
        out.append(layer_cost(ctx, kind, Dims(1, 1, 1, 1, False, recompute), groups).stored_act_bytes)
    return (out[0] - out[1]) / SEQ


def test_mla_layers_keep_the_first_norm_output_twice_quantized() -> None:
    # DeepSeek-V3's dense layers: the q and kv down-projections are two linear layers, each keeping
    # its own fp8 copy of the norm output (2 bytes, no saving); the second norm output (7,168) and
    # the activation output (18,432) save a byte each
    assert _layer_gap({"preset": "deepseek-v3"}, "none", moe_layer=False) == pytest.approx(7168 + 18432)


def test_shared_experts_add_a_quantized_copy_of_the_second_norm_output() -> None:
    # DeepSeek-V3's MoE layers: 8 routed copies (times the routing skew) of the 7,168-wide expert
    # input and of the 2,048-wide activation output, the shared expert's 2,048-wide activation
    # output, less the shared expert's own fp8 copy of the 7,168-wide norm output
    ctx = build_context(_job({"preset": "deepseek-v3"}, "fp8", True))
    routed = 8 * ctx.cal.ep_load_imbalance
    gap = _layer_gap({"preset": "deepseek-v3"}, "none", moe_layer=True)
    assert gap == pytest.approx(routed * (7168 + 2048) + 2048 - 7168)
    # selective re-makes the norm outputs: only the routed inputs save, no extra copy
    assert _layer_gap({"preset": "deepseek-v3"}, "selective", moe_layer=True) == pytest.approx(routed * 7168)
