"""What a sweep's points say about each other: a GPU count that a smaller one in the same sweep
trains at least as fast."""

from __future__ import annotations

from typing import Any, NamedTuple

from optimizer.capacity.sweep import PointResult, plan_gpus


class _Rated(NamedTuple):
    rate: float
    """Goodput tokens/s."""
    gpus: int
    others: tuple[tuple[str, Any], ...]
    """The point's values on every axis but the GPU count (the points compared share them)."""


def _rated(result: PointResult) -> _Rated | None:
    plan = result.plan
    if result.status != "done" or plan is None or plan.goodput is None or plan.goodput.tokens_per_s <= 0:
        return None
    others = tuple(sorted((k, v) for k, v in result.point.items() if k != "num_gpus"))
    return _Rated(plan.goodput.tokens_per_s, plan_gpus(plan), others)


def with_fewer_gpus_notes(results: list[PointResult]) -> list[PointResult]:
    """``results`` with a warning on each planned point that a point with fewer GPUs (and the
    same other axes) trains at least as fast after failures: the extra GPUs buy nothing."""
    rated = [_rated(r) for r in results]
    out = []
    for result, mine in zip(results, rated, strict=True):
        rivals = [] if mine is None else [
            o for o in rated
            if o is not None and o.rate >= mine.rate and o.others == mine.others and o.gpus < mine.gpus
        ]  # fmt: skip
        if mine is None or not rivals:
            out.append(result)
            continue
        other = min(rivals, key=lambda o: o.gpus)
        note = (
            f"{mine.gpus:,} GPUs train no faster than {other.gpus:,} in this sweep ({mine.rate:,.0f} against "
            f"{other.rate:,.0f} tokens/s after failures): the extra GPUs buy nothing at this batch"
        )
        out.append(result.model_copy(update={"warnings": [*result.warnings, note]}))
    return out


def unpriced_warning(gpus: list[str | None], prices: list[float | None]) -> str | None:
    """The sweep's warning when some points have no price: their ``cost_usd`` is null and the
    Pareto front weighs every point by its GPU count instead of its cost."""
    missing = sorted({g or "?" for g, p in zip(gpus, prices, strict=True) if p is None})
    if not missing:
        return None
    return (
        f"no price for {', '.join(missing)} (costs.price_per_gpu_hour_usd_by_gpu, or costs.price_per_gpu_hour_usd; "
        "the catalog has none): those points' cost_usd is null, and the Pareto front weighs every point by its "
        "GPU count instead of its cost"
    )
