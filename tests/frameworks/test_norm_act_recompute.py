"""Megatron-Core's ``--recompute-modules layernorm moe_act`` (the MoE model zoo's and Megatron-Bridge's
GPT-OSS recipe): the norms and the MoE activation re-run in backward, which is the cost model's
``selective`` recompute exactly when every layer is an MoE layer. Under its own name it is a
Megatron-LM and Megatron-Bridge mode for those models, and their launch arguments name it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from optimizer.modes import MoeLayers
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, ModelSpec

MIXTRAL = {"preset": "mixtral-8x7b"}
MIXED = {"preset": "mixtral-8x7b", "moe": {"num_experts": 8, "top_k": 2, "first_dense_layers": 1}}
LAYOUT = {"tp": 2, "pp": 4, "ep": 8, "micro_batch_size": 1, "zero_stage": 1}


def _evaluate(model: dict[str, Any], recompute: str, framework: str | None = None):
    training: dict[str, Any] = {"seq_len": 4096, "global_batch_size": 256}
    if framework is not None:
        training["framework"] = framework
    return evaluate(
        EvaluateRequest.model_validate({
            "model": model, "training": training, "cluster": {"preset": "dgx-h100", "num_gpus": 64},
            "config": {**LAYOUT, "recompute": recompute},
        })
    )  # fmt: skip


def test_moe_layers_of_the_models() -> None:
    assert ModelSpec.model_validate(MIXTRAL).moe_layers == MoeLayers.ALL
    assert ModelSpec.model_validate(MIXED).moe_layers == MoeLayers.SOME
    assert ModelSpec.model_validate({"preset": "llama3-8b"}).moe_layers == MoeLayers.NONE


@pytest.mark.parametrize("framework", ["megatron-lm", "megatron-bridge"])
def test_every_layer_moe_runs_it_under_its_own_name(framework: str) -> None:
    own = _evaluate(MIXTRAL, "layernorm_moe_act", framework)
    assert own.config.recompute == "layernorm_moe_act" and own.frameworks == [framework]
    # Megatron-Core's own selective (core_attn) keeps the norm and activation outputs
    assert _evaluate(MIXTRAL, "selective", framework).memory_gib.total > own.memory_gib.total


def test_it_is_the_cost_models_selective() -> None:
    own = _evaluate(MIXTRAL, "layernorm_moe_act", "megatron-lm")
    plain = _evaluate(MIXTRAL, "selective")  # no framework: the cost model's names, Megatron-LM's stack
    assert own.step_time_s == pytest.approx(plain.step_time_s)
    assert own.memory_gib.total == pytest.approx(plain.memory_gib.total)
    assert "megatron-lm" in plain.frameworks
    assert "--recompute-modules layernorm moe_act" in plain.launch.megatron
    with pytest.raises(ValidationError, match="is a framework's own name: name training.framework"):
        _evaluate(MIXTRAL, "layernorm_moe_act")


def test_a_model_with_a_dense_layer_does_not_run_it() -> None:
    assert _evaluate(MIXED, "selective").frameworks == []
    with pytest.raises(ValidationError, match="only on MoE models whose every layer is an MoE layer"):
        _evaluate(MIXED, "layernorm_moe_act", "megatron-lm")
    with pytest.raises(ValidationError, match="runs recompute 'layernorm_moe_act' only on MoE models"):
        _evaluate({"preset": "llama3-8b"}, "layernorm_moe_act", "megatron-lm")
