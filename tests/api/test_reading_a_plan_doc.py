"""docs/reading-a-plan.md names every field of a /plan answer and of a Plan, nested ones included,
so a response field added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

import optimizer.results as results
from api import cli
from optimizer import service
from optimizer.results import Plan, PlanResponse
from optimizer.specs import PlanRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "reading-a-plan.md"


def field_names(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Field names of ``model`` and of the response models it nests."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in re.findall(r"optimizer\.[\w.]+\.(\w+)", repr(field.annotation)):
            nested = _response_models().get(arg)
            if nested is not None:
                names |= field_names(nested, seen)
    return names


def _response_models() -> dict[str, type[BaseModel]]:
    """The models ``optimizer.results`` defines or imports (``Layout``, ``Assignment``)."""
    models = vars(results).items()
    return {n: m for n, m in models if isinstance(m, type) and issubclass(m, BaseModel)}


def test_every_answer_field_is_explained() -> None:
    text = DOC.read_text()
    names = field_names(PlanResponse) | field_names(Plan)
    assert {"per_stage", "checkpoint_interval_s", "runner_up", "compute", "pp_bubble"} <= names
    missing = sorted(n for n in names if not _named(n, text))
    assert missing == []


def _named(name: str, text: str) -> bool:
    """Whether ``text`` names the field in code font (`name`, `x.name`, `name` in a list)."""
    return f"`{name}" in text or f"{name}`" in text or f".{name}" in text


def test_the_pages_example_is_what_pplan_plan_answers() -> None:
    """The abridged answer on the page: ``pplan plan examples/plan-llama3-8b-megatron.yaml``."""
    path = DOC.parents[1] / "examples" / "plan-llama3-8b-megatron.yaml"
    answer = service.plan(PlanRequest.model_validate(cli.load_document(str(path))))
    top = answer.plans[0]
    assert answer.status == "optimal" and answer.solver.proved_optimal
    assert (top.config.tp, top.config.pp, top.config.dp, top.config.recompute) == (1, 1, 64, "none")
    assert top.step_time_s == pytest.approx(6.203, abs=5e-4)
    assert top.mfu == pytest.approx(0.550, abs=5e-4)
    assert top.memory_gib.total == pytest.approx(78.27, abs=5e-3)
    assert top.frameworks == ["megatron-lm"]
    assert top.time_to_train is not None
    assert top.time_to_train.days == pytest.approx(17.13, abs=5e-3)
    assert answer.plans[1].memory_gib.per_stage_total == pytest.approx([61.14, 58.60], abs=5e-3)
    low, high = top.tokens_per_s_per_gpu_range
    fast, slow = top.step_time_s_range
    solver = answer.solver
    text = DOC.read_text()
    assert '"step_time_s": 6.203' in text and '"days": 17.13' in text and "[61.14, 58.60]" in text
    assert f'"tokens_per_s_per_gpu_range": [{low:.0f}, {high:.0f}]' in text
    assert f'"step_time_s_range": [{fast:.3f}, {slow:.3f}]' in text
    assert f'"candidates_enumerated": {solver.candidates_enumerated}' in text
    assert f'"candidates_fitting_memory": {solver.candidates_fitting_memory}' in text
