"""`planned`: the answer says which job it planned, preset and overrides applied (a web page or a
scheduler shows it beside the plans)."""

from __future__ import annotations

from optimizer.params import count_params
from optimizer.service import plan
from optimizer.specs import ModelSpec, PlanRequest


def _planned(model: dict, **cluster: object) -> dict:
    body = {"model": model, "training": {"seq_len": 4096, "global_batch_size": 256, "precision": "fp8"},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64, **cluster}, "search": {"top_k": 1}}  # fmt: skip
    return plan(PlanRequest.model_validate(body)).planned.model_dump()


def test_a_preset_with_an_override_is_planned_as_overridden() -> None:
    full = count_params(ModelSpec(preset="mixtral-8x7b"))
    assert 46e9 < full.total < 47.5e9 and 12.5e9 < full.active < 13.5e9  # Mixtral 8x7B: 46.7B, 12.9B active
    planned = _planned({"preset": "mixtral-8x7b", "num_layers": 16})
    half = count_params(ModelSpec(preset="mixtral-8x7b", num_layers=16))
    assert planned == {"model": "Mixtral 8x7B", "total_params": half.total, "active_params": half.active,
                       "gpu": "h100-sxm-80gb", "num_gpus": 64, "precision": "fp8", "framework": None}  # fmt: skip
    assert half.total < 0.55 * full.total


def test_a_named_model_on_another_gpu() -> None:
    planned = _planned({"preset": "llama3-8b", "name": "my 8B"}, gpu="h200-sxm-141gb")
    assert planned["model"] == "my 8B" and planned["gpu"] == "h200-sxm-141gb"
    assert planned["total_params"] == planned["active_params"] == count_params(ModelSpec(preset="llama3-8b")).total
