"""Bounded thread pools for planner calls: the event loop never blocks, and overload is a 503.

The app keeps two: one for searches (POST /plan) and one for POST /evaluate, so that a cheap
call never waits behind searches. A call that is still queued when its wait limit passes is
taken off the queue and answered 503 instead of being run late.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

T = TypeVar("T")


MIN_WAIT_S = 1.0
"""The shortest wait a call is given for a thread (a free thread takes it within milliseconds)."""


class PoolSaturated(Exception):
    """Every thread is busy and the wait queue is full; the client should retry shortly."""

    retry_after_s = 1


class QueueTimeout(PoolSaturated):
    """The call waited ``waited_s`` for a thread, longer than its wait limit; it never ran."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"queued {waited_s:g} s without a free thread, longer than the request's time limit")
        self.retry_after_s = max(1, math.ceil(waited_s))


class SolverPool:
    """Runs blocking calls on ``workers`` threads with at most ``workers + max_queue`` in flight.

    A call holds its slot until its thread finishes, even when the awaiting request is cancelled
    (a client that hangs up does not free a thread that is still solving).
    """

    def __init__(self, workers: int, max_queue: int) -> None:
        self.workers = workers
        self.capacity = workers + max_queue
        self._lock = threading.Lock()
        self._in_flight = 0
        self._executor: ThreadPoolExecutor | None = None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="pplan-solver")
            return self._executor

    def _acquire(self) -> None:
        with self._lock:
            if self._in_flight >= self.capacity:
                raise PoolSaturated(f"{self._in_flight} planner calls in flight (capacity {self.capacity})")
            self._in_flight += 1

    def _release(self, _future: Future[Any]) -> None:
        with self._lock:
            self._in_flight -= 1

    async def run(self, fn: Callable[..., T], *args: object, max_wait_s: float | None = None) -> T:
        """Run ``fn(*args)`` on a pool thread and await its result.

        Raises:
            PoolSaturated: when ``capacity`` calls are already in flight.
            QueueTimeout: the call was still waiting for a thread after ``max_wait_s`` (at
                least ``MIN_WAIT_S``).
        """
        executor = self._get_executor()
        self._acquire()
        try:
            # the caller's context (the request's reference data) goes with the call
            future = executor.submit(contextvars.copy_context().run, fn, *args)
        except BaseException:
            self._release(Future())
            raise
        future.add_done_callback(self._release)
        waiting = asyncio.wrap_future(future)
        if max_wait_s is None:
            return await waiting
        max_wait_s = max(max_wait_s, MIN_WAIT_S)
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), max_wait_s)
        except TimeoutError:
            if future.cancel():  # still queued: it never runs, and its slot is freed
                raise QueueTimeout(max_wait_s) from None
            return await waiting  # running: its own deadline bounds it

    def close(self) -> None:
        """Stop accepting work; cancel queued calls (running ones finish in the background)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def get_pool(request: Request) -> SolverPool:
    pool: SolverPool = request.app.state.solver_pool
    return pool


def get_evaluate_pool(request: Request) -> SolverPool:
    pool: SolverPool = request.app.state.evaluate_pool
    return pool


PoolDep = Annotated[SolverPool, Depends(get_pool)]
EvaluatePoolDep = Annotated[SolverPool, Depends(get_evaluate_pool)]
