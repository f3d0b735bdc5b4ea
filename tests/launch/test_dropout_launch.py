"""``model.dropout``: Megatron-LM and TransformerConfig default hidden and attention dropout to
0.1, so the launches say the model's (0 unless given). Above 0 each layer keeps two 1-byte
residual-dropout masks a token and hidden unit for backward (none with full recompute), which the
memory counts; torchtitan's models have no dropout."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest
from tests.launch.test_launch import nemo_overrides


def _plan(dropout: float, recompute: str = "none", framework: str | None = None) -> Any:
    training: dict[str, Any] = {"seq_len": 4096, "global_batch_size": 64, "grad_reduce_in_fp32": True}
    if framework is not None:
        training["framework"] = framework
    return evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "gpt3-175b", "dropout": dropout},
        "training": training,
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "config": {"tp": 8, "pp": 8, "zero_stage": 1, "recompute": recompute, "sequence_parallel": True},
    }))  # fmt: skip


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_dropout_launched_as_the_model_has_it(dropout: float) -> None:
    plan = _plan(dropout)
    assert {"megatron-lm", "megatron-bridge"} <= set(plan.frameworks)
    toks = shlex.split(plan.launch.megatron)
    assert toks[toks.index("--hidden-dropout") + 1] == str(dropout)
    assert toks[toks.index("--attention-dropout") + 1] == str(dropout)
    over = nemo_overrides(plan.launch.nemo)
    assert over["model.hidden_dropout"] == over["model.attention_dropout"] == str(dropout)
    assert ("torchtitan" in plan.frameworks) is False  # GELU GPT-3: not a torchtitan model either way


def test_dropout_masks_are_two_bytes_a_token_and_hidden_unit_a_layer() -> None:
    """GPT-3 175B, TP8 SP, PP8: 12 layers a stage, micro-batch 1 x 4,096 tokens, 12,288 hidden split
    8 ways: 2 x 1 byte x 4,096 x 1,536 = 12 MiB a layer and micro-batch; stage 0 holds 8 micro-batches
    in flight (1F1B) and one layer's working set, so (12 x 8 + 1) x 12 MiB more activations."""
    plain, masked = _plan(0.0).memory_gib.per_stage[0], _plan(0.1).memory_gib.per_stage[0]
    assert masked.activations - plain.activations == pytest.approx((12 * 8 + 1) * 12 / 1024, rel=1e-3)
    full_plain, full_masked = _plan(0.0, "full").memory_gib, _plan(0.1, "full").memory_gib
    # full recompute re-makes them: only the working set of the layer being recomputed holds them
    assert full_masked.activations - full_plain.activations == pytest.approx(12 / 1024, rel=1e-3)


def test_torchtitan_runs_no_dropout() -> None:
    plan = evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-8b", "dropout": 0.1},
        "training": {"seq_len": 4096, "global_batch_size": 64, "framework": "torchtitan"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "config": {"tp": 1, "pp": 1, "zero_stage": 3},
    }))  # fmt: skip
    assert plan.frameworks == []
    assert any("torchtitan runs no model.dropout" in n for n in plan.notes)
