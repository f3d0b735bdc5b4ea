"""Which frameworks run a job, each as it runs it: the profiles of ``optimizer/frameworks.py``
narrowed by their ``[[when]]`` rules for the job and by what a blocking data-parallel stack
leaves out. Like ``frameworks``, it imports nothing from the request types."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from optimizer.framework_conditions import When, condition_text
from optimizer.frameworks import Fact, FrameworkProfile, load_profiles, profile
from optimizer.inert_knobs import ANY_LAYOUT, LayoutFacts, inert_knobs


def candidate_frameworks(
    training: Any,
    model: Any,
    tp: int | None = None,
    pp: int | None = None,
    facts: LayoutFacts | None = None,
    generation: str | None = None,
) -> tuple[FrameworkProfile, ...]:
    """The frameworks whose stack runs the job (``training``, ``model``; on GPUs of
    ``generation`` when given; for a layout of ``tp`` and ``pp``, or of ``facts``, when given, else
    at any sizes): the named one, or any of the four, each as it runs the job (``as_run_for``),
    less those its rules leave no ZeRO stage (they run no layout)."""
    named = getattr(training, "framework", None)
    profiles = (profile(named),) if named is not None else tuple(load_profiles().values())
    facts = facts or LayoutFacts(tp, pp)
    runs = (
        as_run_for(p, training, model, facts)
        for p in profiles
        if p.stack_problem(training, model, facts, generation) is None
    )
    return tuple(
        p for p in runs if p.parallelism.zero_stages_without_pp.value or p.parallelism.zero_stages_with_pp.value
    )


def as_run_for(prof: FrameworkProfile, training: Any, model: Any, facts: LayoutFacts = ANY_LAYOUT) -> FrameworkProfile:
    """``prof`` as it runs the job (on a layout of ``facts``): with ``training.dp_comm_overlap``
    false, without the ZeRO stages it always overlaps (it would not run them as costed); narrowed
    by every ``when`` rule the job matches; knobs inert for the layout change nothing."""
    inert = inert_knobs(training, model, facts)
    blocking = not getattr(training, "dp_comm_overlap", True) and "dp_comm_overlap" not in inert
    run = blocking_profile(prof.id) if blocking else prof
    for rule in prof.conditions:
        if rule.involves(inert):  # a rule on a knob that does nothing here
            continue
        if rule.narrows and rule.matches(training, model):
            run = _narrowed(run, rule)
    return run


def _narrowed(prof: FrameworkProfile, rule: When) -> FrameworkProfile:
    """``prof`` with what ``rule`` takes away."""
    par = prof.parallelism
    why = f"with {condition_text(rule)}: {rule.source}"
    changes: dict[str, Fact] = {}
    for name in ("zero_stages_without_pp", "zero_stages_with_pp"):
        if (allowed := getattr(rule, name)) is not None:
            fact = getattr(par, name)
            changes[name] = Fact(tuple(z for z in fact.value if z in allowed), f"{fact.source}; {why}")
    if rule.ep_layouts_pp_needs_vpp:
        changes["ep_layouts_pp_needs_vpp"] = Fact(True, why)
    if rule.ep_group_sizes is not None:
        changes["ep_group_sizes"] = Fact(rule.ep_group_sizes, why)
    if rule.ep_layouts_zero_stages is not None:
        kept = par.ep_layouts_zero_stages.value
        changes["ep_layouts_zero_stages"] = Fact(tuple(z for z in kept if z in rule.ep_layouts_zero_stages), why)
    if rule.ep_layouts_drop_recompute:
        dropped = tuple(par.ep_layouts_excluded_recompute.value) + rule.ep_layouts_drop_recompute
        changes["ep_layouts_excluded_recompute"] = Fact(dropped, why)
    if not rule.tensor_parallel:
        changes["tensor_parallel"] = Fact(False, why)
    return replace(prof, parallelism=replace(par, **changes))


def model_defaults(fid: str, model: Any, training: Any) -> dict[str, Any]:
    """The ``training.*`` defaults the framework's ``when`` rules set for this model and
    ``training.precision`` (rules with defaults match on those only)."""
    return {k: v for rule in profile(fid).conditions if rule.defaults and rule.matches(training, model)
            for k, v in rule.defaults}  # fmt: skip


_JOB_FIELDS = ("seq_len", "global_batch_size", "global_batch_tokens", "framework")
"""What a job's training is without its stack knobs (``framework_job_problem``)."""


def framework_job_problem(training: Any, model: Any, generation: str | None = None) -> tuple[str, str] | None:
    """``(field, reason)`` when the named framework runs no job of this model (on GPUs of
    ``generation``) whatever its other ``training.*`` knobs: at ``training.framework`` when it runs
    none in bf16 either, else at ``training.precision``; None when some knobs run it (or no
    framework is named). A knob the framework does not run is a warning, not this."""
    named = getattr(training, "framework", None)
    if named is None:
        return None
    prof = profile(named)
    for field, keep in (("training.framework", _JOB_FIELDS), ("training.precision", (*_JOB_FIELDS, "precision"))):
        bare = type(training)(**{k: getattr(training, k) for k in keep if k in training.model_fields_set})
        bare.__dict__.update(model_defaults(named, model, bare))
        if (problem := prof.stack_problem(bare, model, ANY_LAYOUT, generation)) is not None:
            return field, problem
    return None


@functools.cache
def blocking_profile(fid: str) -> FrameworkProfile:
    """Profile ``fid`` without the ZeRO stages it always overlaps (a job that blocks them)."""
    prof = profile(fid)
    par = prof.parallelism
    always = par.zero_stages_always_overlapped
    if not always.value:
        return prof

    def drop(fact: Fact) -> Fact:
        kept = tuple(z for z in fact.value if z not in always.value)
        return Fact(kept, f"{fact.source}; without {list(always.value)} when they block ({always.source})")

    narrowed = replace(par, zero_stages_without_pp=drop(par.zero_stages_without_pp),
                       zero_stages_with_pp=drop(par.zero_stages_with_pp))  # fmt: skip
    return replace(prof, parallelism=narrowed)


__all__ = ["as_run_for", "blocking_profile", "candidate_frameworks", "framework_job_problem", "model_defaults"]
