"""An empty default space says which context-parallel sizes it left out as a search choice
(chunks under ``MIN_CP_CHUNK`` tokens), not only that nothing "divides evenly": the rules allow
them and naming them finds the layout."""

from __future__ import annotations

from optimizer.service import plan
from optimizer.specs import PlanRequest

TINY = {
    "model": {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "vocab_size": 50257},
    "training": {"seq_len": 1024, "global_batch_size": 1},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
}


def test_the_explanation_names_the_context_parallel_sizes_left_out() -> None:
    answer = plan(PlanRequest.model_validate(TINY))
    assert answer.status == "infeasible"
    assert answer.explanation.endswith(
        "the default space leaves out cp [2, 4, 8] (context-parallel chunks under 512 tokens): "
        "name them in search.allow.cp to search them"
    )
    named = plan(PlanRequest.model_validate({**TINY, "search": {"allow": {"cp": [1, 2]}}}))
    assert named.status == "optimal"
    assert (named.plans[0].config.tp, named.plans[0].config.cp) == (4, 2)


def test_a_named_cp_gets_no_such_sentence() -> None:
    answer = plan(PlanRequest.model_validate({**TINY, "search": {"allow": {"cp": [1]}}}))
    assert answer.status == "infeasible" and "leaves out cp" not in answer.explanation
