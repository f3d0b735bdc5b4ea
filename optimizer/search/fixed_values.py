"""``search.fix`` / ``search.allow`` values that no layout of the job can take, whatever the other
fields: an invalid request (a 422 naming ``search.fix.<field>``), not an infeasible job.

Each check is one of the layout rules (``optimizer.cost.rules.resolve``) that involves only that
field and the job, or pinned fields that contradict one another whatever the unpinned ones take;
other combinations are the search's business.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

from optimizer.cost.rules import resolve, sequence_parallel_reason, tensor_parallel_reason
from optimizer.errors import InvalidLayout
from optimizer.framework_targets import as_run_for, framework_job_problem
from optimizer.frameworks import FrameworkProfile, kv_heads_to_split, load_profiles, partitions, profile
from optimizer.modes import RecomputeMode
from optimizer.specs import JobSpec, SearchSpec


def _tp(job: JobSpec, tp: int) -> str | None:
    n = job.cluster.resolved_num_gpus
    if n % tp:
        return f"tp ({tp}) does not divide num_gpus ({n})"
    return tensor_parallel_reason(job, tp)


def _pp(job: JobSpec, pp: int) -> str | None:
    n, layers = job.cluster.resolved_num_gpus, job.model.num_layers or 0
    if n % pp:
        return f"pp ({pp}) does not divide num_gpus ({n})"
    if pp > layers:
        return f"pp ({pp}) exceeds num_layers ({layers})"
    return None


def _cp(job: JobSpec, cp: int) -> str | None:
    n, seq = job.cluster.resolved_num_gpus, job.training.seq_len
    if n % cp:
        return f"cp ({cp}) does not divide num_gpus ({n})"
    if cp > 1 and seq % (2 * cp):
        return f"seq_len ({seq}) must be divisible by 2*cp ({2 * cp}) for load-balanced context parallelism"
    if cp > 1 and job.training.attention_kernel == "unfused":
        return "context parallelism needs a fused attention kernel (training.attention_kernel is 'unfused')"
    return None


def _dp(job: JobSpec, dp: int) -> str | None:
    n, gbs = job.cluster.resolved_num_gpus, job.training.global_batch_size or 0
    if n % dp:
        return f"dp ({dp}) does not divide num_gpus ({n})"
    if gbs % dp:
        return f"dp ({dp}) does not divide global_batch_size ({gbs})"
    return None


def _ep(job: JobSpec, ep: int) -> str | None:
    moe, n = job.model.moe, job.cluster.resolved_num_gpus
    if moe is None:
        return None if ep == 1 else "ep > 1 needs an MoE model"
    if moe.num_experts % ep:
        return f"num_experts ({moe.num_experts}) is not divisible by ep ({ep})"
    if n % ep:
        return f"ep ({ep}) does not divide num_gpus ({n})"
    return None


def _etp(job: JobSpec, etp: int) -> str | None:
    moe, n = job.model.moe, job.cluster.resolved_num_gpus
    if moe is None:
        return None if etp == 1 else "etp > 1 splits routed experts and needs an MoE model"
    if moe.expert_ffn_hidden_size % etp:
        return f"moe.expert_ffn_hidden_size ({moe.expert_ffn_hidden_size}) is not divisible by etp ({etp})"
    if n % etp:
        return f"etp ({etp}) does not divide num_gpus ({n})"
    return None


def _vpp(job: JobSpec, vpp: int) -> str | None:
    layers = job.model.num_layers or 0
    if vpp > 1 and 2 * vpp > layers:
        return f"vpp ({vpp}) needs pp >= 2 and pp*vpp <= num_layers ({layers}): at most {layers // 2}"
    return None


def _micro_batch_size(job: JobSpec, mbs: int) -> str | None:
    gbs = job.training.global_batch_size or 0
    if gbs % mbs:
        return f"micro_batch_size ({mbs}) does not divide global_batch_size ({gbs})"
    return None


CHECKS: dict[str, Callable[[JobSpec, int], str | None]] = {
    "tp": _tp, "pp": _pp, "cp": _cp, "dp": _dp, "ep": _ep, "vpp": _vpp, "micro_batch_size": _micro_batch_size,
    "etp": _etp,
}  # fmt: skip
"""Per layout field: why a value cannot be taken by any layout of the job (None when it can)."""


def _sequence_parallel_reason(job: JobSpec, tp: int, sp: bool) -> str | None:
    """Why no layout runs ``tp`` with sequence parallelism ``sp``: the layout rules'
    reason, else the named framework's (None when one can)."""
    if (reason := sequence_parallel_reason(job, tp, sp)) is not None:
        return reason
    named = job.training.framework
    return None if named is None else profile(named).sizes_problem(tp, 1, 1, 1, 1, False, sp)


def _check_sequence_parallel_pairs(job: JobSpec, search: SearchSpec) -> None:
    """Raise ``InvalidLayout`` at the ``sequence_parallel`` field named when every pair of the
    sequence-parallel settings and TP sizes that ``search.fix`` / ``search.allow`` name is one no
    layout takes (with both named; the rest is the space's)."""
    fix, allow = search.fix, search.allow
    sps = [fix.sequence_parallel] if fix.sequence_parallel is not None else allow.sequence_parallel
    tps = [fix.tp] if fix.tp is not None else allow.tp
    if not sps or not tps:
        return
    reasons = [_sequence_parallel_reason(job, tp, sp) for tp in tps for sp in sps]
    if any(r is None for r in reasons):
        return
    field = "search.fix.sequence_parallel" if fix.sequence_parallel is not None else "search.allow.sequence_parallel"
    raise InvalidLayout(field, f"no layout takes sequence_parallel {sps} with tp {tps}: {reasons[0]}")


def _check_fix_within_allow(search: SearchSpec) -> None:
    """Raise ``InvalidLayout`` at ``search.fix.<field>`` when ``search.allow`` names the same field
    without the pinned value."""
    for name in type(search.fix).model_fields:
        fixed, allowed = getattr(search.fix, name), getattr(search.allow, name, None)
        if fixed is not None and allowed is not None and fixed not in allowed:
            raise InvalidLayout(
                f"search.fix.{name}", f"{name} = {fixed!r} is not among search.allow.{name} {list(allowed)}"
            )


class _Named(NamedTuple):
    """The values ``search.fix`` (else ``search.allow``) names for one field, the field that named
    them and how an error shows them."""

    values: list[int]
    field: str
    shown: str


def _named_values(search: SearchSpec, name: str) -> _Named:
    fixed, allowed = getattr(search.fix, name), getattr(search.allow, name)
    if fixed is not None:
        return _Named([fixed], f"search.fix.{name}", f"{name} = {fixed}")
    values = list(allowed or ())
    return _Named(values, f"search.allow.{name}", f"any of {name} {values}")


def _check_heads_pins(job: JobSpec, search: SearchSpec) -> None:
    """Raise at ``search.fix.tp`` (or ``search.allow.tp``) when the named framework, or with none
    named every framework, splits the model's key/value heads none of those ways."""
    kv, named = kv_heads_to_split(job.model), job.training.framework
    profiles = [profile(named)] if named is not None else list(load_profiles().values())
    tps = _named_values(search, "tp")
    reasons = [p.heads_problem(kv, tp) for tp in tps.values for p in profiles]
    if tps.values and all(r is not None for r in reasons):
        lead = "no framework runs" if named is None else "no layout can take"
        raise InvalidLayout(tps.field, f"{lead} {tps.shown}: {reasons[0]}")


def _check_partition_pins(job: JobSpec, search: SearchSpec, prof: FrameworkProfile) -> None:
    """Raise at ``search.fix.pp`` / ``search.allow.pp`` when a framework without per-stage layer
    counts partitions the model's layers over none of those depths (``frameworks.partitions``)."""
    counts, layers = prof.parallelism.uneven_stage_layers, job.model.num_layers or 0
    pps = _named_values(search, "pp")
    if counts.value or not pps.values or any(partitions(layers, pp) for pp in pps.values):
        return
    raise InvalidLayout(pps.field, f"no layout can take {pps.shown}: {prof.name}'s balanced partition does not split "
                        f"{layers} layers evenly over that many stages ({counts.source})")  # fmt: skip


def _check_framework_pins(job: JobSpec, search: SearchSpec) -> None:
    """Raise ``InvalidLayout`` at the ``search.fix`` field whose value the named framework (as the
    job runs it) runs with no layout: a parallel size it lacks (the others at 1), a ZeRO stage it
    never runs or none with the pinned ``pp``; or at ``search.allow.zero_stage`` when it runs
    none of those."""
    named, fix = job.training.framework, search.fix
    if named is None:
        return
    prof = as_run_for(profile(named), job.training, job.model)
    excluded = prof.parallelism.ep_layouts_excluded_recompute
    if fix.recompute is not None and fix.ep is not None and fix.ep > 1:
        if prof.costed_recompute(fix.recompute) in excluded.value:
            raise InvalidLayout(
                "search.fix.recompute",
                f"{prof.name} runs no recompute {fix.recompute!r} with ep {fix.ep} for this job ({excluded.source})",
            )
    for name in ("cp", "ep", "vpp"):
        value = getattr(fix, name)
        sizes = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, name: value or 1}
        if value is not None and (reason := prof.sizes_problem(**sizes, uneven=False, sp=False)) is not None:
            raise InvalidLayout(f"search.fix.{name}", f"no layout can take {name} = {value}: {reason}")
    _check_partition_pins(job, search, prof)
    if (reason := prof.seq_problem(job.training.seq_len, 1, 1)) is not None:
        raise InvalidLayout("training.seq_len", f"no layout can split it: {reason}")
    for name in ("tp", "cp"):
        value = getattr(fix, name)
        # the least strict split: the other size at its pin, or 1
        tp, cp = (value, fix.cp or 1) if name == "tp" else (fix.tp or 1, value)
        if value is not None and (reason := prof.seq_problem(job.training.seq_len, tp, cp)) is not None:
            raise InvalidLayout(f"search.fix.{name}", f"no layout can take {name} = {value}: {reason}")
        allowed = getattr(search.allow, name)
        if value is None and allowed:
            other = fix.cp or 1 if name == "tp" else fix.tp or 1
            pairs = [(v, other) if name == "tp" else (other, v) for v in allowed]
            reasons = [prof.seq_problem(job.training.seq_len, t, c) for t, c in pairs]
            if all(r is not None for r in reasons):
                raise InvalidLayout(
                    f"search.allow.{name}", f"no layout can take any of {name} {list(allowed)}: {reasons[0]}"
                )
    _check_framework_zero_pins(job, search, prof)
    _check_allowed_depths(job, search, prof)


_SIZE_PINS = ("pp", "tp", "cp", "dp", "ep")
"""Pinned sizes a framework's ZeRO rules involve, in the order a conflict is blamed on them."""


def _size_pins(search: SearchSpec) -> dict[str, int | None]:
    """The pinned sizes the ZeRO rules read (``_SIZE_PINS`` and ``vpp``; None where not pinned)."""
    return {name: getattr(search.fix, name) for name in (*_SIZE_PINS, "vpp")}


def _prime_factors(n: int) -> int:
    """How many prime factors ``n`` has, counted with multiplicity."""
    count, d = 0, 2
    while d * d <= n:
        while n % d == 0:
            n, count = n // d, count + 1
        d += 1
    return count + (n > 1)


def _size_choices(job: JobSpec, pins: dict[str, int | None], interleaved: bool) -> list[dict[str, int]]:
    """The (tp, pp, cp, dp) whose product is num_gpus, with ``pins``' values where they name one,
    up to what the ZeRO rules read of an unpinned size (1 or above 1, shown as 2; an unpinned pp
    above 1 when ``interleaved``: vpp > 1 needs a pipeline); ep at its pin, else 1. Empty when
    the pins do not divide num_gpus (which other checks name). A split has at most as many sizes
    above 1 as ``rest`` has prime factors."""
    n, axes = job.cluster.resolved_num_gpus, ("tp", "pp", "cp", "dp")
    pinned = math.prod(pins[a] or 1 for a in axes)
    if n % pinned:
        return []
    rest, free = n // pinned, [a for a in axes if pins[a] is None]
    out: list[dict[str, int]] = []
    for above in itertools.product((False, True), repeat=len(free)):
        split = sum(above)
        if split > _prime_factors(rest) or (rest > 1) != (split > 0):
            continue
        if interleaved and "pp" in free and not above[free.index("pp")]:
            continue
        sizes = {a: pins[a] or 1 for a in axes} | {a: 2 for a, up in zip(free, above, strict=True) if up}
        out.append(sizes | {"ep": pins["ep"] or 1})
    return out


def _zero_reasons(job: JobSpec, prof: FrameworkProfile, pins: dict[str, int | None], zeros: list[int]) -> list[str]:
    """Why each layout the pinned sizes allow runs none of ``zeros`` on the framework; empty when
    one does (or no layout divides, which other checks name)."""
    reasons: list[str] = []
    interleaved = (pins.get("vpp") or 1) > 1
    for s in _size_choices(job, pins, interleaved):
        for z in zeros:
            reason = prof.zero_problem(s["pp"], s["dp"], s["tp"], s["cp"], s["ep"], 1, z)
            if reason is None:
                return []
            reasons.append(reason)
    return reasons


def _check_framework_zero_pins(job: JobSpec, search: SearchSpec, prof: FrameworkProfile) -> None:
    """Raise ``InvalidLayout`` when the named framework runs no ZeRO stage the request allows with
    the pinned sizes, whatever the unpinned sizes take: at the ``zero_stage`` field when another
    stage would run, else at the pinned size whose pin alone excludes every stage (pp first)."""
    fix = search.fix
    named: list[int] = [fix.zero_stage] if fix.zero_stage is not None else list(search.allow.zero_stage or [])
    pins = _size_pins(search)
    reasons = _zero_reasons(job, prof, pins, named or [0, 1, 2, 3])
    if not reasons:
        return
    field = "search.fix.zero_stage" if fix.zero_stage is not None else "search.allow.zero_stage"
    shown = named[0] if len(named) == 1 else named
    if named and not _zero_reasons(job, prof, pins, [0, 1, 2, 3]):
        raise InvalidLayout(field, f"no layout can take zero_stage = {shown}: {reasons[0]}")
    for name in _SIZE_PINS:
        if pins[name] is not None and not _zero_reasons(job, prof, {**pins, name: None}, named or [0, 1, 2, 3]):
            raise InvalidLayout(f"search.fix.{name}", f"no layout can take {name} = {pins[name]}: {reasons[0]}")
    if named:  # the stage and some pin are both at fault: the stage, as the rule it breaks says
        raise InvalidLayout(field, f"no layout can take zero_stage = {shown}: {reasons[0]}")


def _check_allowed_depths(job: JobSpec, search: SearchSpec, prof: FrameworkProfile) -> None:
    """Raise at ``search.allow.pp`` when the named framework runs no ZeRO stage at all at any of
    those depths, while it runs one at some other depth (the other pins the same): as
    ``_check_framework_zero_pins`` does for ``search.fix.pp``. Depths excluded only together with
    a ZeRO pin are left to the infeasible answer's explanation."""
    fix, allowed = search.fix, search.allow.pp
    if fix.pp is not None or not allowed:
        return
    zeros = [0, 1, 2, 3]
    pins = _size_pins(search)
    reasons = [_zero_reasons(job, prof, {**pins, "pp": pp}, zeros) for pp in allowed]
    if all(reasons) and not _zero_reasons(job, prof, pins, zeros):
        raise InvalidLayout("search.allow.pp", f"no layout can take any of pp {list(allowed)}: {reasons[0][0]}")


def _check_pins_together(job: JobSpec, search: SearchSpec) -> None:
    """Raise ``InvalidLayout`` at a ``search.fix`` field whose pinned value contradicts the other
    pins whatever the unpinned fields take: the pinned tp x pp x cp x dp not dividing num_gpus,
    vpp > 1 with pp pinned to 1 or pp x vpp above num_layers, an expert block (ep x etp, times the
    pinned pp) not dividing num_gpus, micro-batches that cannot split the global batch over the
    pinned dp."""
    fix, n = search.fix, job.cluster.resolved_num_gpus
    pinned = [(name, getattr(fix, name)) for name in ("tp", "pp", "cp", "dp") if getattr(fix, name) is not None]
    product = 1
    for i, (name, value) in enumerate(pinned):
        product *= value
        if i > 0 and n % product:
            shown = " x ".join(f"{k} {v}" for k, v in pinned[: i + 1])
            raise InvalidLayout(f"search.fix.{name}", f"{shown} = {product} does not divide num_gpus ({n})")
    layers = job.model.num_layers or 0
    if fix.vpp is not None and fix.vpp > 1 and fix.pp is not None and (fix.pp == 1 or fix.pp * fix.vpp > layers):
        raise InvalidLayout(
            "search.fix.vpp", f"vpp {fix.vpp} with pp {fix.pp} needs pp >= 2 and pp x vpp <= num_layers ({layers})"
        )
    etp, pp = fix.etp or 1, fix.pp or 1
    if fix.ep is not None and n % (fix.ep * etp * pp):
        field = "etp" if etp > 1 else "ep"
        raise InvalidLayout(f"search.fix.{field}", f"ep {fix.ep} x etp {etp} x pp {pp} does not divide num_gpus ({n})")
    gbs = job.training.global_batch_size or 0
    if fix.micro_batch_size is not None and fix.dp is not None and gbs % (fix.micro_batch_size * fix.dp):
        raise InvalidLayout(
            "search.fix.micro_batch_size",
            f"micro_batch_size {fix.micro_batch_size} x dp {fix.dp} does not divide global_batch_size ({gbs})",
        )


def check_named_values(job: JobSpec, search: SearchSpec) -> None:
    """Raise ``InvalidLayout`` at ``search.fix.<field>`` for a pinned value no layout can take
    (outside ``search.allow``, against a layout rule, or one the named framework never runs), and
    at ``search.allow.<field>`` when no allowed value can be taken, with the reason; then at the
    ``sequence_parallel`` field when it cannot go with any named TP size. First, at
    ``training.framework`` (or ``training.precision``) when the named framework runs no job of the
    model (``framework_error``)."""
    if (error := framework_error(job)) is not None:
        raise error
    _check_fix_within_allow(search)
    _check_framework_pins(job, search)
    for name, check in CHECKS.items():
        fixed = getattr(search.fix, name)
        if fixed is not None and (reason := check(job, fixed)) is not None:
            raise InvalidLayout(f"search.fix.{name}", f"no layout can take {name} = {fixed}: {reason}")
        allowed = getattr(search.allow, name)
        if allowed:
            reasons = [check(job, v) for v in allowed]
            if all(r is not None for r in reasons):
                raise InvalidLayout(
                    f"search.allow.{name}",
                    f"no layout can take any of {name} = {allowed}: " + "; ".join(r for r in reasons if r is not None),
                )
    _check_heads_pins(job, search)
    _check_sequence_parallel_pairs(job, search)
    _check_pins_together(job, search)


def framework_error(job: JobSpec) -> InvalidLayout | None:
    """The error at ``training.framework`` / ``training.precision`` when the named framework runs
    no job of this model (and precision): no plan could name it."""
    problem = framework_job_problem(job.training, job.model, job.gpu_generation)
    return None if problem is None else InvalidLayout(problem[0], f"{problem[1]}; name another framework, or none")


def fixed_combination_reason(job: JobSpec, search: SearchSpec) -> str | None:
    """Why the values ``search.fix`` pins cannot go together, when the layout rules say so for the
    pinned values with the others at their smallest (tp, pp, cp, ep, vpp, micro-batch 1); None
    when that layout is valid or nothing is pinned."""
    fix = search.fix
    sizes = ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size")
    if all(getattr(fix, name) is None for name in (*sizes, "dp")):
        return None
    values: dict[str, int] = {name: getattr(fix, name) or 1 for name in sizes}
    try:
        resolve(
            job, tp=values["tp"], pp=values["pp"], cp=values["cp"], ep=values["ep"], vpp=values["vpp"],
            micro_batch_size=values["micro_batch_size"],
            zero_stage=fix.zero_stage or 1, recompute=fix.recompute or RecomputeMode.SELECTIVE,
            sequence_parallel=values["tp"] > 1 if fix.sequence_parallel is None else fix.sequence_parallel, dp=fix.dp,
        )  # fmt: skip
    except InvalidLayout as err:
        shown = ", ".join(f"{k}={getattr(fix, k)}" for k in (*sizes, "dp") if getattr(fix, k) is not None)
        return f"with search.fix {shown} (the rest at 1): {err.field.removeprefix('config.')}: {err.reason}"
    return None
