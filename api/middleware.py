"""Per-request plumbing: request ids, JSON access log, body size, time and depth limits, HEAD on
GET routes, rate-limited error logs, and the 500 safety net."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
import time
import traceback
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.documents import (
    MAX_DEPTH,
    MAX_JSON_VALUES,
    duplicate_json_key,
    duplicate_message,
    json_shape,
    too_many_values_message,
)
from optimizer.reference import ReferenceData, using

LOGGER_NAME = "pplan"
access_log = logging.getLogger(f"{LOGGER_NAME}.access")
error_log = logging.getLogger(f"{LOGGER_NAME}.error")

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_INCOMING_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


RATE_LIMITED_LOGGERS = ("pplan.error", "uvicorn.error", "asyncio")


class RateLimitFilter(logging.Filter):
    """Lets through at most ``rate_per_s`` records per second per message template (bursts of
    ``5 * rate_per_s``); the next record let through says how many were dropped."""

    def __init__(self, rate_per_s: float) -> None:
        super().__init__()
        self.rate_per_s = rate_per_s
        self.burst = 5 * rate_per_s
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, object], list[float]] = {}  # tokens, last time, dropped

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) > 1024:
                self._buckets.clear()
            tokens, last, dropped = self._buckets.get(key, (self.burst, now, 0.0))
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            if tokens < 1:
                self._buckets[key] = [tokens, now, dropped + 1]
                return False
            self._buckets[key] = [tokens - 1, now, 0.0]
        if dropped:
            record.msg = f"{record.msg} [{int(dropped)} similar records dropped by the log rate limit]"
        return True


def configure_logging(level: str, rate_per_s: float = 20.0) -> None:
    """Send ``pplan.*`` records to stderr, one message per line, and rate-limit the error loggers
    (``RATE_LIMITED_LOGGERS``) to ``rate_per_s`` per message (idempotent)."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level.upper())
    if not any(getattr(h, "_pplan", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._pplan = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    for name in RATE_LIMITED_LOGGERS:
        target = logging.getLogger(name)
        for old in [f for f in target.filters if isinstance(f, RateLimitFilter)]:
            target.removeFilter(old)
        target.addFilter(RateLimitFilter(rate_per_s))


def log_json(logger: logging.Logger, level: int, record: dict[str, Any]) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, json.dumps(record, separators=(",", ":"), default=str))


async def _send_json(send: Send, status: int, body: dict[str, Any], close: bool = False) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if close:  # the rest of the request is not read: the connection cannot be reused
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class _BodyTooLarge(Exception):
    pass


class _BadBody(Exception):
    """A body the JSON checks refuse: a 422 at ``["body"]`` of error type ``kind``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _check_body(body: bytes) -> None:
    """The body's JSON checks before the app parses it, each linear in its size: UTF-8 (the JSON
    parser would also take UTF-16 and UTF-32, past the depth check), nesting depth, keys given
    twice in one object."""
    try:
        text = body.decode("utf-8-sig")  # a byte order mark is allowed (the app's parser skips it too)
    except UnicodeDecodeError as exc:
        raise _BadBody(f"request body is not UTF-8 (byte {exc.start})", "json_invalid") from exc
    depth, values = json_shape(text)
    if depth > MAX_DEPTH:
        raise _BadBody(f"JSON nested deeper than {MAX_DEPTH} levels", "json_too_deep")
    if values > MAX_JSON_VALUES:
        raise _BadBody(too_many_values_message(), "json_too_many_values")
    if (key := duplicate_json_key(text)) is not None:
        raise _BadBody(duplicate_message(key), "json_duplicate_key")


def _routed(scope: Scope) -> bool:
    """Whether a route of the app takes the request's method and path, so its body is read: an
    unknown path stays a 404 and a wrong method a 405, whatever the body holds."""
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if routes is None:  # not under a Starlette app: check every body
        return True
    # a mounted app (the static files) takes no JSON body: its own 404 / 405 answer
    return any(not isinstance(route, Mount) and route.matches(scope)[0] is Match.FULL for route in routes)


async def _buffer_body(scope: Scope, receive: Receive, limit: int) -> Receive:
    """Read the whole body (at most ``limit`` bytes); return a ``receive`` that replays it.

    Raises:
        _BodyTooLarge: if ``Content-Length`` or the bytes actually sent exceed ``limit``.
    """
    declared = Headers(scope=scope).get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # client went away; let the app see it
            pending: Message | None = message
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            pending = None
            break
    body = b"".join(chunks)
    if body and _routed(scope):  # up to max_body_bytes of parsing: on a thread, not the event loop
        await asyncio.to_thread(_check_body, body)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            if pending is not None:
                return pending
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class RequestContextMiddleware:
    """Outermost app middleware (pure ASGI, so it also wraps streaming and exceptions).

    - gives every request an id (an incoming ``X-Request-ID`` if well-formed, else a new one),
      exposes it as ``request.state.request_id`` and returns it in the ``X-Request-ID`` header;
    - answers 413 when the body exceeds ``max_body_bytes`` (declared or actually sent), 408 when
      it is not received within ``body_timeout_s``, 422 when a route takes it and it is not UTF-8,
      repeats a key or nests deeper than ``MAX_DEPTH``;
    - serves HEAD on every GET route (the GET answer without its body);
    - turns any exception that escapes the app into a logged 500 ``{"detail", "request_id"}``;
    - writes one JSON line per request to the ``pplan.access`` logger.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get(REQUEST_ID_HEADER)
        request_id = incoming if incoming and _VALID_INCOMING_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        method = scope.get("method")
        if method == "HEAD":
            scope = {**scope, "method": "GET"}
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, request_id)
            elif method == "HEAD" and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    replay = await _buffer_body(scope, receive, self.max_body_bytes)
            except _BodyTooLarge:
                detail = f"request body too large: the limit is {self.max_body_bytes} bytes"
                await _send_json(send_with_id, 413, {"detail": detail}, close=True)
                return
            except TimeoutError:
                detail = f"request body not received within body_timeout_s = {self.body_timeout_s:g} s"
                await _send_json(send_with_id, 408, {"detail": detail}, close=True)
                return
            except _BadBody as bad:
                item = {"loc": ["body"], "msg": str(bad), "type": bad.kind}
                await _send_json(send_with_id, 422, {"detail": [item]})
                return
            await self.app(scope, replay, send_with_id)
        except Exception as exc:
            log_json(
                error_log,
                logging.ERROR,
                {
                    "event": "unhandled_exception",
                    "request_id": request_id,
                    "method": scope.get("method"),
                    "path": scope.get("path"),
                    "error": repr(exc),
                    "traceback": traceback.format_exc(),
                },
            )
            if status == 0:
                await _send_json(send_with_id, 500, {"detail": "internal error", "request_id": request_id})
            else:  # headers already sent: nothing sensible left to tell the client
                raise
        finally:
            log_json(
                access_log,
                logging.INFO,
                {
                    "event": "request",
                    "method": method,
                    "path": scope.get("path"),
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1e3, 3),
                    "request_id": request_id,
                },
            )


class ReferenceMiddleware:
    """Runs every request with the app's reference data (``optimizer.reference.using``): the
    catalog and presets its body is validated with, and its plans costed with."""

    def __init__(self, app: ASGIApp, reference: ReferenceData) -> None:
        self.app = app
        self.reference = reference

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with using(self.reference):
            await self.app(scope, receive, send)
