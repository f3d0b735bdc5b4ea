"""Side-by-side scores of one job under several layouts: each layout's breakdown and its deltas
against the first ("why is my layout slower than yours"). The scores come from
``service.evaluate`` (the caller passes them in); this module only compares them."""

from __future__ import annotations

from optimizer.explain import DELTA_MIN_S, describe, time_deltas_s
from optimizer.results import CompareEntry, Plan

MEMORY_DELTA_MIN_GIB = 0.05
"""Memory differences below this (GiB) are not listed."""
MEMORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "buffers", "optimizer_step", "total")


def compare_plans(plans: list[Plan]) -> list[CompareEntry]:
    """One entry per plan, with deltas against ``plans[0]``."""
    base = plans[0]
    return [_entry(base, plan, i) for i, plan in enumerate(plans)]


def memory_deltas_gib(base: Plan, other: Plan) -> dict[str, float]:
    a, b = base.memory_gib, other.memory_gib
    deltas = {k: getattr(b, k) - getattr(a, k) for k in MEMORY_FIELDS}
    return {k: v for k, v in deltas.items() if abs(v) >= MEMORY_DELTA_MIN_GIB}


def _entry(base: Plan, plan: Plan, index: int) -> CompareEntry:
    delta = plan.step_time_s - base.step_time_s
    times = time_deltas_s(base, plan) if index else {}
    memory = memory_deltas_gib(base, plan) if index else {}
    return CompareEntry(
        plan=plan,
        step_time_delta_s=delta,
        relative=delta / base.step_time_s,
        time_deltas_s=times,
        memory_deltas_gib=memory,
        mfu_delta=plan.mfu - base.mfu,
        summary=_summary(base, plan, index, delta, times),
    )


def _summary(base: Plan, plan: Plan, index: int, delta: float, times: dict[str, float]) -> str:
    head = f"layout {index} ({describe(plan)}): {plan.step_time_s:.3f} s a step, {100 * plan.mfu:.1f}% MFU"
    if not plan.fits_memory:
        usable = plan.memory_gib.usable
        head += f", does not fit ({plan.memory_gib.total:.1f} of {usable:.1f} GiB usable)"
    if index == 0:
        return head + " (the reference)"
    if abs(delta) < DELTA_MIN_S:
        return head + ": the same step time as layout 0"
    verb = "slower" if delta > 0 else "faster"
    ranked = sorted(times.items(), key=lambda kv: -abs(kv[1]))
    same_sign = [(k, v) for k, v in ranked if (v > 0) == (delta > 0)][:3]
    why = ", ".join(f"{k} {v:+.3f} s" for k, v in same_sign)
    offset = [(k, v) for k, v in ranked if (v > 0) != (delta > 0)][:2]
    back = ", ".join(f"{k} {v:+.3f} s" for k, v in offset)
    return (
        f"{head}: {abs(delta):.3f} s ({100 * abs(delta) / base.step_time_s:.1f}%) {verb} than layout 0"
        + (f", mostly {why}" if why else "")
        + (f" (offset by {back})" if back else "")
    )
