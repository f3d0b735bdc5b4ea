"""Every shipped plan example answers with a top plan some framework runs as costed (the first
answer a user sees from the docs must be launchable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api import cli
from optimizer import service
from optimizer.specs import PlanRequest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("plan-*.*")), ids=lambda p: p.name)
def test_the_example_top_plan_runs_on_a_framework(path: Path) -> None:
    answer = service.plan(PlanRequest.model_validate(cli.load_document(str(path))))
    assert answer.plans, answer.explanation
    top = answer.plans[0]
    assert top.frameworks, [n for n in top.notes if n.startswith("runs on no framework")]
    assert top.launch is not None
