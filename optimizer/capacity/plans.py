"""What the capacity model adds to a search's answer: every plan's goodput (and time to train
with a token budget), the ranking by ``search.objective``, and suggested GPU counts."""

from __future__ import annotations

from optimizer.capacity.annotate import annotate, rank, resolve_inputs
from optimizer.capacity.suggest import suggestions
from optimizer.results import PlanResponse
from optimizer.specs import PlanRequest


def finish(request: PlanRequest, response: PlanResponse) -> PlanResponse:
    inp = resolve_inputs(request)
    plans = rank(request.search.objective, inp, [annotate(inp, p) for p in response.plans])
    update: dict[str, object] = {"plans": plans}
    if request.search.suggest:
        update["suggestions"] = suggestions(request, response)
    return response.model_copy(update=update)
