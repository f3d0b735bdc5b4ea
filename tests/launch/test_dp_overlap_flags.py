"""The data-parallel overlap flags follow the collectives the plan costs as overlapped: an MoE
layout without a ``dp x cp`` group still reduces its experts' gradients over the
expert-data-parallel group, and Megatron-FSDP (ZeRO-2/3) asserts ``overlap_grad_reduce`` at any
data-parallel size (``megatron_fsdp.py@000c4ac2``)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, PlanRequest


def _plan(model: str, fix: dict[str, Any], framework: str = "megatron-lm", overlap: bool = True) -> Any:
    request = PlanRequest.model_validate(
        {
            "model": {"preset": model},
            "training": {"seq_len": 4096, "global_batch_size": 64, "framework": framework, "dp_comm_overlap": overlap},
            "cluster": {"preset": "dgx-h200", "num_gpus": 8},
            "search": {"top_k": 1, "fix": fix},
        }
    )
    answer = plan(request)
    assert answer.plans, answer.explanation
    return request, answer.plans[0]


def _nemo(args: str) -> dict[str, str]:
    return dict(tok.partition("=")[::2] for tok in shlex.split(args))


def test_zero2_without_data_parallel_ranks_still_asks_for_the_overlap_megatron_fsdp_asserts() -> None:
    _, best = _plan("llama3-8b", {"dp": 1, "cp": 1, "zero_stage": 2})
    args = shlex.split(best.launch.megatron)
    assert "--use-megatron-fsdp" in args and "optim_grads" in args
    assert "--overlap-grad-reduce" in args
    _, bridge = _plan("llama3-8b", {"dp": 1, "cp": 1, "zero_stage": 2}, framework="megatron-bridge")
    assert _nemo(bridge.launch.nemo)["ddp.overlap_grad_reduce"] == "true"


@pytest.mark.parametrize("framework", ["megatron-lm", "megatron-bridge"])
def test_expert_data_parallel_gradients_are_overlapped_as_costed(framework: str) -> None:
    """TP4 EP2 on 8 GPUs: no dp x cp group, but tp x cp x dp / (etp x ep) = 2 expert replicas."""
    request, best = _plan("qwen3-30b-a3b", {"dp": 1, "cp": 1, "tp": 4, "ep": 2, "etp": 1}, framework)
    assert (best.config.dp, best.config.cp, best.config.tp, best.config.ep) == (1, 1, 4, 2)
    if framework == "megatron-lm":
        args = shlex.split(best.launch.megatron)
        assert "--overlap-grad-reduce" in args and "--overlap-param-gather" in args
    else:
        assert _nemo(best.launch.nemo)["ddp.overlap_grad_reduce"] == "true"
    # the overlap is what the step was costed with: blocking, the same layout is slower
    blocking = request.model_copy(update={"training": request.training.model_copy(update={"dp_comm_overlap": False})})
    alone = evaluate(EvaluateRequest(**blocking.model_dump(exclude={"search"}), config=best.config))
    assert alone.step_time_s > best.step_time_s


def test_dense_layout_without_data_parallel_ranks_has_no_overlap_flags() -> None:
    _, best = _plan("llama3-8b", {"dp": 1, "cp": 1, "zero_stage": 1})
    assert "--overlap-grad-reduce" not in shlex.split(best.launch.megatron)
