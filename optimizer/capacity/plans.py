"""What the capacity model adds to a search's answer: every plan's goodput (and time to train
with a token budget), the ranking by ``search.objective``, and suggested GPU counts."""

from __future__ import annotations

from collections.abc import Callable

from optimizer.capacity.annotate import annotate, rank, resolve_inputs
from optimizer.capacity.suggest import suggestions, unchecked_warning
from optimizer.results import PlanResponse
from optimizer.specs import PlanRequest


def finish(
    request: PlanRequest, response: PlanResponse, search_plans: Callable[[PlanRequest], PlanResponse]
) -> PlanResponse:
    """``response``'s plans with goodput (and time to train), ranked by ``search.objective``, and
    suggested GPU counts, planned with ``search_plans``."""
    inp = resolve_inputs(request)
    plans = rank(request.search.objective, inp, [annotate(inp, p) for p in response.plans])
    update: dict[str, object] = {"plans": plans}
    if request.search.suggest:
        update["suggestions"] = suggestions(request, response, search_plans)
        if (warning := unchecked_warning(request, response)) is not None:
            update["warnings"] = [*response.warnings, warning]
    return response.model_copy(update=update)
