"""Stack knobs that act only with tensor or pipeline parallelism (``frameworks.TP_KNOBS``,
``PP_KNOBS``) do not decide which framework runs a layout without it: DeepSpeed (blocking pipeline
sends only) runs a ``pp = 1`` layout whatever ``training.pp_comm_overlap`` says, and the search
offers it such layouts, not pipelined ones."""

from __future__ import annotations

from pathlib import Path

import yaml

from optimizer.frameworks import PP_KNOBS, job_frameworks, profile
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, ModelSpec, PlanRequest, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]


def test_pp_comm_overlap_is_checked_only_with_pipelines() -> None:
    assert PP_KNOBS == ("pp_comm_overlap",)
    deepspeed = profile("deepspeed")
    training = TrainingSpec(seq_len=2048, global_batch_size=64)  # pp_comm_overlap true by default
    model = ModelSpec(preset="llama3-8b")
    assert "pp_comm_overlap" in (deepspeed.stack_problem(training, model, 1, 2) or "")
    assert "pp_comm_overlap" in (deepspeed.stack_problem(training, model) or "")  # sizes not given: every knob
    assert deepspeed.stack_problem(training, model, 1, 1) is None
    assert "pp_comm_overlap" in (deepspeed.knob_sizes_problem(training, 1, 2) or "")
    assert deepspeed.knob_sizes_problem(training, 8, 1) is None


def test_the_deepspeed_example_runs_on_deepspeed() -> None:
    """examples/evaluate-gpt3-175b-zero3-deepspeed.yaml (ZeRO-3, no pipeline) leaves
    pp_comm_overlap at its default (true): DeepSpeed still runs it and writes its config."""
    raw = yaml.safe_load((ROOT / "examples" / "evaluate-gpt3-175b-zero3-deepspeed.yaml").read_text())
    answer = evaluate(EvaluateRequest.model_validate(raw))
    assert answer.frameworks == ["deepspeed"]
    assert '"stage": 3' in (answer.launch.deepspeed if answer.launch else "")
    assert not any("pp_comm_overlap" in n for n in answer.notes)


def test_torchtitan_runs_an_unpipelined_layout_with_blocking_sends_asked_for() -> None:
    """torchtitan overlaps pipeline sends always; asking for blocking ones does not matter without a
    pipeline (the torchtitan example, 5,667 tokens/s a GPU either way)."""
    raw = yaml.safe_load((ROOT / "examples" / "evaluate-llama3.1-8b-torchtitan.yaml").read_text())
    base = evaluate(EvaluateRequest.model_validate(raw))
    raw["training"]["pp_comm_overlap"] = False
    blocking = evaluate(EvaluateRequest.model_validate(raw))
    assert "torchtitan" in base.frameworks and "torchtitan" in blocking.frameworks
    assert blocking.step_time_s == base.step_time_s


def test_a_search_offers_deepspeed_only_unpipelined_layouts() -> None:
    """With pp_comm_overlap true (the default) DeepSpeed is listed on plans without a pipeline and on
    none with one; with no framework whose stack runs a pipeline, no plan has one."""
    body = {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 512, "dp_collectives": "flat"},  # not Megatron's
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
        "search": {"top_k": 5},
    }
    request = PlanRequest.model_validate(body)
    assert [p.id for p in job_frameworks(request.training, request.model)] == ["deepspeed"]
    answer = plan(request)
    assert answer.plans
    for p in answer.plans:
        assert p.config.pp == 1, p.config
        assert p.frameworks == ["deepspeed"], p.notes
    # DeepSpeed's pipeline engine: blocking sends, fp32 gradients with bf16, no overlapped ZeRO-0/1
    blocking = {"pp_comm_overlap": False, "grad_reduce_in_fp32": True, "dp_comm_overlap": False}
    request = PlanRequest.model_validate({**body, "training": {**body["training"], **blocking}})
    answer = plan(request)
    assert answer.plans and all(p.frameworks == ["deepspeed"] for p in answer.plans)
    assert answer.plans[0].config.pp > 1


def test_a_framework_whose_rules_leave_no_layout_is_not_a_target() -> None:
    """fp32 gradients with bf16 on DeepSpeed run only ZeRO-0/1 pipelines, which never overlap their
    gradient reduction: asked to overlap it, DeepSpeed runs nothing, so (no other framework running
    the flat rings either) the answer says no framework's stack runs the job and still plans."""
    training = {"seq_len": 2048, "global_batch_size": 512, "dp_collectives": "flat", "pp_comm_overlap": False,
                "grad_reduce_in_fp32": True}  # fmt: skip
    request = PlanRequest.model_validate({
        "model": {"preset": "gpt3-175b"}, "training": training, "cluster": {"preset": "dgx-h100", "num_gpus": 128},
    })  # fmt: skip
    assert job_frameworks(request.training, request.model) == ()
    answer = plan(request)
    assert answer.plans and all(p.frameworks == [] for p in answer.plans)
    assert any("no framework's stack" in w for w in answer.warnings)
