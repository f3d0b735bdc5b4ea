"""docs/scheduler.md's worked plans are what ``pplan plan`` answers for its example files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from api import cli
from optimizer import service
from optimizer.specs import PlanRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["plan-on-slurm.json", "plan-on-volcano.json", "plan-on-kueue.json"])
def test_the_docs_step_time_is_the_examples(name: str) -> None:
    stated = {(float(t), int(dp)) for t, dp in re.findall(
        r"optimal, ([0-9.]+) s a step, DP (\d+)", (ROOT / "docs" / "scheduler.md").read_text())}  # fmt: skip
    answer = service.plan(PlanRequest.model_validate(cli.load_document(str(ROOT / "examples" / "scheduler" / name))))
    top = answer.plans[0]
    assert answer.status == "optimal"
    assert stated == {(round(top.step_time_s, 3), top.config.dp)}
