"""POST /plan and POST /evaluate: validate, apply server limits, call the service off the loop."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Body

from api.errors import ERROR_RESPONSES, invalid_field, layout_error
from api.openapi_examples import COMPARE_EXAMPLES, EVALUATE_EXAMPLES, PLAN_EXAMPLES
from api.pool import EvaluatePoolDep, PoolDep
from api.settings import MIB, Settings, SettingsDep
from optimizer import service
from optimizer.errors import InvalidLayout
from optimizer.results import CompareResponse, Plan, PlanResponse
from optimizer.search import space_memory_budget
from optimizer.specs import CompareRequest, EvaluateRequest, PlanRequest

router = APIRouter(tags=["planning"])


def apply_search_limits(request: PlanRequest, settings: Settings) -> tuple[PlanRequest, list[str]]:
    """Enforce the server's search limits.

    Returns:
        The request with ``search.time_limit_s`` defaulted to ``default_time_limit_s`` when not
        given and clamped to ``max_time_limit_s``, and warnings saying what was clamped.

    Raises:
        RequestValidationError: ``search.top_k`` above ``max_top_k`` (a 422).
    """
    search = request.search
    if search.top_k > settings.max_top_k:
        raise invalid_field(
            ("body", "search", "top_k"),
            f"top_k ({search.top_k}) exceeds the server limit max_top_k ({settings.max_top_k})",
            "less_than_equal",
        )
    warnings: list[str] = []
    limit = search.time_limit_s if "time_limit_s" in search.model_fields_set else settings.default_time_limit_s
    if limit > settings.max_time_limit_s:
        warnings.append(
            f"search.time_limit_s ({limit:g} s) clamped to the server limit max_time_limit_s "
            f"({settings.max_time_limit_s:g} s)"
        )
        limit = settings.max_time_limit_s
    if limit != search.time_limit_s:
        request = request.model_copy(update={"search": search.model_copy(update={"time_limit_s": limit})})
    return request, warnings


def _plan_within(space_memory_bytes: float, request: PlanRequest) -> PlanResponse:
    with space_memory_budget(space_memory_bytes):
        return service.plan(request)


@router.post(
    "/plan",
    response_model=PlanResponse,
    operation_id="plan",
    summary="Search ranked layouts for a job",
    responses=ERROR_RESPONSES,
)
async def plan(
    body: Annotated[PlanRequest, Body(openapi_examples=PLAN_EXAMPLES)],
    settings: SettingsDep,
    pool: PoolDep,
) -> PlanResponse:
    """Best layouts first, at most ``search.top_k``.

    A job that no layout can run is not an error: the answer is a 200 with
    ``status: "infeasible"``, no plans and an ``explanation`` with the numbers.
    """
    request, warnings = apply_search_limits(body, settings)
    run = partial(_plan_within, settings.search_memory_mib * MIB)
    try:
        response = await pool.run(run, request, max_wait_s=request.search.time_limit_s)
    except InvalidLayout as exc:
        raise layout_error(exc, under=None) from exc
    if warnings:
        response = response.model_copy(update={"warnings": [*warnings, *response.warnings]})
    return response


@router.post(
    "/compare",
    response_model=CompareResponse,
    operation_id="compare",
    summary="Score a job under several layouts and compare them with the first",
    responses=ERROR_RESPONSES,
)
async def compare(
    body: Annotated[CompareRequest, Body(openapi_examples=COMPARE_EXAMPLES)],
    settings: SettingsDep,
    pool: EvaluatePoolDep,
) -> CompareResponse:
    """Each layout's score (as ``/evaluate`` gives it) with per-category time and memory deltas
    against the first layout, and a line saying what makes it slower or faster.

    At most ``MAX_COMPARE_LAYOUTS`` layouts (a 422 at ``["body", "layouts"]`` beyond); an invalid
    layout is a 422 at ``["body", "layouts", i, field]``.
    """
    try:
        return await pool.run(service.compare, body, max_wait_s=settings.max_time_limit_s)
    except InvalidLayout as exc:
        head, *tail = exc.field.split(".")
        if head != "layouts":
            raise layout_error(exc, under=None) from exc
        index, *rest = tail
        raise invalid_field(("body", "layouts", int(index), *rest), exc.reason, "invalid_layout") from exc


@router.post(
    "/evaluate",
    response_model=Plan,
    operation_id="evaluate",
    summary="Score one given layout",
    responses=ERROR_RESPONSES,
)
async def evaluate(
    body: Annotated[EvaluateRequest, Body(openapi_examples=EVALUATE_EXAMPLES)],
    settings: SettingsDep,
    pool: EvaluatePoolDep,
) -> Plan:
    """Step time, MFU, memory and bottleneck of ``config`` (and ``config.placement`` if given).

    A layout that does not fit in memory is still scored (``fits_memory: false``); a layout
    that breaks a hard rule (sizes that do not divide, product != ``num_gpus``) is a 422.
    """
    try:
        return await pool.run(service.evaluate, body, max_wait_s=settings.max_time_limit_s)
    except InvalidLayout as exc:
        raise layout_error(exc, under="config") from exc
