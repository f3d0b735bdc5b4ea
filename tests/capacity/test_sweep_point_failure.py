"""A point whose worker raises (a server bug) is ``failed`` with an explanation that says so and
names the sweep and point to quote, and the error is logged."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest

from api.sweeps import RunningSweep, SweepManager
from optimizer.capacity.sweep import PointResult


def test_a_failed_point_says_internal_error_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    manager = SweepManager(workers=1, max_running=1)
    sweep = RunningSweep(id="abc", results=[PointResult(point={"num_gpus": 8}, status="pending")], prices=[None])
    fut: Future[Any] = Future()
    fut.set_exception(NameError("name 'x' is not defined"))
    with caplog.at_level(logging.ERROR, logger="pplan.error"):
        manager._record(sweep, 0, fut)
    result = sweep.results[0]
    assert result.status == "failed"
    assert result.explanation == (
        "internal error (NameError: name 'x' is not defined); quote sweep abc point 0 when reporting it"
    )
    assert any('"sweep_point_failed"' in r.getMessage() and '"abc"' in r.getMessage() for r in caplog.records)
