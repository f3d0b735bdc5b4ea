"""torchtitan splits ``seq_len`` over ``tp x 2 cp`` (``parallel_dims.seq_len_divisor``): a stricter
rule than the layout rules' ``2 cp`` and ``tp`` dividing each context-parallel rank's tokens."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.errors import InvalidLayout
from optimizer.frameworks import profile
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, PlanRequest

# 1,000 tokens: tp 8 divides them (the layout rules allow TP8 with sequence parallelism), 16 does not
JOB: dict[str, Any] = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 1000, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
}


def _training(**changes: Any) -> dict[str, Any]:
    return {**JOB, "training": {**JOB["training"], **changes}}


def test_the_rule_in_numbers() -> None:
    titan, megatron = profile("torchtitan"), profile("megatron-lm")
    assert titan.seq_problem(1000, 8, 1) is not None  # 1000 % 16
    assert titan.seq_problem(1000, 4, 1) is None  # 1000 % 8 == 0
    assert titan.seq_problem(1000, 2, 2) is None  # 1000 % 8 == 0
    assert titan.seq_problem(1000, 1, 4) is None  # 1 x 2 x 4 = 8 divides 1000
    assert titan.seq_problem(1000, 2, 4) is not None  # 16 does not
    assert megatron.seq_problem(1000, 8, 1) is None


def test_torchtitan_plans_follow_it() -> None:
    resp = plan(PlanRequest(**_training(framework="torchtitan"), search={"top_k": 5, "diverse": False}))
    assert resp.plans
    for p in resp.plans:
        assert 1000 % (p.config.tp * 2 * p.config.cp) == 0


def test_a_layout_against_it_runs_on_no_framework_when_torchtitan_is_named() -> None:
    named = _training(framework="torchtitan")
    est = evaluate(EvaluateRequest(**named, config={"tp": 8, "recompute": "selective", "zero_stage": 3}))
    assert est.frameworks == []
    assert any("tp x 2 cp = 16" in note for note in est.notes)
    ok = evaluate(EvaluateRequest(**named, config={"tp": 4, "recompute": "selective", "zero_stage": 3}))
    assert ok.frameworks == ["torchtitan"]


def test_a_pin_against_it_is_a_field_error() -> None:
    with pytest.raises(InvalidLayout) as err:
        plan(PlanRequest(**_training(framework="torchtitan"), search={"fix": {"tp": 8}}))
    assert err.value.field == "search.fix.tp"
    assert "tp x 2 cp = 16" in str(err.value)


def test_a_sequence_no_layout_splits_is_a_field_error_at_seq_len() -> None:
    """1,001 tokens: not even tp = cp = 1 (2 must divide them) runs on torchtitan."""
    with pytest.raises(InvalidLayout) as err:
        plan(PlanRequest(**{**JOB, "training": {**JOB["training"], "seq_len": 1001, "framework": "torchtitan"}}))
    assert err.value.field == "training.seq_len"
    assert "tp x 2 cp = 2" in str(err.value)


def test_an_allow_list_against_it_is_a_field_error() -> None:
    """1,002 tokens: tp 4 (8 must divide them) and tp 8 (16) both fail on torchtitan."""
    training = {**JOB["training"], "seq_len": 1002, "framework": "torchtitan"}
    with pytest.raises(InvalidLayout) as err:
        plan(PlanRequest(**{**JOB, "training": training}, search={"allow": {"tp": [4, 8]}}))
    assert err.value.field == "search.allow.tp"
    assert "tp x 2 cp = 8" in str(err.value)
    assert plan(PlanRequest(**{**JOB, "training": training}, search={"allow": {"tp": [1, 8]}})).plans
