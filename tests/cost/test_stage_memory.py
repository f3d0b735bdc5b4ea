"""Per-stage memory by category: each stage's parts add up to its total, the peak stage is the plan's."""

from __future__ import annotations

import pytest

from optimizer import service
from optimizer.specs import PlanRequest

PARTS = ("weights", "gradients", "optimizer", "activations", "buffers")


def test_per_stage_memory_adds_up_to_the_stage_totals() -> None:
    request = PlanRequest.model_validate(
        {
            "model": {"preset": "llama3.1-405b"},
            "training": {"seq_len": 8192, "global_batch_size": 1024},
            "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
            "search": {"top_k": 2},
        }
    )
    plans = service.plan(request).plans
    assert plans and all(p.config.pp > 1 for p in plans)
    for plan in plans:
        memory = plan.memory_gib
        assert len(memory.per_stage) == plan.config.pp == len(memory.per_stage_total)
        for stage, total in zip(memory.per_stage, memory.per_stage_total, strict=True):
            assert sum(getattr(stage, part) for part in PARTS) == pytest.approx(stage.total, rel=1e-12)
            assert stage.total == pytest.approx(total, rel=1e-12)
        peak = memory.per_stage[memory.stage]
        assert peak.total == pytest.approx(memory.total, rel=1e-12)
        assert [getattr(peak, p) for p in PARTS] == pytest.approx([getattr(memory, p) for p in PARTS])
        # stages differ (embedding on the first, loss on the last), so the chart has something to show
        assert len({round(s.total, 6) for s in memory.per_stage}) > 1
