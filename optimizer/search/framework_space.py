"""The frameworks a search targets and what they admit: the layout space restricted at
enumeration to the combinations some target framework runs, so that the search's bounds and its
proof of optimality cover exactly that space.

With ``training.framework`` named the target is that framework. With none, the targets are
every framework whose stack runs the job's ``training.*`` knobs (``candidate_frameworks``); if
none does, every framework's layout rules apply and the plans say that no stack matches.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from optimizer.framework_runs import costed_fsdp_buffers
from optimizer.framework_targets import as_run_for, candidate_frameworks
from optimizer.frameworks import FrameworkProfile, kv_heads_to_split, load_profiles, profile
from optimizer.modes import RecomputeMode
from optimizer.specs import JobSpec, ModelSpec, SearchSpec, TrainingSpec


class Targets(NamedTuple):
    profiles: tuple[FrameworkProfile, ...]
    named: bool
    """``training.framework`` was given."""
    stack_matched: bool
    """Some framework's stack runs the job's knobs (always true when one is named)."""
    free_zero: bool
    """No framework named and ``search.fix`` / ``search.allow`` name ZeRO stages: those are
    searched whether or not a framework runs them (the plans then say so)."""
    free_recompute: bool
    zero1_dominated: bool
    """ZeRO-2 never needs more memory than ZeRO-1 (``training.fsdp_buffers`` 'layer', 'fsdp2'); with
    Megatron-FSDP's buffers it can (its reduce-scatter queue outweighs a small model's gradients)."""

    @property
    def take_stage_counts(self) -> bool:
        """Some target takes per-stage layer counts; else the even split is the only one, and only
        where their partition gives it (``frameworks.partitions``)."""
        return any(p.parallelism.uneven_stage_layers.value for p in self.profiles)


def target_profiles(
    training: TrainingSpec, model: ModelSpec, generation: str | None = None
) -> tuple[tuple[FrameworkProfile, ...], bool]:
    """The frameworks whose stack runs ``training``'s knobs (on GPUs of ``generation``), and True;
    when none does, the named framework (or every one), whose layout rules still hold, and False."""
    profiles = candidate_frameworks(training, model, generation=generation)
    if profiles:
        return profiles, True
    framework = training.framework
    profiles = (profile(framework),) if framework is not None else tuple(load_profiles().values())
    return tuple(as_run_for(p, training, model) for p in profiles), False


def space_frameworks(job: JobSpec, search: SearchSpec) -> Targets:
    named = job.training.framework is not None
    profiles, matched = target_profiles(job.training, job.model, job.gpu_generation)
    free_zero = not named and (search.fix.zero_stage is not None or search.allow.zero_stage is not None)
    free_rc = not named and (search.fix.recompute is not None or search.allow.recompute is not None)
    zero1_dominated = costed_fsdp_buffers(job.training, job.model) in ("layer", "fsdp2")
    return Targets(profiles, named, matched, free_zero, free_rc, zero1_dominated)


def costed_recompute_choices(job: JobSpec, search: SearchSpec, order: tuple[str, ...]) -> list[str]:
    """The cost model's recompute modes to search, in ``order``: the target frameworks' modes,
    restricted by ``search.fix`` / ``search.allow`` (in the named framework's own names); with
    no framework named, the modes those name are searched as given."""
    is_moe = job.model.moe is not None
    fix, allow = search.fix.recompute, search.allow.recompute
    if job.training.framework is not None:
        prof = as_run_for(profile(job.training.framework), job.training, job.model)
        modes = list(prof.costed_modes(is_moe))
        if allow is not None:
            modes = [m for m in modes if prof.own_recompute(m) in allow]
        if fix is not None:
            modes = [m for m in modes if prof.own_recompute(m) == fix]
        return [m for m in order if m in modes]
    runs = {m for p in space_frameworks(job, search).profiles for m in p.costed_modes(is_moe)}
    if fix is not None:
        runs = {fix}
    elif allow is not None:
        runs = set(allow)
    if not is_moe:
        runs.discard(RecomputeMode.MOE)
    return [m for m in order if m in runs]


def split_targets(targets: Targets, job: JobSpec, tp: int, cp: int) -> Targets:
    """``targets`` without the frameworks that do not split the job's sequence and key/value heads
    over ``tp`` and ``cp`` (``FrameworkProfile.split_problem``)."""
    seq_len, kv_heads = job.training.seq_len, kv_heads_to_split(job.model)
    runs = tuple(p for p in targets.profiles if p.split_problem(seq_len, kv_heads, tp, cp) is None)
    return targets if len(runs) == len(targets.profiles) else targets._replace(profiles=runs)


def block_variants(
    targets: Targets,
    zeros: list[int],
    rcs: list[str],
    *,
    tp: int,
    pp: int,
    dp: int,
    cp: int,
    ep: int,
    nmb: int,
    sp: bool,
) -> tuple[tuple[int, str], ...]:
    """The ``(zero_stage, recompute)`` pairs of ``zeros x rcs`` some target framework runs on a
    layout of these sizes (at its first interleaving depth), ZeRO-1 left out where ZeRO-2 is in
    with the same recompute, the step has one micro-batch and ZeRO-2 holds no Megatron-FSDP
    buffers (same step time, never less memory; with several micro-batches ZeRO-2
    reduce-scatters every one's gradients, and Megatron-FSDP's queue can outweigh the gradients
    it shards: both are searched)."""
    key = (
        pp > 1, nmb > 1, dp > 1 and max(tp, pp, cp, ep) > 1, cp > 1, ep > 1, ep > 1 and ep % (tp * cp) != 0,
        tp > 1 and not sp, tp > 1,
    )  # fmt: skip
    return _variants(targets.profiles, targets.free_zero, targets.free_recompute, tuple(zeros), tuple(rcs), key,
                     targets.zero1_dominated)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _variants(
    profiles: tuple[FrameworkProfile, ...],
    free_zero: bool,
    free_rc: bool,
    zeros: tuple[int, ...],
    rcs: tuple[str, ...],
    key: tuple,
    zero1_dominated: bool,
) -> tuple:
    pipelined, several, multi_axis, has_cp, has_ep, ep_off_grid, no_sp, has_tp = key
    # representative sizes reproducing the key for the profiles' checks
    pp = 2 if pipelined else 1
    nmb = 2 if several else 1
    tp = 2 if has_tp or no_sp or ep_off_grid or (multi_axis and not pipelined and not has_cp and not has_ep) else 1
    cp = 2 if has_cp else 1
    ep = (3 if ep_off_grid else 2 * tp * cp) if has_ep else 1
    dp = 2 if multi_axis else 1
    runs = set()
    depths = (1, 2) if pipelined else (1,)  # runs these sizes at some depth: the space picks the depths
    for prof in profiles:
        if all(prof.sizes_problem(tp, pp, cp, ep, v, False, not no_sp) is not None for v in depths):
            continue
        modes = set(rcs) if free_rc else set(prof.costed_modes(True)) & set(rcs)
        if has_ep and not free_rc:
            modes -= set(prof.parallelism.ep_layouts_excluded_recompute.value)
        for z in zeros:
            if free_zero or prof.zero_problem(pp, dp, tp, cp, ep, nmb, z) is None:
                runs |= {(z, r) for r in modes}
    variants = [(z, r) for z in zeros for r in rcs if (z, r) in runs]
    dominated = zero1_dominated and not several
    return tuple(v for v in variants if not (v[0] == 1 and dominated and (2, v[1]) in runs))
