"""What a sweep's points say about each other: a GPU count that a smaller one in the same sweep
trains at least as fast."""

from __future__ import annotations

from typing import Any

from optimizer.capacity.sweep import PointResult


def _rate(result: PointResult) -> float | None:
    plan = result.plan
    if result.status != "done" or plan is None or plan.goodput is None or plan.goodput.tokens_per_s <= 0:
        return None
    return plan.goodput.tokens_per_s


def _gpus(result: PointResult) -> int:
    assert result.plan is not None
    c = result.plan.config
    return c.tp * c.pp * (c.dp or 1) * c.cp


def _others(point: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The point's values on every axis but the GPU count (the points compared share them)."""
    return tuple(sorted((k, v) for k, v in point.items() if k != "num_gpus"))


def with_fewer_gpus_notes(results: list[PointResult]) -> list[PointResult]:
    """``results`` with a warning on each planned point that a point with fewer GPUs (and the
    same other axes) trains at least as fast after failures: the extra GPUs buy nothing."""
    rated = [(r, _rate(r)) for r in results]
    out = []
    for result, rate in rated:
        better = None
        if rate is not None:
            rivals = [
                (o, o_rate)
                for o, o_rate in rated
                if o_rate is not None and o_rate >= rate and _others(o.point) == _others(result.point)
                and _gpus(o) < _gpus(result)
            ]  # fmt: skip
            better = min(rivals, key=lambda r: _gpus(r[0]), default=None)
        if better is None:
            out.append(result)
            continue
        other, other_rate = better
        note = (
            f"{_gpus(result):,} GPUs train no faster than {_gpus(other):,} in this sweep ({rate:,.0f} against "
            f"{other_rate:,.0f} tokens/s after failures): the extra GPUs buy nothing at this batch"
        )
        out.append(result.model_copy(update={"warnings": [*result.warnings, note]}))
    return out
