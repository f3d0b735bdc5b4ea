"""Maps errors to HTTP answers: invalid input is a 422 naming the field, overload a 503.

Unexpected exceptions never reach these handlers: ``api.middleware`` turns them into a logged
500 carrying the request id.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.pool import PoolSaturated
from optimizer.errors import InvalidLayout, PlannerError
from optimizer.strict_model import error_reason


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description='Where the problem is, e.g. ["body", "cluster", "gpu"].')
    msg: str = Field(description="What is wrong, with the offending values.")
    type: str = Field(description="Machine-readable kind, e.g. missing, value_error, invalid_layout.")


class ValidationErrorBody(BaseModel):
    """422: the request is malformed or inconsistent."""

    detail: list[ErrorItem]


class MessageBody(BaseModel):
    """404, 408, 413, 503: a one-line reason."""

    detail: str


class InternalErrorBody(BaseModel):
    """500: a server bug; quote ``request_id`` when reporting it."""

    detail: str = "internal error"
    request_id: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    408: {
        "model": MessageBody,
        "description": "The request body was not received within the server's body timeout.",
    },
    413: {"model": MessageBody, "description": "Request body larger than the server limit."},
    422: {
        "model": ValidationErrorBody,
        "description": "Invalid request: each item names the field and the reason.",
    },
    500: {
        "model": InternalErrorBody,
        "description": "Server bug (never caused by request content).",
    },
    503: {
        "model": MessageBody,
        "description": (
            "Planner pool saturated, or the request waited longer than its time limit for a "
            "thread; retry after the `Retry-After` seconds."
        ),
        "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
    },
}


MAX_ERROR_ITEMS = 50
"""Most items a 422 lists (and ``pplan`` prints); one more item says how many were left out."""


def validation_items(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """FastAPI/pydantic error dicts -> the ``{loc, msg, type}`` items of a 422 body (the first
    ``MAX_ERROR_ITEMS``, then one that counts the rest)."""
    items = []
    for e in errors[:MAX_ERROR_ITEMS]:
        msg = error_reason(e)
        if e.get("type") == "json_invalid" and (why := (e.get("ctx") or {}).get("error")):
            msg = f"{msg}: {why} (character {e.get('loc', ('', '?'))[-1]} of the body)"
        items.append(
            {"loc": field_loc(list(e.get("loc", ())), msg), "msg": msg, "type": str(e.get("type", "value_error"))}
        )
    if len(errors) > MAX_ERROR_ITEMS:
        left = len(errors) - MAX_ERROR_ITEMS
        first = ".".join(str(part) for part in errors[MAX_ERROR_ITEMS].get("loc", ()))
        msg = f"and {left:,} more errors not listed (the first at {first})"
        items.append({"loc": ["body"], "msg": msg, "type": "too_many_errors"})
    return items


FIELD_PATH = re.compile(r"^([a-z_]+(?:\.(?:[a-z_0-9]+))*): ")
"""A message that starts by naming its field (``search.fix.recompute: ...``)."""


def field_loc(loc: list[Any], msg: str) -> list[Any]:
    """``loc`` made as deep as the field the message names: a check across fields (a model
    validator) reports at the model's ``loc``, and its message starts with the field's dotted
    path from the body (``["body"]``) or from the model (``topology.nodes`` at
    ``[..., "topology"]``)."""
    match = FIELD_PATH.match(msg)
    if match is None:
        return loc
    path: list[Any] = [int(p) if p.isdigit() else p for p in match.group(1).split(".")]
    if loc == ["body"]:
        return [*loc, *path]
    if loc and path[0] == loc[-1]:
        return [*loc, *path[1:]]
    return loc


def invalid_field(loc: Sequence[str | int], msg: str, type_: str = "value_error") -> RequestValidationError:
    """A 422 for one field, raised from a route after the request model has validated."""
    return RequestValidationError([{"loc": tuple(loc), "msg": msg, "type": type_}])


JOB_SECTIONS = ("model", "training", "cluster", "search")
"""Request sections an ``InvalidLayout`` may name directly (e.g. ``training.precision``)."""


def layout_error(exc: InvalidLayout, *, under: str | None) -> RequestValidationError:
    """A 422 for an ``InvalidLayout``; ``under`` is the request field holding the layout.

    ``exc.field`` is a dotted path such as ``config.tp`` or ``tp``; the error's ``loc`` is
    ``["body", under, ...]`` either way.
    """
    parts: list[str | int] = [p for p in str(exc.field).split(".") if p]
    top_level = bool(parts) and parts[0] in JOB_SECTIONS
    if under is not None and not top_level and (not parts or parts[0] != under):
        parts.insert(0, under)
    return invalid_field(("body", *parts), exc.reason, "invalid_layout")


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    items = validation_items(exc.errors())
    sent = request.headers.get("content-type", "")
    if "json" not in sent.lower():  # FastAPI parses only a JSON body: any other reads as no object at all
        for item in items:
            if item["loc"] == ["body"] and item["type"] in ("model_attributes_type", "missing"):
                item["msg"] += (
                    f" (the body was sent as {sent or 'no content type'}; send JSON, Content-Type: application/json)"
                )
    return JSONResponse(status_code=422, content={"detail": items})


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. bytes that are not UTF-8)
        item = {
            "loc": ["body"],
            "msg": "the request body could not be read as a UTF-8 JSON document (bytes that are not UTF-8, or a number "
            "too long to convert: more than 4,300 digits)",
            "type": "json_invalid",
        }
        return JSONResponse(status_code=422, content={"detail": [item]})
    if exc.status_code == 405:  # one path may have several routes (GET and DELETE /sweeps/{id})
        exc = StarletteHTTPException(405, exc.detail, headers={"Allow": _allowed_methods(request)})
    return await http_exception_handler(request, exc)


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> str:
    """Every method some route of the app serves at the request's path: those a route matches in
    full (routes of included routers answer ``matches`` for their own routes; they carry no
    ``methods`` of their own)."""
    methods = {
        m
        for m in HTTP_METHODS
        if any(route.matches({**request.scope, "method": m})[0] == Match.FULL for route in request.app.routes)
    }
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


async def _planner_error_handler(_: Request, exc: Exception) -> JSONResponse:
    item = {"loc": ["body"], "msg": str(exc), "type": "planner_error"}
    return JSONResponse(status_code=422, content={"detail": [item]})


async def _saturated_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PoolSaturated)
    return JSONResponse(
        status_code=503,
        content={"detail": f"planner busy: {exc}; retry shortly"},
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(PlannerError, _planner_error_handler)
    app.add_exception_handler(PoolSaturated, _saturated_handler)
