"""Sequence parallelism in the search: on by default with tensor parallelism; ``search.allow`` /
``search.fix`` name it off (or on) for any TP size, as the layout rules and the target frameworks
allow, and the planner then returns such layouts (Megatron-LM runs TP without it; torchtitan does
not)."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.cost import resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.search.space import Reach, enumerate_layouts
from optimizer.service import search_plans as search
from optimizer.specs import JobSpec, Layout, PlanRequest
from tests.search.test_search import check_against_oracle

JOB: dict[str, Any] = {
    "model": {"name": "d", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024,
              "vocab_size": 1024},
    "training": {"seq_len": 1024, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {"top_k": 3, "allow": {"vpp": [1], "recompute": ["none"], "zero_stage": [1]}},
}  # fmt: skip


def _job(framework: str | None = None, **search_changes: Any) -> dict[str, Any]:
    job = {**JOB, "search": {**JOB["search"], **search_changes}}
    job["search"]["allow"] = {**JOB["search"]["allow"], **search_changes.get("allow", {})}
    if framework is not None:
        job["training"] = {**JOB["training"], "framework": framework}
    return job


def _request(framework: str | None = None, **search_changes: Any) -> PlanRequest:
    return PlanRequest.model_validate(_job(framework, **search_changes))


def _space(req: PlanRequest) -> list:
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    return list(enumerate_layouts(spec, req.search, Reach.ALL))


def _sp_by_tp(req: PlanRequest) -> set[tuple[int, bool]]:
    return {(lay.tp, lay.sequence_parallel) for lay in _space(req)}


def test_default_space_runs_sequence_parallel_with_every_tp_above_one() -> None:
    assert _sp_by_tp(_request()) == {(1, False), (2, True), (4, True), (8, True)}


def test_allow_off_keeps_every_tp_size_without_sequence_parallel() -> None:
    assert _sp_by_tp(_request(allow={"sequence_parallel": [False]})) == {(1, False), (2, False), (4, False), (8, False)}


def test_allow_both_doubles_the_tp_layouts() -> None:
    both = _sp_by_tp(_request(allow={"sequence_parallel": [False, True]}))
    assert both == {(1, False)} | {(t, sp) for t in (2, 4, 8) for sp in (False, True)}


def test_allow_on_leaves_tp_one_out() -> None:
    assert _sp_by_tp(_request(allow={"sequence_parallel": [True]})) == {(2, True), (4, True), (8, True)}


def test_fix_off_with_tp_pinned_is_planned() -> None:
    result = search(_request(fix={"tp": 4, "sequence_parallel": False}))
    assert result.status == "optimal"
    assert {(p.config.tp, p.config.sequence_parallel) for p in result.plans} == {(4, False)}


def test_torchtitan_never_runs_tp_without_sequence_parallel() -> None:
    assert _sp_by_tp(_request("torchtitan", allow={"sequence_parallel": [False]})) == {(1, False)}
    assert _sp_by_tp(_request("megatron-lm", allow={"sequence_parallel": [False]})) >= {(8, False)}


def test_off_space_agrees_with_the_oracle() -> None:
    check_against_oracle(_job(allow={"sequence_parallel": [False, True]}, top_k=5))


MOE_JOB: dict[str, Any] = {
    "model": {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 512,
              "vocab_size": 1024, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512}},
    "training": {"seq_len": 1024, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {"top_k": 3, "allow": {"vpp": [1], "recompute": ["none"], "zero_stage": [1]}},
}  # fmt: skip


def test_moe_models_keep_sequence_parallelism_with_tp() -> None:
    """Megatron-Core's MoE layer refuses tp > 1 without sequence parallelism, and the cost model
    routes each TP rank's own share of the tokens: allowing it off leaves only tp = 1."""
    req = PlanRequest.model_validate({**MOE_JOB, "search": {**MOE_JOB["search"], "allow": {
        **MOE_JOB["search"]["allow"], "sequence_parallel": [False]}}})  # fmt: skip
    assert {(lay.tp, lay.sequence_parallel) for lay in _space(req)} == {(1, False)}
    with pytest.raises(InvalidLayout) as err:
        resolve_layout(JobSpec(model=req.model, training=req.training, cluster=req.cluster),
                       Layout(tp=2, ep=2, sequence_parallel=False))  # fmt: skip
    assert err.value.field == "config.sequence_parallel" and "moe_layer.py" in err.value.reason


@pytest.mark.parametrize(
    ("job", "named", "field", "says"),
    [
        (JOB, {"fix": {"tp": 1, "sequence_parallel": True}}, "search.fix.sequence_parallel", "it needs tp > 1"),
        (JOB, {"fix": {"sequence_parallel": True}, "allow": {"tp": [1]}}, "search.fix.sequence_parallel",
         "it needs tp > 1"),
        (MOE_JOB, {"fix": {"tp": 2, "sequence_parallel": False}}, "search.fix.sequence_parallel",
         "an MoE model with tp > 1 runs with sequence parallelism"),
        (MOE_JOB, {"fix": {"tp": 2}, "allow": {"sequence_parallel": [False]}}, "search.allow.sequence_parallel",
         "an MoE model with tp > 1 runs with sequence parallelism"),
        (MOE_JOB, {"fix": {"sequence_parallel": False}, "allow": {"tp": [2, 4]}}, "search.fix.sequence_parallel",
         "an MoE model with tp > 1 runs with sequence parallelism"),
        ({**JOB, "training": {**JOB["training"], "framework": "torchtitan"}},
         {"fix": {"tp": 2, "sequence_parallel": False}}, "search.fix.sequence_parallel",
         "torchtitan always runs sequence parallelism with TP"),
        # a TP size no layout takes is named first
        (MOE_JOB, {"fix": {"tp": 3, "sequence_parallel": False}}, "search.fix.tp", "does not divide"),
    ],
)  # fmt: skip
def test_named_pairs_no_layout_takes_are_a_422_naming_the_reason(job: dict, named: dict, field: str, says: str) -> None:
    search_spec = {**job["search"], "fix": named.get("fix", {})}
    search_spec["allow"] = {**job["search"]["allow"], **named.get("allow", {})}
    req = PlanRequest.model_validate({**job, "search": search_spec})
    with pytest.raises(InvalidLayout) as err:
        search(req)
    assert err.value.field == field
    assert says in err.value.reason


def test_a_pair_some_named_tp_takes_is_searched() -> None:
    # sequence parallelism off with tp 1 or 2 allowed on an MoE model: tp 1 runs it
    req = PlanRequest.model_validate(
        {
            **MOE_JOB,
            "search": {
                **MOE_JOB["search"],
                "fix": {"sequence_parallel": False},
                "allow": {**MOE_JOB["search"]["allow"], "tp": [1, 2]},
            },
        }
    )
    result = search(req)
    assert result.status == "optimal" and {p.config.tp for p in result.plans} == {1}


def test_megatron_runs_a_pinned_tp_without_sequence_parallelism() -> None:
    job = {**JOB, "training": {**JOB["training"], "framework": "megatron-lm"}}
    result = search(
        PlanRequest.model_validate({**job, "search": {**job["search"], "fix": {"tp": 2, "sequence_parallel": False}}})
    )
    assert result.status == "optimal" and result.plans[0].frameworks == ["megatron-lm"]
    assert "--sequence-parallel" not in result.plans[0].launch.megatron


def test_evaluate_names_sequence_parallelism_without_tp() -> None:
    """/evaluate's layout rules: sequence parallelism with tp = 1 is a 422 naming the field, not a
    layout quietly run without it."""
    req = _request()
    with pytest.raises(InvalidLayout) as err:
        resolve_layout(JobSpec(model=req.model, training=req.training, cluster=req.cluster),
                       Layout(tp=1, sequence_parallel=True))  # fmt: skip
    assert err.value.field == "config.sequence_parallel" and "it needs tp > 1" in err.value.reason


def test_sequence_parallel_needs_each_cp_ranks_tokens_to_split_over_tp() -> None:
    """4,098 tokens (2 x 2,049) divide over TP 2 only: sequence parallelism (Megatron-Core
    scatters the sequence dimension over TP) runs with TP 2, not 4 or 8; without it TP 4 runs.
    4,104 tokens divide over TP 8, but their two context-parallel halves (2,052) do not."""
    odd = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4098, "global_batch_size": 64},
           "cluster": {"preset": "dgx-h100", "num_gpus": 16}}  # fmt: skip
    job = JobSpec(**odd)
    with pytest.raises(InvalidLayout, match="seq_len \\(4098\\) must divide by tp \\(4\\)") as err:
        resolve_layout(job, Layout(tp=4, sequence_parallel=True))
    assert err.value.field == "config.sequence_parallel"
    assert resolve_layout(job, Layout(tp=4, sequence_parallel=False)).tp == 4
    assert resolve_layout(job, Layout(tp=2, sequence_parallel=True)).tp == 2
    assert {lay.tp for lay in _space(PlanRequest.model_validate(odd)) if lay.sequence_parallel} == {2}
    with pytest.raises(InvalidLayout) as pinned:
        search(PlanRequest.model_validate({**odd, "search": {"fix": {"tp": 4, "sequence_parallel": True}}}))
    assert pinned.value.field == "search.fix.sequence_parallel"
    halves = JobSpec(**{**odd, "training": {"seq_len": 4104, "global_batch_size": 64}})
    with pytest.raises(InvalidLayout, match="2052 tokens over tp \\(8\\): they must divide"):
        resolve_layout(halves, Layout(tp=8, cp=2, sequence_parallel=True))
