"""Why a named framework's rules leave no layout: the layouts ``search.fix`` / ``search.allow``
admit with no framework named, and which of the named framework's facts excludes them."""

from __future__ import annotations

import math
from collections import Counter
from itertools import islice

from pydantic import ValidationError

from optimizer.cost.rules import ResolvedLayout
from optimizer.frameworks import FrameworkProfile, kv_heads_to_split, layout_problem
from optimizer.search.framework_space import target_profiles
from optimizer.search.space import Reach, SpaceBudget, SpaceTimedOut, layout_blocks
from optimizer.specs import JobSpec, SearchSpec, TrainingSpec

MAX_BLOCKS = 256
"""Blocks of the unnamed space read for the reasons (each holds every ZeRO stage and recompute
of one set of sizes): enough for the common reasons, bounded whatever the space's size."""
SHOWN_REASONS = 2
"""Distinct reasons an explanation names, the most frequent first."""


def framework_rules_explanation(job: JobSpec, spec: SearchSpec, deadline: float = math.inf) -> str | None:
    """With a framework named and no layout in its space: the reasons its profile gives for the
    layouts the pins admit without it (the most frequent first, each with an example layout);
    None when no framework is named, no layout is admitted without it either, or ``deadline``
    (``time.perf_counter()``) passes first."""
    if job.training.framework is None:
        return None
    prof = target_profiles(job.training, job.model)[0][0]  # the named framework, as the job runs it
    for fields in (None, SHAPE_FIELDS):  # the request's knobs, else its shape alone
        unnamed = _unnamed(job, fields)
        if unnamed is None:
            continue
        try:
            text = _reasons_text(prof, job, unnamed, spec, SpaceBudget(deadline, math.inf))
        except SpaceTimedOut:
            return None
        if text is not None:
            return text
    return None


def _reasons_text(
    prof: FrameworkProfile, job: JobSpec, unnamed: JobSpec, spec: SearchSpec, budget: SpaceBudget
) -> str | None:
    """The explanation from the layouts of ``unnamed``'s space, None when it holds none."""
    modes = prof.costed_modes(job.model.is_moe)
    reasons: Counter[str] = Counter()
    examples: dict[str, ResolvedLayout] = {}
    checked = 0
    for block in islice(layout_blocks(unnamed, spec, Reach.ALL, budget), MAX_BLOCKS):
        for family in block.families():
            if family.first.recompute not in modes:  # the framework's space holds its own modes only
                continue
            checked += 1
            reason = _problem(prof, job, family.first)
            if reason is not None:
                reasons[reason] += 1
                examples.setdefault(reason, family.first)
    if not reasons:
        return None
    shown = "; ".join(f"{_layout_text(prof, examples[r])}: {r}" for r, _ in reasons.most_common(SHOWN_REASONS))
    more = len(reasons) - SHOWN_REASONS
    return (
        f"no valid layout: {prof.name} runs none of the layouts search.fix / search.allow admit "
        f"({checked:,} checked), for example {shown}" + (f" (and {more} more reasons)" if more > 0 else "")
    )


SHAPE_FIELDS = frozenset({"seq_len", "global_batch_size", "global_batch_tokens", "precision"})
"""The training fields that shape the layout space whatever the stack."""


def _unnamed(job: JobSpec, fields: frozenset[str] | None) -> JobSpec | None:
    """The job as its request would read with no framework named: the fields it gave (of
    ``fields`` only, when given), without the named framework's stack defaults (None if they do
    not validate so)."""
    t = job.training
    given = [k for k in t.model_fields_set if k != "framework" and (fields is None or k in fields)]
    try:
        training = TrainingSpec.model_validate({k: getattr(t, k) for k in given})
    except ValidationError:
        return None
    return job.model_copy(update={"training": training})


def _problem(prof: FrameworkProfile, job: JobSpec, lay: ResolvedLayout) -> str | None:
    return layout_problem(prof, lay, job.model.is_moe, job.training.seq_len, kv_heads_to_split(job.model))


def _layout_text(prof: FrameworkProfile, lay: ResolvedLayout) -> str:
    """A layout in a few words, its recompute under the framework's own name."""
    sizes = " ".join(
        f"{k.upper()}{getattr(lay, k)}" for k in ("tp", "pp", "dp", "cp", "ep", "etp") if getattr(lay, k, 1) != 1
    )
    vpp = f" VPP{lay.vpp}" if lay.vpp > 1 else ""
    recompute = prof.own_recompute(lay.recompute) or lay.recompute
    return f"{sizes or 'DP1'}{vpp} ZeRO-{lay.zero_stage} recompute {recompute}"
