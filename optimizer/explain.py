"""Why the top plan is what it is: what limits it (memory, the batch and the pipeline bubble it
leaves, a tier's bandwidth, compute) and what the runner-up trades, with the numbers.

Fed by the search's answer (its plans and solver facts); the memory test costs the top plan's
layout with lighter recompute through the cost model (``optimizer.cost``), the same functions
``/evaluate`` uses.
"""

from __future__ import annotations

from optimizer.cost import best_estimate, build_context, resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.frameworks import FrameworkProfile, costed_config, profile
from optimizer.results import Explanation, Plan, PlanLimit, RunnerUp, SolverInfo
from optimizer.search.space import MAX_MICRO_BATCH, MAX_VPP
from optimizer.specs import JobSpec
from optimizer.units import to_gib

SHARE_MIN = 0.02
"""A time category below this share of the step is not named as a limit."""
TIGHT_MEMORY = 0.9
"""Peak memory above this share of the usable memory is named as a limit on its own."""
DELTA_MIN_S = 1e-4
"""Runner-up time differences below this (s) are not listed."""
LIGHTER_RECOMPUTE = {"full": "selective", "selective": "none", "core_attn": "none", "op": "none", "moe": "selective"}
"""The next lighter recompute, in the names the plan uses (the cost model's, or the named
framework's: its ``selective`` is lighter than its ``full``; without one, ``none``)."""
AXIS_NAMES = {"tp": "tensor", "cp": "context", "ep": "expert", "pp": "pipeline", "dp": "data"}
CONFIG_FIELDS = (
    "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage", "recompute", "sequence_parallel",
)  # fmt: skip


def explain(job: JobSpec, plans: list[Plan], solver: SolverInfo) -> Explanation | None:
    """The explanation of an answer with plans (None without plans)."""
    if not plans:
        return None
    top = plans[0]
    limits = top_plan_limits(job, top)
    runner = runner_up(top, plans[1]) if len(plans) > 1 else None
    parts = [f"Top plan ({describe(top)}): {top.step_time_s:.3f} s a step, {100 * top.mfu:.1f}% MFU."]
    binding = [lim for lim in limits if lim.kind != "memory_headroom"]
    if binding:
        parts.append("Limited by " + "; ".join(limit.summary for limit in binding[:3]) + ".")
    parts += [
        f"Memory is tight: {lim.summary.removeprefix('memory: ')}." for lim in limits if lim.kind == "memory_headroom"
    ]
    if runner is not None:
        parts.append(runner.summary)
    if solver.beyond_default_bounds_s is not None:
        parts.append(
            "Layouts beyond the default space's bounds (vpp above 8, micro_batch_size above 16) have a lower bound of "
            f"{solver.beyond_default_bounds_s:.3f} s, below the top plan's, so they were searched too"
            + (" (the top plan is one of them)." if _beyond(top) else "; none beats it.")
        )
    return Explanation(summary=" ".join(parts), limits=limits, runner_up=runner)


def describe(plan: Plan) -> str:
    c = plan.config
    sizes = " ".join(f"{k.upper()}{getattr(c, k)}" for k in ("tp", "pp", "dp", "cp", "ep", "etp") if getattr(c, k) != 1)
    vpp = f" VPP{c.vpp}" if c.vpp > 1 else ""
    return f"{sizes or 'DP1'}{vpp}, micro-batch {c.micro_batch_size}, ZeRO-{c.zero_stage}, recompute {c.recompute}"


def _beyond(plan: Plan) -> bool:
    return plan.config.vpp > MAX_VPP or plan.config.micro_batch_size > MAX_MICRO_BATCH


def top_plan_limits(job: JobSpec, plan: Plan) -> list[PlanLimit]:
    """What limits ``plan``: memory first when it binds (a lighter recompute does not fit), then
    the time categories by size, then memory that is merely tight (``memory_headroom``: it limits
    nothing about the step, but a little more would not fit)."""
    memory = _memory_limit(job, plan)
    timed = [*_pipeline_limits(job, plan), *_communication_limits(job, plan), *_compute_limits(plan)]
    timed.sort(key=lambda lim: -lim.values.get("time_s", 0.0))
    if memory is None:
        return timed
    return timed + [memory] if memory.kind == "memory_headroom" else [memory] + timed


def _memory_limit(job: JobSpec, plan: Plan) -> PlanLimit | None:
    """Memory binds when the same layout with lighter recompute does not fit, or when the peak
    is above ``TIGHT_MEMORY`` of the usable memory."""
    usable = plan.memory_gib.usable
    peak = plan.memory_gib.total
    values = {"peak_gib": peak, "usable_gib": usable}
    lighter, costed = lighter_recompute(job, plan.config.recompute, plan.frameworks[0] if plan.frameworks else None)
    if lighter is not None:
        need = peak_with(job, plan, recompute=costed)
        if need is not None and need > usable:
            values["lighter_recompute_peak_gib"] = need
            return PlanLimit(
                kind="memory",
                summary=(
                    f"memory: recompute '{lighter}' would need {need:.1f} GiB a GPU of {usable:.1f} GiB usable; with "
                    f"'{plan.config.recompute}' the plan takes {peak:.1f} GiB on stage {plan.memory_gib.stage}"
                ),
                values=values,
            )
    if peak > TIGHT_MEMORY * usable:
        return PlanLimit(
            kind="memory_headroom",
            summary=f"memory: {peak:.1f} of {usable:.1f} GiB usable on stage {plan.memory_gib.stage} "
            f"({100 * peak / usable:.1f}%)",
            values=values,
        )
    return None


def lighter_recompute(job: JobSpec, recompute: str, runs_on: str | None = None) -> tuple[str | None, str | None]:
    """The next lighter recompute than the plan's ``recompute`` (in the plan's names) and the
    cost model's mode for it; (None, None) when there is none. With no framework named, the
    next lighter mode of ``runs_on`` (the first framework the plan runs on) when there is one,
    named as the cost model names it: a plan Megatron runs with 'moe' is weighed against
    Megatron's selective ('core_attn'), not the cost model's."""
    named = job.training.framework
    if named is None and runs_on is not None:
        own = profile(runs_on).own_recompute(recompute)
        if own is not None:
            _, costed = _lighter_in(profile(runs_on), own)
            return costed, costed
    lighter = LIGHTER_RECOMPUTE.get(recompute)
    if lighter is None or named is None:
        return lighter, lighter
    return _lighter_in(profile(named), recompute)


def _lighter_in(prof: FrameworkProfile, own: str) -> tuple[str | None, str | None]:
    """The next lighter mode than ``own`` in ``prof``'s names, and its cost-model mode."""
    lighter = LIGHTER_RECOMPUTE.get(own)
    if lighter is None:
        return None, None
    if prof.costed_recompute(lighter) is None:
        lighter = "none"  # the framework has no name for it (DeepSpeed: none and full)
    return lighter, prof.costed_recompute(lighter)


def peak_with(job: JobSpec, plan: Plan, **changes: object) -> float | None:
    """Peak GiB of the plan's layout (same split) with ``changes``, in the cost model's names;
    None when the rules reject it."""
    layout = costed_config(job.training, plan.config).model_copy(update={**changes, "placement": None})
    try:
        lay = resolve_layout(job, layout)
    except InvalidLayout:
        return None
    est = best_estimate(build_context(job), lay)
    return to_gib(est.peak_memory_bytes)


def _pipeline_limits(job: JobSpec, plan: Plan) -> list[PlanLimit]:
    """The bubble and the batch arithmetic behind it."""
    c = plan.config
    bubble = plan.time_breakdown_s.pp_bubble
    gbs = job.training.global_batch_size or 0
    dp, m = c.dp or 1, c.num_micro_batches or 1
    if c.pp == 1 or bubble < SHARE_MIN * plan.step_time_s:
        return []
    fraction = (c.pp - 1) / (c.vpp * m)
    text = (
        f"pipeline bubble: {bubble:.3f} s ({_pct(bubble, plan)} of the step): {gbs:,} sequences over {dp} "
        f"data-parallel replicas are {gbs // dp} each, {m} micro-batches of {c.micro_batch_size} for {c.pp} stages"
        + (f" x {c.vpp} chunks" if c.vpp > 1 else "")
        + f" (bubble over the bubble-free time, (pp-1)/(vpp*m) = {fraction:.3f})"
    )
    if c.vpp == 1 and m % c.pp:
        text += f"; interleaving needs micro-batches divisible by pp ({m} % {c.pp} = {m % c.pp})"
    kind = "batch" if m < 2 * c.pp else "pipeline_bubble"
    values = {
        "time_s": bubble, "micro_batches": float(m), "pp": float(c.pp), "vpp": float(c.vpp), "bubble_over_ideal": fraction,
    }  # fmt: skip
    return [PlanLimit(kind=kind, summary=text, values=values)]


def _communication_limits(job: JobSpec, plan: Plan) -> list[PlanLimit]:
    """Each exposed communication category worth ``SHARE_MIN`` of the step, with the tier its
    groups span and that tier's bandwidth."""
    tiers = {t.name: t for t in build_context(job).topology.tiers}
    out = []
    for axis in ("tp", "cp", "ep", "dp", "pp"):
        seconds = getattr(plan.time_breakdown_s, f"{axis}_comm")
        if seconds < SHARE_MIN * plan.step_time_s:
            continue
        size = getattr(plan.config, axis) or 1
        tier = tiers.get(plan.placement.get(axis, ""))
        values = {"time_s": seconds, f"{axis}_size": float(size)}
        group = f"{size}"
        if axis == "dp" and plan.config.cp > 1:  # gradients reduce over dp x cp (MoE experts: their own groups)
            group = f"{size * plan.config.cp} (dp x cp)"
            values["dp_cp_size"] = float(size * plan.config.cp)
        where = ""
        if tier is not None:
            values["tier_gb_per_s"] = tier.beta_bytes_per_s / 1e9
            where = f", groups of {group} spanning {tier.name} at {tier.beta_bytes_per_s / 1e9:.0f} GB/s a GPU"
        out.append(PlanLimit(
            kind="communication",
            summary=f"{AXIS_NAMES[axis]}-parallel communication: {seconds:.3f} s exposed ({_pct(seconds, plan)} of the "
            f"step){where}",
            values=values,
        ))  # fmt: skip
    return out


def _compute_limits(plan: Plan) -> list[PlanLimit]:
    out = []
    compute = plan.time_breakdown_s.compute
    if compute >= SHARE_MIN * plan.step_time_s:
        out.append(PlanLimit(
            kind="compute",
            summary=f"compute: {compute:.3f} s ({_pct(compute, plan)} of the step) at "
            f"{plan.model_tflops_per_gpu:.0f} model TFLOP/s a GPU",
            values={"time_s": compute, "mfu": plan.mfu},
        ))  # fmt: skip
    opt = plan.time_breakdown_s.optimizer
    if opt >= SHARE_MIN * plan.step_time_s:
        out.append(PlanLimit(
            kind="optimizer",
            summary=f"optimizer step: {opt:.3f} s ({_pct(opt, plan)} of the step), ZeRO-{plan.config.zero_stage}",
            values={"time_s": opt},
        ))  # fmt: skip
    return out


def _pct(seconds: float, plan: Plan) -> str:
    return f"{100 * seconds / plan.step_time_s:.1f}%"


def runner_up(top: Plan, second: Plan) -> RunnerUp:
    """What ``second`` trades against ``top``: layout changes, per-category time deltas, memory."""
    delta = second.step_time_s - top.step_time_s
    changes: dict[str, list[int | str | bool | None]] = {}
    for name in CONFIG_FIELDS:
        a, b = getattr(top.config, name), getattr(second.config, name)
        if a != b:
            changes[name] = [a, b]
    if top.config.stage_layers != second.config.stage_layers and "vpp" not in changes and "pp" not in changes:
        changes["layer_split"] = [str(top.config.stage_layers), str(second.config.stage_layers)]
    for axis in sorted({*top.placement, *second.placement}):
        a, b = top.placement.get(axis), second.placement.get(axis)
        sized = (getattr(top.config, axis, 1) or 1) > 1 or (getattr(second.config, axis, 1) or 1) > 1
        if a != b and sized:
            changes[f"placement.{axis}"] = [a, b]
    times = time_deltas_s(top, second)
    memory = second.memory_gib.total - top.memory_gib.total
    what = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()) or "the same layout"
    trades = ", ".join(f"{k} {'+' if v >= 0 else '-'}{seconds(abs(v))}" for k, v in sorted(
        times.items(), key=lambda kv: -abs(kv[1]))[:4])  # fmt: skip
    summary = (
        f"The runner-up ({what}) is {seconds(delta)} ({100 * delta / top.step_time_s:.2f}%) slower"
        + (f": {trades}" if trades else "")
        + runner_up_memory_clause(memory)
    )
    return RunnerUp(
        step_time_delta_s=delta,
        relative=delta / top.step_time_s,
        config_changes=changes,
        time_deltas_s=times,
        memory_delta_gib=memory,
        summary=summary,
    )


def seconds(value_s: float) -> str:
    """``value_s`` for a sentence: seconds to the millisecond, or milliseconds below 0.01 s."""
    return f"{value_s:.3f} s" if abs(value_s) >= 0.01 else f"{1e3 * value_s:.2f} ms"


def time_deltas_s(base: Plan, other: Plan) -> dict[str, float]:
    """Per time category, ``other`` minus ``base`` (s), those that differ by ``DELTA_MIN_S`` or more."""
    a, b = base.time_breakdown_s.model_dump(), other.time_breakdown_s.model_dump()
    return {k: b[k] - a[k] for k in a if abs(b[k] - a[k]) >= DELTA_MIN_S}


def runner_up_memory_clause(delta_gib: float) -> str:
    """The runner-up's memory against the top plan's, in the summary's 0.1 GiB resolution."""
    if abs(delta_gib) < 0.05:
        return f"; it needs the same memory ({delta_gib:+.2f} GiB)."
    return f"; it needs {abs(delta_gib):.1f} GiB {'more' if delta_gib > 0 else 'less'} memory."
