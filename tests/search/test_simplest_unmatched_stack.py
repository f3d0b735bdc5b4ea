"""A job whose ``training.*`` knobs no framework's stack runs still plans under the layout rules
of the named framework (or of every one): the plans' simplest form (``ranking.simplest``) keeps
them too."""

from __future__ import annotations

from optimizer.cost import resolve_layout
from optimizer.frameworks import layout_problem, profile
from optimizer.service import search_plans
from optimizer.specs import JobSpec, PlanRequest


def test_torchtitan_with_flat_collectives_gets_no_zero_1_plan() -> None:
    """torchtitan's stack runs hierarchical data-parallel collectives only, and without pipelines
    it runs ZeRO 0, 2 or 3: ZeRO-1 steps as ZeRO-2 does there, and the simplest form must not
    fall back to it because no framework's stack runs the plan's knobs."""
    request = PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64, "dp_collectives": "flat", "framework": "torchtitan"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        "search": {"top_k": 3},
    })  # fmt: skip
    response = search_plans(request)
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    assert response.plans and any("no framework's stack" in w for w in response.warnings)
    titan = profile("torchtitan")
    for plan in response.plans:
        config = plan.config.model_copy(update={"recompute": titan.costed_recompute(plan.config.recompute)})
        lay = resolve_layout(job, config)
        assert layout_problem(titan, lay, False) is None
