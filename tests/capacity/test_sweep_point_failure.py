"""A point whose worker raises (a server bug) is ``failed`` with an explanation that says so and
names the sweep and point to quote, and the error is logged."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest

from api.sweep_manager import RunningSweep, SweepManager
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


def test_a_point_over_the_layout_space_budget_fails_with_plans_reason() -> None:
    """/plan refuses a job whose layout space would take more than PPLAN_SEARCH_MEMORY_MIB (a 422);
    a sweep point of it ran without that budget and raised SpaceTooLarge as an internal error. It
    now runs within the budget the manager was given and fails with /plan's reason."""
    from api.sweep_manager import run_point
    from optimizer.specs import PlanRequest

    request = PlanRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 4096, "global_batch_size": 256},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        }
    )
    result = run_point(request, space_memory_bytes=1024.0)
    assert result.status == "failed" and result.explanation is not None
    assert result.explanation.startswith("search space too large") and "internal error" not in result.explanation
    assert run_point(request).status == "done"
    manager = SweepManager(workers=1, max_running=1, space_memory_bytes=1024.0)
    try:
        sweep_id = manager.start([({"num_gpus": 64}, request)])
        for fut in manager._sweeps[sweep_id].futures:
            fut.result(timeout=120)
        status = manager.status(sweep_id)
        assert status is not None and status.results[0].status == "failed"
        assert "search space too large" in (status.results[0].explanation or "")
    finally:
        manager.close()


def test_close_stops_the_worker_processes_and_cancels_running_points() -> None:
    """A service stopped with SIGTERM (only the server process gets it) left its sweep workers
    running; closing the manager now terminates them, and the points they ran read 'cancelled'
    (not an internal error)."""
    import time

    from optimizer.specs import PlanRequest

    request = PlanRequest.model_validate(
        {
            "model": {"preset": "deepseek-v3"},
            "training": {"seq_len": 4096, "global_batch_size": 8192},
            "cluster": {"preset": "hgx-h800", "num_gpus": 2048},
        }
    )
    manager = SweepManager(workers=1, max_running=1)
    sweep_id = manager.start([({"num_gpus": 2048}, request), ({"num_gpus": 1024}, request)])
    executor = manager._executor
    assert executor is not None
    deadline = time.monotonic() + 60
    while not executor._processes and time.monotonic() < deadline:  # the worker is spawned lazily
        time.sleep(0.05)
    processes = list(executor._processes.values())
    assert processes
    manager.close()
    assert not any(p.is_alive() for p in processes)
    while time.monotonic() < deadline:
        status = manager.status(sweep_id)
        assert status is not None
        if all(r.status != "pending" for r in status.results):
            break
        time.sleep(0.05)
    assert [r.status for r in status.results] == ["cancelled", "cancelled"]


def test_a_closed_manager_starts_no_workers() -> None:
    """A sweep started after close() got a fresh pool nothing would stop; its points are now
    cancelled and no worker process starts."""
    from optimizer.specs import PlanRequest

    request = PlanRequest.model_validate(
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 4096, "global_batch_size": 256},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        }
    )
    manager = SweepManager(workers=1, max_running=1)
    manager.close()
    sweep_id = manager.start([({"num_gpus": 64}, request)])
    assert manager._executor is None
    status = manager.status(sweep_id)
    assert status is not None and status.status == "cancelled"
    assert [r.status for r in status.results] == ["cancelled"]


def test_a_pin_no_point_can_take_is_a_422_one_some_points_take_is_their_answer() -> None:
    """/plan refuses ``search.fix.ep: 16`` on a dense model (a 422 at the pin); a sweep of it was
    202 with every point infeasible. A pin that holds at some points only (``tp: 8`` at 4 and 64
    GPUs) stays those points' answer."""
    from fastapi.testclient import TestClient

    from api.main import create_app

    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    }
    with TestClient(create_app()) as client:
        r = client.post(
            "/sweeps", json={"job": {**job, "search": {"fix": {"ep": 16}}}, "vary": {"num_gpus": [64, 256]}}
        )
        assert r.status_code == 422
        (item,) = r.json()["detail"]
        assert item["loc"] == ["body", "job", "search", "fix", "ep"]
        assert item["msg"].startswith("at every point: no layout can take ep = 16")
        some = client.post(
            "/sweeps", json={"job": {**job, "search": {"fix": {"tp": 8}}}, "vary": {"num_gpus": [4, 64]}}
        )
        assert some.status_code == 202, some.text
        client.delete(f"/sweeps/{some.json()['id']}")
