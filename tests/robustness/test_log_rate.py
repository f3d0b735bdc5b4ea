"""Error logs are rate-limited per message: a flood cannot fill the disk."""

from __future__ import annotations

import logging

from api.middleware import RateLimitFilter


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)


def test_a_flood_of_one_message_is_cut_to_the_burst_and_the_drops_are_counted(
    monkeypatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("api.middleware.time.monotonic", lambda: clock[0])
    limiter = RateLimitFilter(rate_per_s=2)  # bursts of 10
    passed = [limiter.filter(_record("Too many open files")) for _ in range(1000)]
    assert sum(passed) == 10
    assert limiter.filter(_record("another message"))  # counted per message
    clock[0] += 0.5  # one more token
    record = _record("Too many open files")
    assert limiter.filter(record)
    assert "[990 similar records dropped by the log rate limit]" in record.getMessage()
    assert not limiter.filter(_record("Too many open files"))
