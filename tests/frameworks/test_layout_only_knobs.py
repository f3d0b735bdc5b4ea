"""Stack knobs that act only with tensor or pipeline parallelism (``frameworks.TP_KNOBS``,
``PP_KNOBS``) do not decide which framework runs a layout without it: DeepSpeed (blocking pipeline
sends only) runs a ``pp = 1`` layout whatever ``training.pp_comm_overlap`` says, and a plan
without pipelines lists it. The search's space stays what the job's knobs select at any sizes."""

from __future__ import annotations

from pathlib import Path

import yaml

from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import PP_KNOBS, profile
from optimizer.inert_knobs import LayoutFacts
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, ModelSpec, PlanRequest, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]


def test_pp_comm_overlap_is_checked_only_with_pipelines() -> None:
    assert PP_KNOBS == ("pp_comm_overlap",)
    deepspeed = profile("deepspeed")
    training = TrainingSpec(seq_len=2048, global_batch_size=64)  # pp_comm_overlap true by default
    model = ModelSpec(preset="llama3-8b")
    assert "pp_comm_overlap" in (deepspeed.stack_problem(training, model, LayoutFacts(1, 2)) or "")
    assert "pp_comm_overlap" in (deepspeed.stack_problem(training, model) or "")  # sizes not given: every knob
    assert deepspeed.stack_problem(training, model, LayoutFacts(1, 1)) is None
    assert deepspeed.stack_problem(training, model, LayoutFacts(8, 1)) is None


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


def test_a_plan_without_pipelines_lists_deepspeed() -> None:
    """No framework runs flat rings with overlapped pipeline sends (Megatron-LM: no flat rings;
    DeepSpeed: no overlapped sends), so every layout of every framework's rules is searched; those
    without a pipeline list DeepSpeed, the pipelined ones none, and the answer says so."""
    body = {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 512, "dp_collectives": "flat"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
        "search": {"top_k": 5, "diverse": False},
    }
    request = PlanRequest.model_validate(body)
    assert candidate_frameworks(request.training, request.model) == ()
    assert [p.id for p in candidate_frameworks(request.training, request.model, 8, 1)] == ["deepspeed"]
    answer = plan(request)
    assert any("no framework's stack" in w for w in answer.warnings)
    assert {p.config.pp > 1 for p in answer.plans} == {True}  # the best layouts pipeline
    assert all(p.frameworks == [] for p in answer.plans)
    fixed = plan(PlanRequest.model_validate({**body, "search": {"top_k": 3, "fix": {"pp": 1}}}))
    assert fixed.plans[0].frameworks == ["deepspeed"]  # TP2 ZeRO-3; others use CP or op recompute: none
    assert all(set(p.frameworks) <= {"deepspeed"} for p in fixed.plans)


def test_a_framework_whose_rules_leave_no_layout_is_not_a_target() -> None:
    """fp32 gradients with bf16 on DeepSpeed run only ZeRO-0/1 pipelines, which never overlap their
    gradient reduction: asked to overlap it, DeepSpeed runs nothing, so (no other framework running
    flat rings) the answer says no framework's stack runs the job and still plans (it once said
    'infeasible', blaming the sizes)."""
    training = {"seq_len": 2048, "global_batch_size": 512, "dp_collectives": "flat", "pp_comm_overlap": False,
                "grad_reduce_in_fp32": True}  # fmt: skip
    request = PlanRequest.model_validate({
        "model": {"preset": "gpt3-175b"}, "training": training, "cluster": {"preset": "dgx-h100", "num_gpus": 128},
    })  # fmt: skip
    assert candidate_frameworks(request.training, request.model) == ()
    answer = plan(request)
    assert answer.plans and all(p.frameworks == [] for p in answer.plans)
    assert any("no framework's stack" in w for w in answer.warnings)
    blocking = {**training, "dp_comm_overlap": False}  # DeepSpeed's pipeline engine as it runs
    answer = plan(PlanRequest.model_validate({**request.model_dump(exclude_unset=True), "training": blocking}))
    assert answer.plans and all(p.frameworks == ["deepspeed"] for p in answer.plans)
    assert answer.plans[0].config.pp > 1


def test_the_stack_warning_names_where_the_best_plan_runs() -> None:
    """16-bit gradients with the unfused loss: no framework runs them at every size, but DeepSpeed
    runs them unpipelined, and the best plan there lists it. The warning said the plans list no
    framework while the top plan listed DeepSpeed; it now names where the best plan runs."""
    request = PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64, "cross_entropy": "unfused",
                     "grad_reduce_in_fp32": False},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8}, "search": {"top_k": 3},
    })  # fmt: skip
    assert candidate_frameworks(request.training, request.model) == ()
    answer = plan(request)
    assert answer.plans[0].frameworks == ["deepspeed"]
    assert any(p.frameworks == [] for p in answer.plans[1:])
    [warning] = [w for w in answer.warnings if "no framework's stack" in w]
    assert "at every layout size" in warning and "the best plan runs on deepspeed" in warning
