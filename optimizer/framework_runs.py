"""Which frameworks run a scored layout as costed, and why none does."""

from __future__ import annotations

from typing import Any

from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import FrameworkProfile, kv_heads_to_split, layout_problem, load_profiles, profile
from optimizer.inert_knobs import SOME_LAYOUT, layout_facts
from optimizer.rank_orders import is_pp_inside_dp, most_permissive, pp_inside_dp_allowed


def running_frameworks(
    training: Any,
    lay: Any,
    model: Any,
    order: tuple[str, ...] | None = None,
    tp_tier: str | None = None,
    gpu_generation: str | None = None,
) -> tuple[list[FrameworkProfile], list[str]]:
    """The frameworks that run ``lay`` (cost-model names) in rank ``order`` (None: the default),
    its TP groups spanning ``tp_tier``, on GPUs of ``gpu_generation`` (None: not checked), for the
    job (``training``, ``model``) as costed, and, when there are none, why (one reason per target
    framework)."""
    is_moe = model.is_moe
    facts = layout_facts(lay, is_moe, tp_tier)
    targets = candidate_frameworks(training, model, facts=facts, generation=gpu_generation)
    if not targets:
        named = getattr(training, "framework", None)
        profiles = (profile(named),) if named is not None else tuple(load_profiles().values())
        reasons = [without_source(p.stack_problem(training, model, facts, gpu_generation) or "") for p in profiles]
        return [], ["no framework's stack runs the job's model and training.* knobs: " + "; ".join(reasons)]
    runs, reasons = [], []
    for prof in targets:
        problem = layout_problem(prof, lay, is_moe, training.seq_len, kv_heads_to_split(model)) or (
            order_problem(prof, order, lay.sizes(), is_moe) if order is not None else None
        )
        if problem is None:
            runs.append(prof)
        else:
            reasons.append(problem)
    return runs, ([] if runs else reasons)


def without_source(reason: str) -> str:
    """``reason`` without the source it ends with (``"... (file.py: ...)"``): a stack knob's reason
    in a plan's note says which value each framework runs, its source is in
    ``optimizer/data/frameworks.toml`` and docs/frameworks.md."""
    if not reason.endswith(")"):
        return reason
    depth = 0
    for i in range(len(reason) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(reason[i], 0)
        if depth == 0:
            return reason[:i].rstrip()
    return reason


def order_problem(prof: FrameworkProfile, order: tuple[str, ...], sizes: dict[str, int], is_moe: bool) -> str | None:
    """Why ``prof`` does not lay a layout of ``sizes`` out in rank ``order`` (None: it does)."""
    fact = prof.parallelism.pp_inside_dp
    if not is_pp_inside_dp(order, sizes) or pp_inside_dp_allowed(str(fact.value), sizes, is_moe):
        return None
    return f"{prof.name} does not put pipeline stages inside data parallelism at these sizes ({fact.source})"


def costed_pp_inside_dp(training: Any, model: Any) -> str:
    """The ``pp_inside_dp`` rule plans are costed under: the most permissive of the frameworks
    whose stack runs the job (``never`` when none does: the order every framework runs)."""
    return most_permissive(
        [str(p.parallelism.pp_inside_dp.value) for p in candidate_frameworks(training, model, facts=SOME_LAYOUT)]
    )


def costed_fsdp_buffers(training: Any, model: Any) -> str:
    """The ZeRO-2/3 buffers the cost model charges (``training.fsdp_buffers``): the job's, else the
    larger of those the frameworks whose stack runs the job hold (Megatron-FSDP's when a Megatron
    framework is among them or none runs the job, else FSDP2's when torchtitan is, else ``layer``;
    each holds at least what the next does)."""
    given = getattr(training, "fsdp_buffers", None)
    if given is not None:
        return str(given)
    held = {str(p.stack["fsdp_buffers"].default) for p in candidate_frameworks(training, model, facts=SOME_LAYOUT)}
    if not held or "megatron-fsdp" in held:
        return "megatron-fsdp"
    return "fsdp2" if "fsdp2" in held else "layer"


def costed_fsdp_unit_scales(training: Any, model: Any) -> bool:
    """Whether Megatron-FSDP's communication unit is charged as at least two layers (the larger
    buffers) rather than a fixed 1e9 elements: true unless every framework whose stack runs the
    job and holds Megatron-FSDP's buffers fixes it (Megatron-Bridge's Megatron-Core 0.14.0)."""
    runs = [
        p
        for p in candidate_frameworks(training, model, facts=SOME_LAYOUT)
        if p.stack["fsdp_buffers"].default == "megatron-fsdp"
    ]
    return not runs or any(bool(p.parallelism.fsdp_unit_scales_with_layers.value) for p in runs)


def costed_kv_expanded(training: Any, model: Any) -> bool:
    """Whether the cost model keeps key/value heads expanded to the query heads
    (``training.kv_expanded``): the job's, else true when a framework whose stack runs the job
    expands them (torchtitan: the larger memory, as ``costed_fsdp_buffers`` charges)."""
    given = getattr(training, "kv_expanded", None)
    if given is not None:
        return bool(given)
    return any(bool(p.stack["kv_expanded"].default) for p in candidate_frameworks(training, model, facts=SOME_LAYOUT))


def costed_p2p_blocks_without_vpp(training: Any, model: Any) -> bool:
    """Whether pipeline sends are costed as blocking in non-interleaved schedules although the job
    overlaps them (``training.pp_comm_overlap``): true when a framework whose stack runs the job
    overlaps them only interleaved (Megatron-LM, Megatron-Bridge), or none runs the job (the
    larger time, as ``costed_fsdp_buffers`` charges the larger memory)."""
    runs = candidate_frameworks(training, model, facts=SOME_LAYOUT)
    return not runs or any(bool(p.parallelism.p2p_overlap_needs_vpp.value) for p in runs)
