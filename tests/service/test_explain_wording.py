"""What the explanation and warnings call things matches what was costed: the data-parallel
groups are dp x cp ranks, the bubble figure is over the bubble-free time, /compare's layouts are
not "the top plan", and the Bridge TP-overlap note holds for recipes with and without a
comm_overlap section."""

from __future__ import annotations

from optimizer.service import compare, plan
from optimizer.specs import CompareRequest, ModelSpec, PlanRequest


def test_data_parallel_groups_with_context_parallelism_are_dp_x_cp() -> None:
    answer = plan(PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 4096},
        "search": {"fix": {"tp": 2, "cp": 2}},
    }))  # fmt: skip
    top = answer.plans[0].config
    (dp,) = [lim for lim in answer.why.limits if lim.summary.startswith("data-parallel communication")]
    assert f"groups of {top.dp * top.cp} (dp x cp) spanning" in dp.summary
    assert dp.values["dp_cp_size"] == top.dp * top.cp == 2048


def test_compare_warnings_name_the_layout() -> None:
    answer = compare(CompareRequest.model_validate({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "layouts": [{"tp": 8, "recompute": "core_attn", "zero_stage": 1}, {"tp": 4, "pp": 8, "recompute": "none"}],
    }))  # fmt: skip
    (few,) = [w for w in answer.warnings if "micro-batches through" in w]
    assert few.startswith("layout 1: the layout runs 8 micro-batches through 8 pipeline stages")
    assert "top plan" not in few


_QWEN3_235B_CUSTOM = ModelSpec.model_validate({"preset": "qwen3-235b-a22b"}).model_dump(
    exclude={"preset"}, exclude_none=True
) | {"name": "my-moe"}
"""Qwen3-235B's architecture without its preset: a model whose Megatron-Bridge recipe is not known."""


def test_the_bridge_tp_overlap_note_says_which_recipes_turn_it_on() -> None:
    """Only for a model with no known recipe: a known one's overrides name tp_comm_overlap."""
    answer = plan(PlanRequest.model_validate({
        "model": _QWEN3_235B_CUSTOM,
        "training": {"seq_len": 4096, "global_batch_size": 512, "framework": "megatron-bridge"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 128},
        "search": {"fix": {"tp": 2}},
    }))  # fmt: skip
    (note,) = [n for n in answer.plans[0].notes if "comm_overlap.tp_comm_overlap=false" in n]
    assert "recipes without the section (Qwen) run it off, as planned" in note


def test_the_memory_limit_does_not_say_why_a_pinned_recompute_was_chosen() -> None:
    """With ``search.fix.recompute`` the plan recomputes because it was told to: the limit states
    the numbers without a "so"."""
    answer = plan(PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "cluster": {"preset": "dgx-h100", "num_gpus": 32},
        "search": {"fix": {"recompute": "selective"}},
    }))  # fmt: skip
    memory = [lim for lim in answer.why.limits if lim.kind == "memory"]
    assert memory
    for lim in memory:
        assert ", so the plan" not in lim.summary
        assert f"with '{answer.plans[0].config.recompute}' the plan takes" in lim.summary


def test_tight_memory_follows_the_time_limits_and_is_not_called_a_limit() -> None:
    """docs/reading-a-plan.md's job (Llama 3 8B, 64 H100, Megatron-LM): the top plan fills 99.5%
    of usable memory and spends 99.8% of its step in compute. The explanation led with "Limited by
    memory", which reads as the step's bottleneck; memory that only is tight (a lighter recompute
    is not what it costs) is now ``memory_headroom``, listed after the time limits."""
    answer = plan(PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 512, "framework": "megatron-lm"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"top_k": 2},
    }))  # fmt: skip
    assert answer.plans[0].config.recompute == "none"
    kinds = [lim.kind for lim in answer.why.limits]
    assert kinds[0] == "compute" and kinds[-1] == "memory_headroom" and "memory" not in kinds
    headroom = answer.why.limits[-1]
    assert headroom.values["peak_gib"] == answer.plans[0].memory_gib.total
    assert headroom.values["peak_gib"] > 0.9 * headroom.values["usable_gib"]
    assert "Limited by compute: " in answer.why.summary
    assert f"Memory is tight: {headroom.values['peak_gib']:.1f} of " in answer.why.summary
    assert "Limited by memory" not in answer.why.summary


def test_the_runner_up_names_an_expert_tensor_parallel_change() -> None:
    """Llama 4 Maverick on 256 H100 for torchtitan: the runner-up keeps experts whole (etp 2 -> 1,
    torchtitan's etp = tp); config_changes left etp out."""
    answer = plan(PlanRequest.model_validate({
        "model": {"preset": "llama4-maverick"},
        "training": {"seq_len": 8192, "global_batch_size": 256, "framework": "torchtitan"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    }))  # fmt: skip
    top, second = answer.plans[0].config, answer.plans[1].config
    assert (top.etp, second.etp) == (2, 1)
    assert answer.why.runner_up.config_changes["etp"] == [2, 1]
    assert "etp 2 -> 1" in answer.why.summary


def test_runner_up_memory_within_the_summary_resolution_is_the_same() -> None:
    """A difference that rounds to 0.0 GiB is said as the same memory, not '0.0 GiB more'."""
    from optimizer.explain import runner_up_memory_clause

    assert runner_up_memory_clause(0.03) == "; it needs the same memory (+0.03 GiB)."
    assert runner_up_memory_clause(-0.04) == "; it needs the same memory (-0.04 GiB)."
    assert runner_up_memory_clause(1.26) == "; it needs 1.3 GiB more memory."
    assert runner_up_memory_clause(-2.0) == "; it needs 2.0 GiB less memory."
