"""DeepSpeed plans keep their gradients in the dtype they are costed in, with an optimizer that
DeepSpeed (commit da7f21a2) builds for the printed config and layout.

``_deepspeed_gradients`` re-implements what DeepSpeed decides from the config JSON:
``engine.py`` ``get_data_types`` (the gradient accumulation dtype: ``data_types.grad_accum_dtype``,
else fp32 for a bf16 model without ZeRO, else the model dtype) and ``_do_optimizer_sanity_check``
(fp32 accumulation with ZeRO only at stage 1, as ``BF16_Optimizer``), and the pipeline engine's
``_bf16_reduce_grads`` (a bf16 pipeline reduces ``optimizer.get_grads_for_reduction()``, which only
``BF16_Optimizer`` defines; it also asserts no MoE layers), the communication dtype
(``communication_data_type``, else the model dtype) and two faults of that commit the profile
keeps plans away from: ``BF16_Optimizer`` without a pipeline never averages its fp32 gradients
over the data-parallel ranks (fixed upstream in dd3690c53), and it has no expert groups. Every plan
the planner returns for DeepSpeed must pass it and keep the gradient bytes it was costed with, in
memory and on the wire.
"""

from __future__ import annotations

import json

import pytest

from optimizer.service import search_plans
from optimizer.specs import PlanRequest


class Refused(Exception):
    """DeepSpeed would raise (or fail at the first gradient reduction) on this config."""


def _deepspeed_gradients(config: dict, pp: int, dp: int = 2, moe: bool = False) -> tuple[str, str]:
    """(accumulation, reduction) dtypes of ``config``'s gradients on a layout of ``pp`` stages
    and ``dp`` data-parallel ranks."""
    stage = config["zero_optimization"]["stage"]
    model = "bf16" if config["bf16"]["enabled"] else "fp16" if config["fp16"]["enabled"] else "fp32"
    accum = config.get("data_types", {}).get("grad_accum_dtype")
    if accum is None:
        accum = "fp32" if model == "bf16" and stage == 0 else model
    if stage >= 1:
        if model == "bf16" and accum == "fp32" and stage == 1:
            optimizer = "BF16_Optimizer"
        elif model != accum:
            raise Refused("Model data type and gradient accumulation data type must be equal to use ZeRO")
        else:
            optimizer = "ZeRO"
    elif model == accum:
        if model == "bf16":
            raise Refused("Bfloat16 wrapper must use a gradient accumulation type of fp32")
        optimizer = "FP16_Optimizer" if model == "fp16" else "none"
    elif model == "bf16" and accum == "fp32":
        optimizer = "BF16_Optimizer"
    else:
        raise Refused("unsupported mix of model dtype and gradient accumulation type")
    if pp > 1:
        if stage >= 2:
            raise Refused("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        if model == "bf16" and optimizer != "BF16_Optimizer":
            raise Refused("the bf16 pipeline reduces optimizer.get_grads_for_reduction(): BF16_Optimizer only")
    if optimizer == "BF16_Optimizer":
        if moe:
            raise Refused("BF16_Optimizer has no expert groups; the bf16 pipeline reduction asserts no MoE")
        if pp == 1 and dp > 1:
            raise Refused("allreduce_gradients reduces the bf16 grads, not BF16_Optimizer's fp32 ones (dd3690c53)")
    return accum, config.get("communication_data_type", model)


def _plans(training: dict, search: dict, num_gpus: int = 16, model: str = "llama3-8b") -> list:
    req = {
        "model": {"preset": model},
        "training": {"seq_len": 4096, "global_batch_size": 64, "framework": "deepspeed", **training},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "search": {"top_k": 5, "diverse": False, **search},
    }
    return search_plans(PlanRequest.model_validate(req)).plans


CASES = [
    ({}, {}),
    ({}, {"allow": {"zero_stage": [1, 2, 3]}}),
    ({"grad_reduce_in_fp32": True}, {}),
    ({"grad_reduce_in_fp32": True}, {"fix": {"pp": 2}}),
    ({"grad_reduce_in_fp32": True, "dp_comm_overlap": False}, {"fix": {"pp": 4}}),
    ({"grad_reduce_in_fp32": True, "precision": "fp8"}, {}),
    ({"precision": "fp16"}, {"fix": {"pp": 2}}),
    ({"precision": "fp16"}, {}),
    ({"precision": "fp8"}, {}),
]


@pytest.mark.parametrize(("training", "search"), CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_every_deepspeed_plan_runs_with_the_costed_gradients(training: dict, search: dict) -> None:
    plans = _plans(training, search)
    assert plans, "no plan"
    half = "fp16" if training.get("precision") == "fp16" else "bf16"
    costed = "fp32" if training.get("grad_reduce_in_fp32") else half
    for plan in plans:
        assert plan.frameworks == ["deepspeed"]
        config = json.loads(plan.launch.deepspeed)
        gradients = _deepspeed_gradients(config, plan.config.pp, plan.config.dp)
        assert gradients == (costed, costed), (plan.config, config)


def test_pipelines_need_fp32_gradients_for_bf16() -> None:
    """With 16-bit gradients (the default) no DeepSpeed plan pipelines a bf16 model; with fp32
    gradients every plan pipelines, at ZeRO-0 or ZeRO-1, and says what its memory leaves out."""
    assert all(p.config.pp == 1 and p.config.zero_stage >= 1 for p in _plans({}, {}, num_gpus=64))
    piped = _plans({"grad_reduce_in_fp32": True}, {}, num_gpus=64)
    assert piped and all(p.config.pp > 1 and p.config.zero_stage <= 1 for p in piped)
    assert all(any("BF16_Optimizer" in n for n in p.notes) for p in piped)
    # ZeRO-0/1 all-reduce (1.5x the bytes of ZeRO-1's reduce-scatter and gather): said, not costed
    assert all(any("all-reduces ZeRO-0/1 gradients" in n for n in p.notes) for p in piped if p.config.dp > 1)


def test_the_check_refuses_what_deepspeed_refuses() -> None:
    """The re-implementation is not vacuous: the configs DeepSpeed refuses fail it."""
    base = {"bf16": {"enabled": True}, "fp16": {"enabled": False}}
    with pytest.raises(Refused):  # ZeRO-1 with bf16 gradients under the pipeline engine
        _deepspeed_gradients({**base, "zero_optimization": {"stage": 1}}, pp=2)
    fp32_zero3 = {**base, "zero_optimization": {"stage": 3}, "data_types": {"grad_accum_dtype": "fp32"}}
    with pytest.raises(Refused):  # fp32 accumulation at ZeRO-3
        _deepspeed_gradients(fp32_zero3, pp=1)
    assert _deepspeed_gradients({**base, "zero_optimization": {"stage": 0}}, pp=2) == ("fp32", "bf16")
    fp32_zero1 = {**base, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}
    assert _deepspeed_gradients(fp32_zero1, pp=2) == ("fp32", "bf16")
    with pytest.raises(Refused):  # BF16_Optimizer without a pipeline, several data-parallel ranks
        _deepspeed_gradients(fp32_zero1, pp=1, dp=4)
    with pytest.raises(Refused):  # BF16_Optimizer with experts
        _deepspeed_gradients(fp32_zero1, pp=2, moe=True)
