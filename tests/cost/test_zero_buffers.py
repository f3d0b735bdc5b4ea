"""What ZeRO-2/3 hold beside the shards (``cost.zero_buffers``, ``training.fsdp_buffers``):
Megatron-FSDP's reduce-scatter queue, parameter prefetch and gathered embedding and output layer
(Megatron-LM 000c4ac2 ``megatron_fsdp.py``), FSDP2's whole layers, reduce-dtype gradient copies
and kept output layer (torch ``_fsdp_collectives.py``, torchtitan ``apply_fsdp``), against
DeepSpeed's layer ahead."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.frameworks import profile
from optimizer.params import layer_params
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, ModelSpec
from optimizer.units import GIB

H, KV, FFN, VOCAB, LAYERS = 4096, 1024, 14336, 128256, 32
"""Llama 3 8B (the preset): hidden size, key/value width (8 heads of 128), FFN, vocabulary."""
LAYER = 2 * H * H + 2 * H * KV + 3 * H * FFN + 2 * H  # q and o, k and v, gated MLP, two norms
EMBEDDING = VOCAB * H  # and as many in the untied output layer
UNIT = 1e9  # Megatron-FSDP's communication unit: max(1e9, 2 x the 218M-parameter layer)


def _memory_gib(
    zero_stage: int, fsdp_buffers: str | None, model: dict[str, Any] | None = None, **training: Any
) -> float:
    knobs = {"fsdp_buffers": fsdp_buffers} if fsdp_buffers else {}
    plan = evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-8b", **(model or {})},
        "training": {"seq_len": 8192, "global_batch_size": 64, **knobs, **training},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "config": {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": zero_stage, "recompute": "none"},
    }))  # fmt: skip
    return plan.memory_gib.buffers


def test_zero3_hand_computed() -> None:
    """DP8, bf16 weights and gradients. FSDP2: two layers gathered, 7/8 of them not local.
    Megatron-FSDP: one layer plus 5e8 elements gathered (7/8 not local), 1e9 + one layer of
    unsharded bf16 gradients queued, and the embedding and output layer gathered (7/8 not
    local): 4.44 GiB more."""
    layer_gathered = 2 * LAYER * 7 / 8 * 2
    megatron = (LAYER + UNIT / 2) * 7 / 8 * 2 + (UNIT + LAYER) * 2 + 2 * EMBEDDING * 7 / 8 * 2
    extra = megatron - layer_gathered
    assert extra / GIB == pytest.approx(4.44, abs=0.005)
    assert _memory_gib(3, "megatron-fsdp") - _memory_gib(3, "layer") == pytest.approx(extra / GIB, rel=1e-6)
    # no framework named: the larger, Megatron-FSDP's
    assert _memory_gib(3, None) == pytest.approx(_memory_gib(3, "megatron-fsdp"), rel=1e-12)


def test_zero2_queue_and_fp32_gradients() -> None:
    """ZeRO-2 keeps whole weights: Megatron-FSDP adds only its queue (1e9 + a layer of gradient
    elements) in place of two 160 MB buckets; fp32 gradients double the queue."""
    bucket = 160e6  # the calibration's dp_bucket_bytes (two kept)
    queue = (UNIT + LAYER) * 2
    assert _memory_gib(2, "megatron-fsdp") - _memory_gib(2, "layer") == pytest.approx(
        (queue - 2 * bucket) / GIB, rel=1e-6
    )
    fp32 = _memory_gib(2, "megatron-fsdp", grad_reduce_in_fp32=True) - _memory_gib(2, "layer", grad_reduce_in_fp32=True)
    assert fp32 == pytest.approx((2 * queue - 2 * bucket) / GIB, rel=1e-6)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_below_zero2_the_knob_changes_nothing(zero_stage: int) -> None:
    assert _memory_gib(zero_stage, "megatron-fsdp") == _memory_gib(zero_stage, "layer")


@pytest.mark.parametrize(("fid", "value"), [("megatron-lm", "megatron-fsdp"), ("megatron-bridge", "megatron-fsdp"),
                                            ("torchtitan", "fsdp2"), ("deepspeed", "layer")])  # fmt: skip
def test_profiles_name_their_buffers(fid: str, value: str) -> None:
    knob = profile(fid).stack["fsdp_buffers"]
    assert knob.default == value and knob.runs == (value,)


@pytest.mark.parametrize(("fp32", "grad_bytes"), [(False, 2), (True, 4)])
def test_fsdp2_zero3_hand_computed(fp32: bool, grad_bytes: int) -> None:
    """DP8. A layer's backward: two layers gathered whole (bf16) and one layer's bf16 gradients
    next to their reduce-dtype copy: 1.74 GB with bf16 reduction, 2.18 GB with fp32
    (torchtitan's), against 0.76 GB for DeepSpeed's layers (7/8 of two gathered). The output
    layer kept gathered (1.05 GB) is less."""
    layers = 2 * LAYER * 2 + LAYER * (2 + grad_bytes)
    assert layers > EMBEDDING * 2
    deepspeed = 2 * LAYER * 7 / 8 * 2
    got = _memory_gib(3, "fsdp2", grad_reduce_in_fp32=fp32) - _memory_gib(3, "layer", grad_reduce_in_fp32=fp32)
    assert got == pytest.approx((layers - deepspeed) / GIB, rel=1e-6)
    assert layers / 1e9 == pytest.approx(2.18 if fp32 else 1.74, abs=0.005)


def test_fsdp2_zero3_output_layer_when_larger() -> None:
    """A 1M-entry vocabulary makes the output layer (4.2B parameters, 8.4 GB gathered) the larger."""
    big_vocab = {"vocab_size": 1 << 20}
    head = (1 << 20) * H * 2
    assert _memory_gib(3, "fsdp2", big_vocab) - _memory_gib(3, "layer", big_vocab) == pytest.approx(
        (head - 2 * LAYER * 7 / 8 * 2) / GIB, rel=1e-6
    )


def test_fsdp2_zero2_gradient_copies() -> None:
    """ZeRO-2 keeps whole weights: a layer's bf16 gradients and their fp32 copy (6 bytes a
    parameter) in place of two 160 MB buckets."""
    bucket = 160e6
    got = _memory_gib(2, "fsdp2", grad_reduce_in_fp32=True) - _memory_gib(2, "layer", grad_reduce_in_fp32=True)
    assert got == pytest.approx((LAYER * 6 - 2 * bucket) / GIB, rel=1e-6)


def test_no_framework_named_charges_the_larger_buffers() -> None:
    """Without a named framework the buffers are the largest the candidate frameworks hold:
    Megatron-FSDP's with a Megatron framework among them, else FSDP2's over DeepSpeed's."""
    from optimizer.framework_runs import costed_fsdp_buffers
    from optimizer.specs import ModelSpec, TrainingSpec

    model = ModelSpec.model_validate({"preset": "llama3-8b"})
    bf16 = TrainingSpec.model_validate({"seq_len": 8192, "global_batch_size": 64})
    assert costed_fsdp_buffers(bf16, model) == "megatron-fsdp"
    # a stack both torchtitan and DeepSpeed run (the unfused loss rules out the Megatron ones)
    stack = {"attention_kernel": "flash2", "cross_entropy": "unfused", "tp_dgrad_overlap": False,
             "grad_reduce_in_fp32": True}  # fmt: skip
    titan_like = TrainingSpec.model_validate({"seq_len": 8192, "global_batch_size": 64, **stack})
    assert costed_fsdp_buffers(titan_like, model) == "fsdp2"
    # 16-bit gradients (torchtitan reduces in fp32) and blocking pipeline p2p (DeepSpeed's engine)
    deepspeed_only = titan_like.model_copy(update={"grad_reduce_in_fp32": False, "pp_comm_overlap": False})
    assert costed_fsdp_buffers(deepspeed_only, model) == "layer"


def test_megatron_fsdp_unit_is_fixed_at_bridges_megatron_core() -> None:
    """Megatron-Core 0.14.0 (Megatron-Bridge's pin) takes 1e9 elements as the communication unit;
    000c4ac2 (Megatron-LM's profile) at least twice the average layer. Llama 3.1 405B at TP4,
    ZeRO-3: its largest layer has L parameters on a rank (above 5e8), so Bridge's reduce-scatter
    queue holds 2 L - 1e9 fp32 gradient elements less; the prefetch (half the unit ahead, at least
    a layer) is one layer either way."""

    def buffers_gib(framework: str) -> float:
        plan = evaluate(EvaluateRequest.model_validate({
            "model": {"preset": "llama3.1-405b"},
            "training": {"seq_len": 8192, "global_batch_size": 512, "framework": framework,
                         "grad_reduce_in_fp32": True},
            "cluster": {"preset": "dgx-h100", "num_gpus": 512},
            "config": {"tp": 4, "pp": 1, "zero_stage": 3, "recompute": "full"},
        }))  # fmt: skip
        assert plan.frameworks == [framework]
        return plan.memory_gib.buffers

    model = ModelSpec(preset="llama3.1-405b")
    largest = max(sum(layer_params(model, i).on_rank(4, 1)) for i in range(model.num_layers or 0))
    assert largest > 5e8  # twice it is above the 1e9 floor
    expected_gib = (2 * largest - 1e9) * 4 / 2**30
    assert buffers_gib("megatron-lm") - buffers_gib("megatron-bridge") == pytest.approx(expected_gib, rel=1e-6)
