"""What the capacity model adds to a search's answer: every plan's goodput (and time to train
with a token budget), the ranking by ``search.objective``, and suggested GPU counts."""

from __future__ import annotations

from collections.abc import Callable

from optimizer.capacity.annotate import annotate, rank, resolve_inputs
from optimizer.capacity.suggest import suggestions, unchecked_warning
from optimizer.results import PlanResponse
from optimizer.specs import PlanRequest

RERANK_POOL = 10
"""Objectives other than throughput re-rank at least this many of the fastest layouts."""


def reranked(request: PlanRequest) -> PlanRequest:
    """``request`` as searched: with an objective other than throughput, at least ``RERANK_POOL``
    plans, so that the plan the objective ranks first need not be among the few fastest asked for
    (``finish`` keeps ``top_k`` of them)."""
    search = request.search
    if search.objective == "throughput" or search.top_k >= RERANK_POOL:
        return request
    return request.model_copy(update={"search": search.model_copy(update={"top_k": RERANK_POOL})})


def finish(
    request: PlanRequest, response: PlanResponse, search_plans: Callable[[PlanRequest], PlanResponse]
) -> PlanResponse:
    """``response``'s plans with goodput (and time to train), ranked by ``search.objective``, and
    suggested GPU counts, planned with ``search_plans``."""
    inp = resolve_inputs(request)
    plans = rank(request.search.objective, inp, [annotate(inp, p) for p in response.plans])[: request.search.top_k]
    update: dict[str, object] = {"plans": plans}
    warnings = list(response.warnings)
    if request.search.objective == "cost" and inp.price_per_gpu_hour_usd is None:
        warnings.append(
            f"search.objective 'cost' has no price for {request.cluster.gpu} (costs.price_per_gpu_hour_usd, or "
            "price_per_gpu_hour_usd_by_gpu; the catalog has none): cost_usd is null, and the plans are ranked by "
            "delivered tokens/s, the order any price gives at one GPU count"
        )
    if request.search.suggest:
        update["suggestions"] = suggestions(request, response, search_plans)
        if (warning := unchecked_warning(request, response)) is not None:
            warnings.append(warning)
    if warnings != response.warnings:
        update["warnings"] = warnings
    return response.model_copy(update=update)
