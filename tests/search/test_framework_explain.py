"""An infeasible answer under a named framework names the framework fact that empties the space,
with an example layout the pins admit without it; the same request without that cause plans."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.service import plan
from optimizer.specs import PlanRequest


def _job(model: str, n: int, framework: str, gbs: int = 256, **search: Any) -> dict[str, Any]:
    return {
        "model": {"preset": model},
        "training": {"seq_len": 8192, "global_batch_size": gbs, "framework": framework},
        "cluster": {"preset": "dgx-h100", "num_gpus": n},
        "search": {"top_k": 1, "time_limit_s": 30, "suggest": False, **search},
    }


CASES = {
    # ZeRO-3 pinned with pipelines allowed only: Megatron-LM runs ZeRO-0/1 with pipelines
    "zero3 with pipelines": (
        _job("llama3-8b", 64, "megatron-lm", fix={"zero_stage": 3}, allow={"pp": [2, 4]}),
        "Megatron-LM runs zero_stage [0, 1] with pp > 1",
        {"search": {"fix": {"zero_stage": 1}, "allow": {"pp": [2, 4]}}},
    ),
    # DeepSpeed has no interleaved schedule (nor CP, which other admitted layouts also use)
    "deepspeed allow vpp": (
        _job("llama3-8b", 64, "deepspeed", allow={"vpp": [2, 4]}),
        "DeepSpeed has no interleaved pipeline schedule",
        {"training": {"framework": "megatron-lm"}},
    ),
    # (allowed depths at which DeepSpeed runs no ZeRO stage at all are a 422 at search.allow.pp:
    # tests/frameworks/test_zero_pins.py)
    # the pins leave tp x pp x cp = 16 to fill, and DeepSpeed has no CP and no bf16 pipelines
    "deepspeed dp 1": (
        _job("llama3-8b", 16, "deepspeed", fix={"dp": 1}),
        "DeepSpeed has no context parallelism",
        {"training": {"framework": "megatron-lm"}},
    ),
    "torchtitan etp": (
        _job("llama4-scout", 64, "torchtitan", fix={"tp": 4, "etp": 1}),
        "torchtitan splits routed experts over tensor parallelism: etp = tp (4) only",
        {"search": {"fix": {"tp": 4, "etp": 4}}},
    ),
    # layouts with CP break torchtitan's ep rule too: the nearest (TP8 DP8 EP8) breaks etp alone
    "torchtitan etp before ep": (
        _job("llama4-scout", 64, "torchtitan", fix={"tp": 8, "etp": 1}, allow={"ep": [8, 16]}),
        "torchtitan splits routed experts over tensor parallelism: etp = tp (8) only",
        {"search": {"fix": {"tp": 8, "etp": 8}, "allow": {"ep": [8, 16]}}},
    ),
    "deepep group sizes": (
        {**_job("deepseek-v3", 256, "megatron-lm", gbs=512, fix={"ep": 256}),
         "training": {"seq_len": 4096, "global_batch_size": 512, "framework": "megatron-lm", "moe_dispatcher": "deepep"}},
        "Megatron-LM runs expert groups (ep x etp) of [2, 4, 8, 16, 24, 32, 64, 128, 144, 160] ranks",
        {"training": {"moe_dispatcher": "alltoall"}},
    ),
    "torchtitan zero2 micro-batches": (
        _job("llama3-8b", 8, "torchtitan", gbs=64, fix={"zero_stage": 2, "micro_batch_size": 1, "tp": 1, "pp": 1}),
        "torchtitan runs zero_stage 2 only with one micro-batch a step",
        {"search": {"fix": {"zero_stage": 3, "micro_batch_size": 1, "tp": 1, "pp": 1}}},
    ),
}  # fmt: skip


def _merged(body: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    for section, fields in change.items():
        out[section] = {**body[section], **fields} if section != "search" else {**body["search"], **fields}
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_framework_fact_is_named(name: str) -> None:
    body, fact, control = CASES[name]
    answer = plan(PlanRequest.model_validate(body))
    assert answer.status == "infeasible" and not answer.plans
    assert answer.explanation.startswith("no valid layout: "), answer.explanation
    # the first reason given is the rule nearest layouts break, not one of a farther layout
    first = answer.explanation.split("for example ", 1)[1].split("; ")[0]
    assert "search.fix / search.allow admit" in answer.explanation and fact in first, answer.explanation
    assert plan(PlanRequest.model_validate(_merged(body, control))).plans, "the control plans"


def test_memory_explanations_speak_the_framework_s_recompute_names() -> None:
    """torchtitan's selective checkpointing is costed as the cost model's 'op': the answer says
    'selective', the name the request used."""
    body = _job("llama3.1-405b", 8, "torchtitan", fix={"recompute": "selective"})
    answer = plan(PlanRequest.model_validate(body))
    assert answer.explanation.startswith("no layout fits in memory"), answer.explanation
    assert "selective recompute)" in answer.explanation and "op recompute" not in answer.explanation


def test_knobs_that_leave_no_layout_are_not_blamed_on_pins() -> None:
    """DeepSpeed with fp32 gradients (ZeRO-0/1 under a pipeline only) and the overlap (not under its
    pipeline engine) runs no layout of the job: the answer says the job's knobs leave none, not
    search.fix / search.allow, which the request does not give."""
    answer = plan(PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "framework": "deepspeed",
                     "grad_reduce_in_fp32": True, "dp_comm_overlap": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    }))  # fmt: skip
    assert answer.status == "infeasible"
    assert answer.explanation.startswith(
        "no valid layout: DeepSpeed runs none of the job's layouts, with its training.* knobs"
    )
    assert "with training.dp_comm_overlap True" in answer.explanation
