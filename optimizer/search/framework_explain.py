"""Why a named framework's rules leave no layout: the layouts ``search.fix`` / ``search.allow``
admit with no framework named, and which of the named framework's facts excludes them."""

from __future__ import annotations

from collections import Counter
from itertools import islice

from pydantic import ValidationError

from optimizer.cost.rules import ResolvedLayout
from optimizer.frameworks import FrameworkProfile, kv_heads_to_split, layout_problem
from optimizer.search.framework_space import target_profiles
from optimizer.search.space import Reach, SpaceBudget, SpaceTimedOut, SpaceTooLarge, layout_blocks
from optimizer.specs import JobSpec, SearchSpec, TrainingSpec

MAX_BLOCKS = 256
"""Blocks of the unnamed space read for the reasons (each holds every ZeRO stage and recompute
of one set of sizes): enough for the common reasons, bounded whatever the space's size."""
SHOWN_REASONS = 2
"""Distinct reasons an explanation names, the most frequent first."""


def framework_rules_explanation(job: JobSpec, spec: SearchSpec, budget: SpaceBudget) -> str | None:
    """With a framework named and no layout in its space: the reasons its profile gives for the
    layouts the pins admit without it (the most frequent first, each with an example layout);
    None when no framework is named, no layout is admitted without it either, or reading them
    would pass ``budget`` (the search's time and memory)."""
    if job.training.framework is None:
        return None
    prof = target_profiles(job.training, job.model)[0][0]  # the named framework, as the job runs it
    for fields in (None, SHAPE_FIELDS):  # the request's knobs, else its shape alone
        unnamed = _unnamed(job, fields)
        if unnamed is None:
            continue
        try:
            text = _reasons_text(prof, job, unnamed, spec, budget)
        except (SpaceTimedOut, SpaceTooLarge):
            return None
        if text is not None:
            return text
    return None


def _reasons_text(
    prof: FrameworkProfile, job: JobSpec, unnamed: JobSpec, spec: SearchSpec, budget: SpaceBudget
) -> str | None:
    """The explanation from the layouts of ``unnamed``'s space, None when it holds none."""
    modes = prof.costed_modes(job.model.is_moe)
    # the layouts nearest the framework's space (fewest rules broken) carry the reasons that
    # empty it: DeepSpeed's "no stage with pp > 1" for allow.pp [2, 4], not the CP of other layouts
    nearest: list[tuple[str, ResolvedLayout]] = []
    fewest = checked = 0
    for block in islice(layout_blocks(unnamed, spec, Reach.ALL, budget), MAX_BLOCKS):
        for family in block.families():
            if family.first.recompute not in modes:  # the framework's space holds its own modes only
                continue
            checked += 1
            problems = _problems(prof, job, family.first)
            if not problems or (nearest and len(problems) > fewest):
                continue
            if not nearest or len(problems) < fewest:
                nearest, fewest = [], len(problems)
            nearest.append((problems[0], family.first))
    if not nearest:
        return None
    reasons = Counter(r for r, _ in nearest)
    examples: dict[str, ResolvedLayout] = {}
    for r, lay in nearest:
        examples.setdefault(r, lay)
    shown = "; ".join(f"{_layout_text(prof, examples[r])}: {r}" for r, _ in reasons.most_common(SHOWN_REASONS))
    more = len(reasons) - SHOWN_REASONS
    pinned = any(v is not None for v in (*spec.fix.model_dump().values(), *spec.allow.model_dump().values()))
    which = "the layouts search.fix / search.allow admit" if pinned else "the job's layouts, with its training.* knobs"
    return f"no valid layout: {prof.name} runs none of {which} ({checked:,} checked), for example {shown}" + (
        f" (and {more} more reasons)" if more > 0 else ""
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


def _problems(prof: FrameworkProfile, job: JobSpec, lay: ResolvedLayout) -> list[str]:
    """Every rule of the framework ``lay`` breaks (``layout_problem`` names the first only)."""
    first = layout_problem(prof, lay, job.model.is_moe, job.training.seq_len, kv_heads_to_split(job.model))
    if first is None:
        return []
    uneven = prof.takes_stage_counts(lay.stage_layers)
    found = [
        prof.ep_recompute_problem(lay.ep, lay.recompute),
        prof.sizes_problem(1, 1, lay.cp, 1, 1, False, False),  # each size's own rule, then those between
        prof.sizes_problem(1, 1, 1, 1, lay.vpp, False, False),
        prof.sizes_problem(lay.tp, 1, 1, 1, 1, False, lay.sequence_parallel),
        prof.sizes_problem(lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, uneven, lay.sequence_parallel),
        prof.seq_problem(job.training.seq_len, lay.tp, lay.cp),
        prof.heads_problem(kv_heads_to_split(job.model), lay.tp),
        prof.etp_problem(lay.tp, lay.cp, lay.dp, lay.ep, lay.etp) if job.model.is_moe else None,
        prof.etp_problem(lay.tp, lay.cp, lay.dp, 1, lay.etp) if job.model.is_moe else None,  # the etp rules alone
        prof.zero_problem(lay.pp, lay.dp, lay.tp, lay.cp, lay.ep, lay.num_micro_batches, lay.zero_stage),
        _zero_rules_but_pp(prof, lay),
    ]  # fmt: skip
    return list(dict.fromkeys(r for r in found if r is not None)) or [first]


def _zero_rules_but_pp(prof: FrameworkProfile, lay: ResolvedLayout) -> str | None:
    """The ZeRO rules other than the stages it runs with or without a pipeline (DDP alone, one
    micro-batch, ...), for a pipelined layout whose stage rule names first."""
    if lay.pp == 1:
        return None
    reason = prof.zero_problem(1, lay.dp, lay.tp, lay.cp, lay.ep, lay.num_micro_batches, lay.zero_stage)
    return None if reason is None or "with pp = 1" in reason else reason


def _layout_text(prof: FrameworkProfile, lay: ResolvedLayout) -> str:
    """A layout in a few words, its recompute under the framework's own name."""
    sizes = " ".join(
        f"{k.upper()}{getattr(lay, k)}" for k in ("tp", "pp", "dp", "cp", "ep", "etp") if getattr(lay, k, 1) != 1
    )
    vpp = f" VPP{lay.vpp}" if lay.vpp > 1 else ""
    recompute = prof.own_recompute(lay.recompute) or lay.recompute
    return f"{sizes or 'DP1'}{vpp} ZeRO-{lay.zero_stage} recompute {recompute}"
