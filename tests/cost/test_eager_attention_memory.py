"""What torchtitan's attention and eager SwiGLU keep for backward (``training.kv_expanded``,
``training.fused_kernels``), against a hand count for Llama 3 8B (hidden 4,096, 32 query heads and
8 key/value heads of 128, FFN 14,336, 32 layers) at 8,192 tokens a micro-batch, no recompute."""

from __future__ import annotations

import pytest

from optimizer.cost import build_context
from optimizer.cost.layer_base import attention_kv_width
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec

TOKENS, LAYERS = 8192, 32
GIB = 2**30


def activations_gib(recompute: str = "none", tp: int = 1, **training: object) -> float:
    req = EvaluateRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": TOKENS, "global_batch_size": 8, "precision": "bf16", **training},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "config": {
                "tp": tp,
                "pp": 1,
                "dp": 8 // tp,
                "micro_batch_size": 1,
                "zero_stage": 3,
                "recompute": recompute,
            },
        }
    )
    return evaluate(req).memory_gib.activations


def per_layer_gib(elements_per_token: float) -> float:
    """The stored set of 32 layers plus the working set of the one running: 33 layers' worth."""
    return (LAYERS + 1) * TOKENS * elements_per_token * 2 / GIB


def test_expanded_keys_and_values_are_kept_query_wide() -> None:
    """repeat_kv makes 4,096-wide K and V copies where the kernels of Megatron-Core read 1,024:
    2 x 3,072 more elements per token and layer, 3.09 GiB over 33 layers' worth."""
    assert activations_gib(kv_expanded=True) - activations_gib() == pytest.approx(per_layer_gib(2 * 3072))
    assert per_layer_gib(2 * 3072) == pytest.approx(3.09375)


def test_eager_swiglu_keeps_the_silu_output_too() -> None:
    """silu keeps its input (w1's output) and the product both operands (silu's output, w3's):
    eager PyTorch keeps one more FFN-wide tensor than a fused stack, 14,336 elements a token."""
    assert activations_gib(fused_kernels=False) - activations_gib() == pytest.approx(per_layer_gib(14336))


def test_full_recompute_keeps_only_the_layer_input_either_way() -> None:
    """With the block re-run only its input is stored; the expanded copies live in the working set
    of the one layer being recomputed."""
    diff = activations_gib("full", kv_expanded=True) - activations_gib("full")
    assert diff == pytest.approx(TOKENS * 2 * 3072 * 2 / GIB)


def test_expansion_is_per_tensor_parallel_rank_and_nothing_without_gqa() -> None:
    job = JobSpec.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": TOKENS, "global_batch_size": 8, "kv_expanded": True},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        }
    )
    ctx = build_context(job)
    assert attention_kv_width(ctx, 1) == 2 * 4096 and attention_kv_width(ctx, 4) == 2 * 1024
    mha = job.model_copy(update={"model": job.model.model_copy(update={"num_kv_heads": 32})})
    plain = mha.model_copy(update={"training": mha.training.model_copy(update={"kv_expanded": False})})
    assert attention_kv_width(build_context(mha), 2) == attention_kv_width(build_context(plain), 2) == 4096
