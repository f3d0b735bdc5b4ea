"""The server the API runs under: uvicorn with a guarded HTTP/1.1 protocol (``python -m api.server``).

Uvicorn alone never times out a connection that has not finished sending its request headers,
and has no cap on open connections (its ``--limit-concurrency`` answers 503 only once headers
are complete), so a few thousand clients that connect and trickle bytes exhaust the file
descriptors. ``GuardedH11Protocol`` adds what is missing, on uvicorn's own h11 protocol:

- a header read timeout (``header_timeout_s``): a connection whose request headers are not
  complete that long after it opened, or after the first byte of a new request, is closed;
- a connection cap (``max_connections``): a new connection beyond it evicts the oldest idle or
  partial connection (no request being served), so ``/healthz`` keeps answering; with none to
  evict the new one is closed;
- a cap on the header block (``h11_max_incomplete_event_size``: 16 KiB).

The request body's read timeout (``body_timeout_s``) is enforced by the app
(``api.middleware``); idle keep-alive connections close after ``keep_alive_timeout_s``. Uvicorn's
access log is off (the app writes one JSON line per request) and error logs are rate-limited.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.settings import Settings, settings_message

MAX_HEADER_BYTES = 16 * 1024
FD_MARGIN = 256
"""File descriptors kept beyond ``max_connections`` (logs, catalogs, the listening socket)."""
log = logging.getLogger("pplan.error")
_open: dict[GuardedH11Protocol, None] = {}
"""This process's guarded connections, oldest first (a dict keeps insertion order)."""


class GuardedH11Protocol(H11Protocol):
    """Uvicorn's h11 protocol with a header read timeout and a connection cap (module docstring),
    both read from the ``PPLAN_*`` settings (so that every worker process reads them too)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        settings = _settings()
        self.header_timeout_s = settings.header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        if len(self.connections) >= _connection_cap() and not self._evict_one():
            self.transport = transport  # connection_lost closes it again
            transport.close()
            return
        super().connection_made(transport)
        _open[self] = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._serving():
            self._arm()
        super().data_received(data)
        if self._serving() and self._header_timer is not None:
            self._header_timer.cancel()  # headers complete: the app bounds the body
            self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        _open.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _serving(self) -> bool:
        """A request's headers are complete and its response is not."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self._serving():
            self.transport.close()

    def _evict_one(self) -> bool:
        """Close the oldest connection that serves no request; False when every one does."""
        oldest = next((c for c in _open if not c._serving()), None)
        if oldest is None:
            return False
        del _open[oldest]
        self.connections.discard(oldest)
        oldest.transport.close()
        return True


@functools.cache
def _settings() -> Settings:
    return Settings()


def fd_budget(settings: Settings, fd_limit: int) -> tuple[int, int]:
    """(listen backlog, connection cap) that fit in ``fd_limit`` open files.

    The event loop accepts up to ``backlog`` connections at once before any of them reaches the
    cap, so the sockets open at a time stay under ``cap + 2 * backlog + FD_MARGIN``; both are
    lowered to keep that under the limit (then no accept fails with "too many open files")."""
    if fd_limit == resource.RLIM_INFINITY:
        return settings.backlog, settings.max_connections
    usable = max(64, fd_limit - FD_MARGIN)
    backlog = max(16, min(settings.backlog, usable // 4))
    return backlog, max(16, min(settings.max_connections, usable - 2 * backlog))


@functools.cache
def _connection_cap() -> int:
    """``max_connections``, lowered to fit this process's open-file limit (``fd_budget``)."""
    return fd_budget(_settings(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])[1]


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-file limit towards ``wanted`` (within the hard limit); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def uvicorn_options(settings: Settings, fd_limit: int, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` for the service (``overrides``: host, port, workers)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "workers": settings.workers,
        "log_level": settings.log_level,
        "access_log": False,  # the app writes its own JSON access line, once per request
        "http": "api.server:GuardedH11Protocol",
        "timeout_keep_alive": settings.keep_alive_timeout_s,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "backlog": fd_budget(settings, fd_limit)[0],
        "timeout_graceful_shutdown": 5,
        "proxy_headers": False,
    }
    options.update({k: v for k, v in overrides.items() if v is not None})
    return options


def serve(settings: Settings | None = None, **overrides: Any) -> None:
    """Run the service until interrupted."""
    settings = settings or Settings()
    wanted = settings.max_connections + 2 * settings.backlog + FD_MARGIN
    limit = raise_fd_limit(wanted)
    if limit < wanted:
        backlog, cap = fd_budget(settings, limit)
        log.warning(
            '{"event":"fd_limit","detail":"open-file limit %d is below %d: at most %d connections, backlog %d"}',
            limit,
            wanted,
            cap,
            backlog,
        )
    uvicorn.run("api.main:app", **uvicorn_options(settings, limit, **overrides))


if __name__ == "__main__":
    if len(sys.argv) > 1:  # settings come from PPLAN_* variables; `pplan serve` takes options
        sys.exit(f"python -m api.server takes no arguments (got {' '.join(sys.argv[1:])}): set PPLAN_HOST, "
                 "PPLAN_PORT, ... or run `pplan serve --host H --port P`")  # fmt: skip
    try:
        serve()
    except ValidationError as exc:
        sys.exit(settings_message(exc) if exc.title == Settings.__name__ else str(exc))
