"""The cost model: step time, memory and MFU of one resolved layout on one rank order.

``estimate`` is the single source of truth: ``/evaluate``, ``/plan``, the CLI, the search tables
and the validation benchmark all call it. Step time is composed as

    step = m * t_stage_max                      (steady 1F1B / interleaved pipeline)
         + (pp - 1) / vpp * t_stage_max         (pipeline bubble)
         + exposed pipeline send/recv
         + exposed data-parallel collectives    (bucketed, overlapped with backward / forward)
         + optimizer step                       (memory-bound Adam on the local shard)

where ``t_stage`` is one micro-batch's forward + backward through a stage: compute plus the
exposed TP, CP and EP communication of its layers (``layer.py``). Data-parallel and optimizer
times are the worst stage's. Everything per stage comes from ``stage_terms`` (``stage.py``),
which the search's layer-split tables (``optimizer.search.split_tables``) also call, so a split
the solver picks is costed by the same arithmetic. Memory is in ``memory.py``, data-parallel
communication in ``dp_comm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast, overload

from optimizer.cost.caches import Memo
from optimizer.cost.comm import p2p_time_s
from optimizer.cost.context import JobContext
from optimizer.cost.flops import recompute_flops_per_token
from optimizer.cost.layer import ACT_BYTES, ATTENTION_CORE_RECOMPUTED
from optimizer.cost.memory import StageMemory, stage_memory
from optimizer.cost.num import Num, select
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage import (
    SplitKey,
    StageTerms,
    layout_kind_costs,
    split_key,
    split_kind_counts,
    stage_core_cached,
    stage_fixed_cached,
    stage_terms,
)
from optimizer.cost.stage_layout import StageLayout
from optimizer.cost.topology import AxisGroups, axis_groups


@dataclass(frozen=True)
class Estimate:
    layout: ResolvedLayout
    order: tuple[str, ...]
    placement: dict[str, str]
    step_time_s: float
    breakdown_s: dict[str, float]
    memory: tuple[StageMemory, ...]
    peak_stage: int
    capacity_bytes: float
    headroom_bytes: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    mfu: float
    hfu: float
    tokens_per_step: float
    bottleneck: str
    notes: tuple[str, ...] = field(default=())

    @property
    def peak_memory_bytes(self) -> float:
        return cast(float, self.memory[self.peak_stage].total_bytes)  # numbers on the one-layout path

    @property
    def usable_bytes(self) -> float:
        """Memory the layout may use per GPU: the capacity less the headroom."""
        return self.capacity_bytes - self.headroom_bytes

    @property
    def fits_memory(self) -> bool:
        return self.peak_memory_bytes <= self.usable_bytes


def _stage_kind_counts(ctx: JobContext, lay: ResolvedLayout) -> list[tuple[int, ...]]:
    """Layers of each kind on each stage (memoised per split)."""
    return split_kind_counts(ctx, lay.pp, lay.stage_layers)


def steady_state_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``m * slowest stage + bubble``: a lower bound on ``estimate`` for this rank order (every
    other term is non-negative). Lets callers skip orders that cannot win."""
    kind_cost = layout_kind_costs(ctx, lay, groups)
    counts = _stage_kind_counts(ctx, lay)
    slowest = max(
        sum(n * lc.time_s for n, lc in zip(c, kind_cost, strict=True)) for c in set(counts)
    )  # the LM head is left out: still a lower bound
    return (lay.num_micro_batches + (lay.pp - 1) / lay.vpp) * slowest


@overload
def pp_comm_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, vpp: int | None = None) -> float: ...
@overload
def pp_comm_s(ctx: JobContext, lay: StageLayout, groups: AxisGroups, vpp: int | None = None) -> Num: ...
def pp_comm_s(ctx: JobContext, lay: StageLayout, groups: AxisGroups, vpp: int | None = None) -> Num:
    """Exposed pipeline send/recv: a share of the steady-state sends plus the fill/drain chain
    (at interleaving depth ``vpp``, default the layout's: nothing else of the layout's depth
    enters)."""
    if lay.pp == 1 or not groups.pp.levels:
        return 0.0
    outer = groups.pp.levels[-1]
    t_p2p = p2p_time_s(pp_message_bytes(ctx, lay), outer.beta_bytes_per_s, outer.alpha_s)
    return pp_comm_from_p2p_s(ctx, lay.pp, lay.vpp if vpp is None else vpp, lay.num_micro_batches, t_p2p)


@overload
def pp_message_bytes(ctx: JobContext, lay: ResolvedLayout) -> float: ...
@overload
def pp_message_bytes(ctx: JobContext, lay: StageLayout) -> Num: ...
def pp_message_bytes(ctx: JobContext, lay: StageLayout) -> Num:
    """One micro-batch's activations crossing a pipeline boundary (split by TP with SP)."""
    h = float(ctx.job.model.hidden_size or 0)
    tokens = lay.micro_batch_size * ctx.job.training.seq_len / lay.cp
    return tokens * h * ACT_BYTES / select(lay.sequence_parallel, lay.tp, 1)


def pp_comm_from_p2p_s(ctx: JobContext, pp: Num, vpp: Num, m: Num, t_p2p: Num) -> Num:
    """``pp_comm_s`` from one send's time: ``pp_sends_s``, and in a non-interleaved schedule
    (``vpp`` 1) the share the overlap would hide when the framework overlaps sends only
    interleaved (``JobContext.p2p_blocks_without_vpp``: Megatron waits on every send there)."""
    sends = pp_sends_s(ctx, pp, vpp, m, t_p2p)
    if not (ctx.p2p_blocks_without_vpp and ctx.job.training.pp_comm_overlap):
        return sends
    hidden = (1.0 - ctx.cal.pp_comm_exposed) * m * 2 * t_p2p
    return sends + select(vpp == 1, hidden, 0.0)


def pp_sends_s(ctx: JobContext, pp: Num, vpp: Num, m: Num, t_p2p: Num) -> Num:
    """Every chunk boundary sends forward and backward per micro-batch (the exposed share of them
    when the stack overlaps sends), plus the fill / drain chain across the stages: affine in
    ``vpp`` (``search.lower_bounds.family_bound`` reads its slope)."""
    exposed = ctx.cal.pp_comm_exposed if ctx.job.training.pp_comm_overlap else 1.0
    return exposed * m * 2 * vpp * t_p2p + 2 * (pp - 1) * t_p2p


def compose_step(
    lay: ResolvedLayout, stages: list[StageTerms], pp_comm: Num, ep_alone: float = 0.0
) -> tuple[dict[str, Num], int]:
    """Step-time breakdown from the stage terms (and the index of the slowest stage)."""
    slow = max(range(len(stages)), key=lambda i: stages[i].time_s)
    dp_comm = max(t.dp_exposed_s for t in stages)
    optimizer = max(t.optimizer_s for t in stages)
    return step_breakdown(lay, stages[slow], dp_comm, optimizer, pp_comm, ep_alone), slow


def unoverlapped_ep_share(ctx: JobContext, lay: StageLayout) -> float:
    """Extra micro-batches of exposed expert all-to-all time a step pays when the expert overlap
    has nothing to pair with: without a pipeline, Megatron's combined 1F1B runs the first
    forward and the last backward alone (``combined_1f1b.py`` at 000c4ac2), so one micro-batch's
    hidden share (``ep_comm_overlap_batched``, less its contention) is exposed after all; as a
    multiple of the exposed per-micro-batch time ``StageTerms.ep_s``. With pipelines the fitted
    hidden share stands for the warm-up and cool-down too."""
    if not (ctx.expert_overlap(lay.ep) and lay.pp == 1):
        return 0.0
    lost = ctx.cal.ep_comm_overlap_batched * (1.0 - ctx.cal.overlap_contention)
    return lost / (1.0 - lost)


def step_breakdown(
    lay: StageLayout, slowest: StageTerms, dp_comm: Num, optimizer: Num, pp_comm: Num, ep_alone: float = 0.0
) -> dict[str, Num]:
    """``compose_step``'s breakdown from the slowest stage's terms and the largest exposed
    data-parallel and optimizer times over the stages (``ep_alone``: ``unoverlapped_ep_share``).
    Numbers or numpy arrays (``cost.columns``); the step time is the sum of the values in this
    order."""
    m = lay.num_micro_batches
    return {
        "compute": m * slowest.compute_s,
        "tp_comm": m * slowest.tp_s,
        "cp_comm": m * slowest.cp_s,
        "ep_comm": (m + ep_alone) * slowest.ep_s,
        "pp_comm": pp_comm,
        "pp_bubble": (lay.pp - 1) / lay.vpp * slowest.time_s,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
    }


DISTINCT_STAGES = Memo[SplitKey, list[tuple[bool, bool, tuple[int, ...]]]]("distinct_stages")


def distinct_stages(ctx: JobContext, lay: ResolvedLayout) -> list[tuple[bool, bool, tuple[int, ...]]]:
    """The distinct ``(first, last, kind counts)`` of the stages, in order of first occurrence
    (memoised per ``SplitKey``). Stages that share them have the same time terms."""
    key = split_key(lay)
    table = ctx.caches[DISTINCT_STAGES]
    cached = table.get(key)
    if cached is None:
        counts = split_kind_counts(ctx, key.pp, key.stage_layers)
        cached = table[key] = list(dict.fromkeys((s == 0, s == key.pp - 1, counts[s]) for s in range(key.pp)))
    return cached


def step_time_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``estimate(...).step_time_s`` without building the estimate: same terms, same arithmetic.

    ``compose_step`` takes maxima over stages and reads the first slowest stage; stages with the
    same ``(first, last, kind counts)`` have identical terms, so one of each, in stage order,
    gives the same floats. Lets ``best_estimate`` compare rank orders cheaply.
    """
    stages = [stage_core_cached(ctx, lay, groups, c, f, la)[0] for f, la, c in distinct_stages(ctx, lay)]
    breakdown, _ = compose_step(lay, stages, pp_comm_s(ctx, lay, groups), unoverlapped_ep_share(ctx, lay))
    return cast(float, sum(breakdown.values()))  # numbers on the one-layout path


def peak_memory_bytes(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``estimate(ctx, lay, order).peak_memory_bytes`` for any order whose groups have
    ``memory_signature(groups)``: the same stage memories without the time terms."""
    counts = _stage_kind_counts(ctx, lay)
    last = lay.pp - 1
    fixed = {d: stage_fixed_cached(ctx, lay, groups, d[2], d[0], d[1]) for d in distinct_stages(ctx, lay)}
    peak: Num = 0.0
    for s in range(lay.pp):
        t, stored, grads_bytes, _ = fixed[(s == 0, s == last, counts[s])]
        peak = max(peak, stage_memory(ctx, lay, s, t.memory, stored, grads_bytes).total_bytes)
    return cast(float, peak)  # numbers on the one-layout path


def estimate(
    ctx: JobContext,
    lay: ResolvedLayout,
    order: tuple[str, ...],
    headroom_bytes: float | None = None,
    groups: AxisGroups | None = None,
) -> Estimate:
    if groups is None:
        groups = axis_groups(ctx.topology, order, lay.sizes())
    counts = _stage_kind_counts(ctx, lay)
    stages = [stage_terms(ctx, lay, groups, s, counts[s]) for s in range(lay.pp)]
    # numbers on the one-layout path (the stage terms are arrays only in cost.columns)
    ep_alone = unoverlapped_ep_share(ctx, lay)
    breakdown = cast(dict[str, float], compose_step(lay, stages, pp_comm_s(ctx, lay, groups), ep_alone)[0])
    step = sum(breakdown.values())
    memory = tuple(t.memory for t in stages)
    peak_stage = max(range(lay.pp), key=lambda i: memory[i].total_bytes)
    tokens_step = float((ctx.job.training.global_batch_size or 0) * ctx.job.training.seq_len)
    model_flops = ctx.flops.model_per_token * tokens_step
    hw_flops = model_flops + recompute_flops_per_token(ctx.flops, lay.recompute) * tokens_step
    if ctx.attention_kernel == "unfused":
        # materialised scores cover the full square: the masked half of every attention core run
        # (forward, backward, and the recomputed forward) is computed too
        runs = 3 + (1 if lay.recompute in ATTENTION_CORE_RECOMPUTED else 0)
        hw_flops += ctx.flops.attn_core_forward_per_token * runs * tokens_step
    denom = step * ctx.num_gpus * ctx.mfu_peak_flops
    return Estimate(
        layout=lay,
        order=order,
        placement=groups.placement(),
        step_time_s=step,
        breakdown_s=breakdown,
        memory=memory,
        peak_stage=peak_stage,
        capacity_bytes=ctx.capacity_bytes,
        headroom_bytes=ctx.headroom_bytes(headroom_bytes),
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops,
        mfu=model_flops / denom,
        hfu=hw_flops / denom,
        tokens_per_step=tokens_step,
        bottleneck=max(breakdown, key=lambda k: breakdown[k]),
        notes=ctx.topology.notes,
    )
