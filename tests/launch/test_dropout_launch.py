"""Dropout as costed: Megatron-LM and TransformerConfig default hidden and attention dropout to
0.1, while the plans keep no residual-dropout masks (1 byte a token and hidden unit, twice a
layer) and cost FlashAttention-class kernels without dropout; unfused attention is costed with
its dropout mask and output, so its dropout is left to the model."""

from __future__ import annotations

import shlex

import pytest

from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest
from tests.launch.test_launch import nemo_overrides


@pytest.mark.parametrize(("kernel", "attention"), [("flash2", True), ("flash3", True), ("unfused", False)])
def test_dropout_launched_as_costed(kernel: str, attention: bool) -> None:
    plan = evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "attention_kernel": kernel,
                     "grad_reduce_in_fp32": True},  # fp32 gradients: Megatron-Bridge's bf16 recipe runs it too
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "config": {"tp": 2, "pp": 1, "zero_stage": 1},
    }))  # fmt: skip
    toks = shlex.split(plan.launch.megatron)
    assert toks[toks.index("--hidden-dropout") + 1] == "0.0"
    assert ("--attention-dropout" in toks) is attention
    if attention:
        assert toks[toks.index("--attention-dropout") + 1] == "0.0"
    assert {"megatron-lm", "megatron-bridge"} <= set(plan.frameworks)
    over = nemo_overrides(plan.launch.nemo)
    assert over["model.hidden_dropout"] == "0.0"
    assert ("model.attention_dropout" in over) is attention
