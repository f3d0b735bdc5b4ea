"""What a plan says about frameworks and launch holds for what was costed: the attention kernel
the GPU has, the TP overlap the layout gets, and one short line when no framework runs it."""

from __future__ import annotations

from typing import Any

from optimizer.service import compare, evaluate, plan
from optimizer.specs import CompareRequest, EvaluateRequest, PlanRequest


def _evaluate(body: dict[str, Any]) -> Any:
    return evaluate(EvaluateRequest.model_validate(body))


def test_the_default_kernel_on_an_a100_is_the_one_costed() -> None:
    """flash3 (the default) is costed as flash2 on Ampere: torchtitan, which runs flash2, runs the
    plan, and its stack sets the memory (it was listed only when the request named flash2)."""
    body = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "cross_entropy": "unfused",
                     "grad_reduce_in_fp32": True, "tp_dgrad_overlap": False},
        "cluster": {"preset": "dgx-a100", "num_gpus": 8},
        "config": {"zero_stage": 3, "recompute": "none"},
    }  # fmt: skip
    default = _evaluate(body)
    named = _evaluate({**body, "training": {**body["training"], "attention_kernel": "flash2"}})
    assert default.frameworks == named.frameworks == ["torchtitan"]
    assert default.memory_gib.total == named.memory_gib.total and default.step_time_s == named.step_time_s
    asked = _evaluate({**body, "training": {**body["training"], "attention_kernel": "flash3"}})
    assert any(n.startswith("attention_kernel flash3: ") for n in asked.notes)  # asked for: said


def test_no_tp_overlap_flag_where_the_plan_is_costed_without_it() -> None:
    body = {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 256, "tp_comm_overlap": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "config": {"tp": 16, "pp": 8, "zero_stage": 1},
    }
    spanning = _evaluate(body)  # TP16 spans two 8-GPU NVLink domains: costed without the overlap
    assert any(n.startswith("training.tp_comm_overlap is not applied") for n in spanning.notes)
    assert "megatron-lm" in spanning.frameworks and "--tp-comm-overlap" not in spanning.launch.megatron
    inside = _evaluate({**body, "config": {"tp": 8, "pp": 8, "zero_stage": 1}})
    assert "--tp-comm-overlap" in inside.launch.megatron


def test_no_framework_is_said_in_one_line_without_sources() -> None:
    body = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 128, "fsdp_buffers": "fsdp2"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "config": {"zero_stage": 3},
    }
    plan = _evaluate(body)
    [line] = [n for n in plan.notes if "no framework" in n]
    assert plan.frameworks == [] and line.startswith("runs on no framework as costed: ")
    assert "Megatron-LM runs training.fsdp_buffers ['megatron-fsdp'], the job has 'fsdp2'" in line
    assert ".py" not in line and "@" not in line, line  # sources (file@commit) stay in frameworks.toml
    [two] = [n for n in _evaluate({**body, "training": body["training"] | {"fsdp_buffers": None},
                                   "config": {"tp": 2, "zero_stage": 3, "recompute": "selective"}}).notes
             if "no framework" in n]  # fmt: skip
    assert (
        two == "runs on no framework as costed: Megatron-LM has no recompute costed as 'selective'; "
        "DeepSpeed has no recompute costed as 'selective'"
    )


def test_compare_warns_of_a_stack_no_framework_runs_as_plan_does() -> None:
    body = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 128, "framework": "torchtitan", "cross_entropy": "fused"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    }
    answer = compare(
        CompareRequest.model_validate({**body, "layouts": [{"zero_stage": 3}, {"zero_stage": 3, "tp": 2}]})
    )
    assert all(e.plan.frameworks == [] for e in answer.entries)
    assert any(w.startswith("no framework's stack runs the job's model and training.* knobs") for w in answer.warnings)
    planned = plan(PlanRequest.model_validate({**body, "search": {"top_k": 1}}))
    assert any(w.startswith("no framework's stack runs the job's model and training.* knobs") for w in planned.warnings)


def test_knobs_that_do_nothing_for_the_layout_leave_its_frameworks() -> None:
    """The same numbers with or without the knob, and the same frameworks (a framework that does
    not run the knob's value still runs the layout: it never acts on it)."""
    dense = {"model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100", "num_gpus": 64}}
    mixtral = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"preset": "dgx-h100", "num_gpus": 64}}
    cases = [  # (job, knob, value, layout)
        (dense, "fsdp_buffers", "layer", {"zero_stage": 1}),  # ZeRO-2/3's buffers below ZeRO-2
        ({**dense, "model": {"preset": "llama2-7b"}}, "kv_expanded", True, {}),  # no grouped-query attention
        (mixtral, "moe_dispatcher", "hybridep", {"tp": 1, "ep": 1}),  # no expert parallelism
        ({**dense, "cluster": {"preset": "dgx-h100", "num_gpus": 8}}, "dp_comm_overlap", False,
         {"tp": 8, "zero_stage": 1}),  # no data parallelism (torchtitan runs the overlap only)
        (dense, "tp_comm_overlap", True, {"tp": 8, "zero_stage": 2, "sequence_parallel": False}),  # no SP
    ]  # fmt: skip
    for framework, expected in (("megatron-lm", ["megatron-lm"]), ("torchtitan", ["torchtitan"]), (None, None)):
        for job, knob, value, config in cases:
            base = {**job, "training": {"seq_len": 4096, "global_batch_size": 128, "framework": framework}}
            plain = _evaluate({**base, "config": config})
            knobbed = _evaluate({**base, "training": {**base["training"], knob: value}, "config": config})
            assert knobbed.step_time_s == plain.step_time_s, (framework, knob)
            assert knobbed.memory_gib.total == plain.memory_gib.total, (framework, knob)
            assert knobbed.frameworks == plain.frameworks, (framework, knob, knobbed.notes)
            assert expected is None or plain.frameworks in ([], expected), (framework, knob, plain.notes)
    acting = _evaluate({**dense, "training": {"seq_len": 4096, "global_batch_size": 128, "framework": "megatron-lm",
                                              "fsdp_buffers": "layer"}, "config": {"zero_stage": 3}})  # fmt: skip
    assert acting.frameworks == []  # at ZeRO-3 the buffers act, and Megatron-FSDP's are not 'layer'


def test_an_inert_knob_does_not_change_the_stack_costed() -> None:
    """With no framework named the costed defaults (key/value expansion, ZeRO buffers) come from
    every framework whose stack runs the job on some layout: a knob inert for this layout does
    not take torchtitan's expanded key/value heads out of its memory."""
    body = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 128, "grad_reduce_in_fp32": True,
                     "cross_entropy": "unfused", "tp_dgrad_overlap": False, "attention_kernel": "flash2"},
        "cluster": {"preset": "dgx-a100", "num_gpus": 64},
        "config": {"tp": 2, "pp": 2, "zero_stage": 1},
    }  # fmt: skip
    plain = _evaluate(body)
    knobbed = _evaluate({**body, "training": {**body["training"], "fsdp_buffers": "layer"}})
    assert plain.frameworks == knobbed.frameworks == ["torchtitan"]
    assert knobbed.memory_gib.total == plain.memory_gib.total


def test_the_expert_overlap_is_costed_only_where_it_runs() -> None:
    """Expert TP without expert parallelism (ep 1, etp 2): Megatron's launch asks for the
    all-to-all overlap at ep > 1 only, so the plan is costed without it (it hid part of the etp
    collectives: 24.4435 against 24.4787 s)."""
    body = {
        "model": {"preset": "llama4-scout"},
        "training": {"seq_len": 4096, "global_batch_size": 128, "framework": "megatron-lm"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "config": {"tp": 2, "ep": 1, "etp": 2, "zero_stage": 1},
    }
    plain = _evaluate(body)
    asked = _evaluate({**body, "training": {**body["training"], "ep_comm_overlap": True}})
    assert asked.step_time_s == plain.step_time_s and asked.frameworks == plain.frameworks == ["megatron-lm"]
    assert "--overlap-moe-expert-parallel-comm" not in asked.launch.megatron


def test_a_rule_on_a_knob_that_does_nothing_here_is_not_applied() -> None:
    """Megatron's rules 'the expert overlap needs the alltoall or flex dispatcher' and 'the flex
    dispatcher does not pad to capacity' act together with expert parallelism: without it (ep 1)
    they do not take Megatron off the plan."""
    job = {"model": {"preset": "mixtral-8x7b"}, "cluster": {"preset": "dgx-h100", "num_gpus": 64}}
    training = {"seq_len": 4096, "global_batch_size": 128, "framework": "megatron-lm"}
    for config, knobs in (
        ({"tp": 2, "ep": 1, "etp": 2, "zero_stage": 1}, {"moe_dispatcher": "allgather", "ep_comm_overlap": True}),
        ({"tp": 1, "ep": 1, "zero_stage": 1}, {"moe_dispatcher": "deepep", "moe_capacity_factor": 1.25}),
    ):
        plan = _evaluate({**job, "training": {**training, **knobs}, "config": config})
        assert plan.frameworks == ["megatron-lm"], (knobs, plan.notes)
