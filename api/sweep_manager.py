"""The sweeps a service process runs: a bounded process pool that plans each point as /plan
does, the sweeps' results as they come in, cancellation, and the limits (sweeps running at once,
finished sweeps kept). The HTTP routes are ``api.sweeps``; ``pplan sweep`` uses it too."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import threading
import time
import uuid
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from api.middleware import error_log, log_json
from hardware_catalog import load_catalog
from hardware_catalog.capacity import load_capacity_catalog
from optimizer import service
from optimizer.capacity.annotate import price_per_gpu_hour_usd
from optimizer.capacity.sweep import (
    PointResult,
    PointStatus,
    SweepStatus,
    pareto_front,
)
from optimizer.capacity.sweep_notes import unpriced_warning, with_fewer_gpus_notes
from optimizer.errors import InvalidLayout, PlannerError
from optimizer.presets import load_model_presets
from optimizer.reference import ReferenceData, install
from optimizer.search import DEFAULT_SPACE_MEMORY_BYTES, space_memory_budget
from optimizer.specs import PlanRequest

MAX_KEPT = 16
"""Sweeps kept in memory (running ones always; the oldest finished ones are forgotten first):
at most 256 points of about 5 KB of JSON each."""
WORKER_JOIN_TIMEOUT_S = 5.0
"""How long ``SweepManager.close`` waits for each terminated worker process to exit."""


def run_point(request: PlanRequest, space_memory_bytes: float = DEFAULT_SPACE_MEMORY_BYTES) -> PointResult:
    """Plan one point (in a worker process) within /plan's layout-space budget: its status, best
    plan, explanation and warnings (``point`` left empty for the caller). Pins no layout of this
    point can take (``search.fix`` values a 422 on /plan) make the point infeasible, with the field
    and the reason; a point /plan refuses otherwise (a layout space over the budget) failed, with
    /plan's reason."""
    try:
        with space_memory_budget(space_memory_bytes):
            answer = service.plan(request)
    except InvalidLayout as err:
        return PointResult(point={}, status="infeasible", explanation=str(err))
    except PlannerError as err:
        return PointResult(point={}, status="failed", explanation=str(err))
    if not answer.plans:
        # no plan within the point's time limit proves nothing (status feasible, solver UNKNOWN)
        status: PointStatus = "infeasible" if answer.status == "infeasible" else "timed_out"
        return PointResult(point={}, status=status, explanation=answer.explanation, warnings=answer.warnings)
    return PointResult(point={}, status="done", plan=answer.plans[0], warnings=answer.warnings)


def warm_worker(reference: ReferenceData | None = None) -> None:
    """Load the catalogs and the planner once per worker process, before the first point; plan
    with ``reference`` when the app was given its own (``api.main.create_app``)."""
    if reference is not None:
        install(reference)
        return
    load_catalog()
    load_capacity_catalog()
    load_model_presets()


class TooManySweeps(Exception):
    """As many sweeps as allowed are running; retry later (429)."""


@dataclass
class RunningSweep:
    """One sweep as the manager holds it: its points' results so far and their futures."""

    id: str
    results: list[PointResult]
    prices: list[float | None]
    warnings: list[str] = field(default_factory=list)
    futures: list[Future[Any]] = field(default_factory=list)
    cancelled: bool = False
    created: float = field(default_factory=time.monotonic)

    def finished(self) -> int:
        return sum(r.status != "pending" for r in self.results)

    def terminal(self) -> bool:
        return self.finished() == len(self.results)


class SweepManager:
    """Runs sweep points on ``workers`` processes; keeps at most ``max_kept`` sweeps in memory."""

    def __init__(
        self,
        workers: int,
        max_running: int,
        max_kept: int = MAX_KEPT,
        reference: ReferenceData | None = None,
        space_memory_bytes: float = DEFAULT_SPACE_MEMORY_BYTES,
    ) -> None:
        self.reference = reference
        self.space_memory_bytes = space_memory_bytes
        self.workers = workers
        self.max_running = max_running
        self.max_kept = max_kept
        self._lock = threading.Lock()
        self._sweeps: dict[str, RunningSweep] = {}
        self._executor: ProcessPoolExecutor | None = None
        self._closing = False

    def _pool(self) -> ProcessPoolExecutor | None:
        """The worker pool, started on first use; None once the manager is closing."""
        if self._executor is None and not self._closing:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=warm_worker,
                initargs=(self.reference,),
            )
        return self._executor

    def check_room(self) -> None:  # before a sweep's points are validated; ``start`` checks again
        with self._lock:
            self._raise_if_full()

    def _raise_if_full(self) -> None:  # raises ``TooManySweeps``
        running = sum(not s.terminal() for s in self._sweeps.values())
        if running >= self.max_running:
            raise TooManySweeps(f"{running} sweeps running (limit max_sweeps_running = {self.max_running})")

    def start(self, jobs: list[tuple[dict[str, Any], PlanRequest]], warnings: list[str] | None = None) -> str:
        """Queue every point (``warnings``: what applies to all of them, and which GPUs have no
        price); the id to poll. Raises ``TooManySweeps``."""
        prices = [price_per_gpu_hour_usd(r) for _, r in jobs]
        unpriced = unpriced_warning([r.cluster.gpu for _, r in jobs], prices)
        sweep = RunningSweep(
            id=uuid.uuid4().hex[:16],
            results=[PointResult(point=p, status="pending") for p, _ in jobs],
            prices=prices,
            warnings=[*(warnings or []), *([unpriced] if unpriced else [])],
        )
        with self._lock:
            self._raise_if_full()
            self._forget_old()
            self._sweeps[sweep.id] = sweep
            sweep.cancelled = self._closing  # the service is stopping: nothing will run
            pool = self._pool()
        for i, (_, request) in enumerate(jobs):
            try:
                fut = self._submit(pool, request)
            except BrokenProcessPool:  # a worker died earlier: start a fresh pool
                with self._lock:
                    self._executor = None
                    pool = self._pool()
                fut = self._submit(pool, request)
            sweep.futures.append(fut)
            fut.add_done_callback(functools.partial(self._record, sweep, i))
        return sweep.id

    def _submit(self, pool: ProcessPoolExecutor | None, request: PlanRequest) -> Future[Any]:
        """A point's future: planned on ``pool``, or cancelled once the manager is closing (a
        pool started after ``close`` would have nothing left to stop it)."""
        if pool is None or self._closing:
            fut: Future[Any] = Future()
            fut.cancel()
            return fut
        return pool.submit(run_point, request, self.space_memory_bytes)

    def _forget_old(self) -> None:
        done = sorted((s.created, k) for k, s in self._sweeps.items() if s.terminal())
        for _, key in done[: max(0, len(self._sweeps) + 1 - self.max_kept)]:
            del self._sweeps[key]

    def _record(self, sweep: RunningSweep, i: int, fut: Future[Any]) -> None:
        point = sweep.results[i].point
        if fut.cancelled() or (self._closing and fut.exception() is not None):
            result = PointResult(point=point, status="cancelled")
        elif (exc := fut.exception()) is not None:
            reason = "worker process died" if isinstance(exc, BrokenProcessPool) else f"{type(exc).__name__}: {exc}"
            log_json(error_log, logging.ERROR, {"event": "sweep_point_failed", "sweep_id": sweep.id, "point": i,
                                                 "error": reason})  # fmt: skip
            reason = f"internal error ({reason}); quote sweep {sweep.id} point {i} when reporting it"
            result = PointResult(point=point, status="failed", explanation=reason)
        else:
            result = fut.result().model_copy(update={"point": point})
        with self._lock:
            sweep.results[i] = result

    def status(self, sweep_id: str) -> SweepStatus | None:
        with self._lock:
            sweep = self._sweeps.get(sweep_id)
            if sweep is None:
                return None
            results = list(sweep.results)
            cancelled = sweep.cancelled
        results = with_fewer_gpus_notes(results)
        done = sum(r.status != "pending" for r in results)
        if cancelled:
            state = "cancelled"
        elif done < len(results):
            state = "running"
        elif results and all(r.status == "failed" for r in results):
            state = "failed"
        else:
            state = "done"
        return SweepStatus(
            id=sweep_id,
            status=state,  # type: ignore[arg-type]
            done=done,
            total=len(results),
            results=results,
            warnings=sweep.warnings,
            pareto=pareto_front(results, sweep.prices),
        )

    def cancel(self, sweep_id: str) -> SweepStatus | None:
        """Cancel the points not started yet (running ones finish and keep their results)."""
        with self._lock:
            sweep = self._sweeps.get(sweep_id)
            if sweep is None:
                return None
            if not sweep.terminal():
                sweep.cancelled = True
            futures = list(sweep.futures)
        for fut in futures:
            fut.cancel()
        return self.status(sweep_id)

    def close(self) -> None:
        """Cancel the queued points and stop the worker processes, running points included: a
        service stopped with SIGTERM (which reaches only the server process, unlike a terminal's
        Ctrl-C) leaves no worker behind."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._closing = True
        if executor is None:
            return
        # Python 3.14 has ProcessPoolExecutor.terminate_workers(); before it, the processes map
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.terminate()
        deadline = time.monotonic() + WORKER_JOIN_TIMEOUT_S
        for proc in processes:
            # the executor's own thread may reap the process first: is_alive() then stays true
            # until that thread records the exit code, so wait for it rather than join once
            while proc.is_alive() and time.monotonic() < deadline:
                proc.join(timeout=0.01)
        for proc in processes:
            if proc.is_alive():  # ignored SIGTERM past the deadline
                proc.kill()
