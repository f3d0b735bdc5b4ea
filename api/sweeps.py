"""POST /sweeps, GET /sweeps/{id}, DELETE /sweeps/{id}: a /plan job over a grid of GPU counts,
clusters, batch sizes and sequence lengths, planned in a bounded process pool.

A sweep lives in the memory of the process that accepted it (behind a load balancer, route a
sweep's GET and DELETE to the same replica, or run sweeps on one replica). Limits: points per
sweep (422), sweeps running at once (429), finished sweeps kept (the oldest are forgotten).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from api.errors import ERROR_RESPONSES, MessageBody, field_loc, invalid_field
from api.planning import apply_search_limits
from api.settings import Settings, SettingsDep
from api.sweep_manager import SweepManager, TooManySweeps
from optimizer.capacity.sweep import (
    PointError,
    SweepRequest,
    SweepStatus,
    cluster_value_to_blame,
    pin_invalid_at_every_point,
    point_requests,
)
from optimizer.specs import PlanRequest
from optimizer.strict_model import error_reason

router = APIRouter(tags=["planning"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": MessageBody, "description": "No sweep with this id (unknown, or forgotten)."}
}


def get_sweeps(request: Request) -> SweepManager:
    manager: SweepManager = request.app.state.sweeps
    return manager


SweepsDep = Annotated[SweepManager, Depends(get_sweeps)]


class SweepCreated(BaseModel):
    id: str
    status: str = "running"
    total: int


def validated_points(body: SweepRequest, max_points: int) -> list[tuple[dict[str, Any], PlanRequest]]:
    """The grid's points as /plan requests; a 422 naming the field for too many or an invalid one."""
    total = body.num_points()
    if total > max_points:
        message = f"{total} points exceed the server limit max_sweep_points ({max_points})"
        raise invalid_field(("body", "vary"), message, "less_than_equal")
    if (too_many := body.node_entries_problem()) is not None:
        raise invalid_field(("body", "vary"), too_many, "less_than_equal")
    try:
        points = point_requests(body)
    except PointError as exc:
        raise RequestValidationError([_point_error(body, exc.point, e) for e in exc.errors]) from exc
    if (pin := pin_invalid_at_every_point([r for _, r in points])) is not None:
        raise invalid_field(("body", "job", *pin.field.split(".")), f"at every point: {pin.reason}", "invalid_layout")
    return points


def limited_points(
    points: list[tuple[dict[str, Any], PlanRequest]], settings: Settings
) -> tuple[list[tuple[dict[str, Any], PlanRequest]], list[str]]:
    """The points with the server's search limits applied (``apply_search_limits``), and what
    those limits changed (the same for every point: they share the job's ``search``)."""
    limited = [(p, apply_search_limits(r, settings)) for p, r in points]
    warnings = list(dict.fromkeys(w for _, (_, ws) in limited for w in ws))
    return [(p, r) for p, (r, _) in limited], warnings


VARIED_AT: dict[str, tuple[tuple[str, ...], ...]] = {
    "num_gpus": (("cluster", "num_gpus"),),
    "cluster": (("cluster",), ("cluster", "preset")),
    "global_batch_size": (("training", "global_batch_size"),),
    "seq_len": (("training", "seq_len"),),
}
"""Where each ``vary`` axis lands in a point's /plan request (a cluster value is a preset id)."""


def _point_error(body: SweepRequest, point: dict[str, Any], error: Any) -> dict[str, Any]:
    """A point's validation error as a 422 item: at the ``vary`` value that put it there when the
    error is at that value's field, else at the job's; the message names the point (``num_gpus 512``)."""
    msg = error_reason(error)
    inner = field_loc(["body", *error["loc"]], msg)[1:]  # a check across fields names its field
    loc: tuple[Any, ...] = ("body", "job", *inner)
    for axis, places in VARIED_AT.items():
        if axis in point and tuple(inner) in places:
            if axis == "cluster" and not cluster_value_to_blame(body, point):
                break  # the job's own cluster fields are invalid with every preset the sweep names
            loc = ("body", "vary", axis, list(getattr(body.vary, axis)).index(point[axis]))
            break
    where = ", ".join(f"{k} {v}" for k, v in point.items())
    return {**error, "loc": loc, "msg": f"at point {where}: {msg}" if point else msg}


@router.post(
    "/sweeps",
    status_code=202,
    response_model=SweepCreated,
    operation_id="create_sweep",
    summary="Plan one job over a grid of GPU counts, clusters, batch sizes, sequence lengths",
    responses={**ERROR_RESPONSES, 429: {"model": MessageBody, "description": "Too many sweeps running; retry later."}},
)
async def create_sweep(body: SweepRequest, settings: SettingsDep, sweeps: SweepsDep) -> SweepCreated:
    """Queues every point (the product of the ``vary`` axes) and answers at once; poll
    ``GET /sweeps/{id}``."""
    try:
        sweeps.check_room()  # before validating: that can take seconds on a large topology
        points = await run_in_threadpool(validated_points, body, settings.max_sweep_points)  # off the event loop
        jobs, warnings = limited_points(points, settings)
        sweep_id = sweeps.start(jobs, warnings)
    except TooManySweeps as exc:
        raise HTTPException(status_code=429, detail=str(exc)) from exc
    return SweepCreated(id=sweep_id, total=len(jobs))


@router.get(
    "/sweeps/{sweep_id}",
    response_model=SweepStatus,
    operation_id="get_sweep",
    summary="Progress and results",
    responses={**ERROR_RESPONSES, **NOT_FOUND},
)
async def get_sweep(sweep_id: str, sweeps: SweepsDep) -> SweepStatus:
    """``status``, ``done`` of ``total``, every point's result so far, and the Pareto front."""
    status = sweeps.status(sweep_id)
    if status is None:
        raise HTTPException(status_code=404, detail=f"no sweep '{sweep_id}' in this server process")
    return status


@router.delete(
    "/sweeps/{sweep_id}",
    response_model=SweepStatus,
    operation_id="cancel_sweep",
    summary="Cancel a sweep",
    responses={**ERROR_RESPONSES, **NOT_FOUND},
)
async def cancel_sweep(sweep_id: str, sweeps: SweepsDep) -> SweepStatus:
    """Points not started are cancelled; results so far are kept."""
    status = sweeps.cancel(sweep_id)
    if status is None:
        raise HTTPException(status_code=404, detail=f"no sweep '{sweep_id}' in this server process")
    return status
