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
times are the worst stage's. Everything per stage comes from ``stage_terms``, which the search's
layer-split tables (``split_tables``) also call, so a split the solver picks is costed by the
same arithmetic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from optimizer.cost.comm import (
    Level,
    flat_ring_levels,
    hierarchical_allgather_time_s,
    hierarchical_allreduce_time_s,
    hierarchical_reduce_scatter_time_s,
    p2p_time_s,
)
from optimizer.cost.context import HALF_GRAD_BYTES, JobContext
from optimizer.cost.flops import recompute_flops_per_token
from optimizer.cost.layer import (
    ACT_BYTES,
    contended,
    ATTENTION_CORE_RECOMPUTED,
    Dims,
    LayerCost,
    attention_core_times_s,
    cp_comm_s,
    ep_comm_s,
    gemm_time_s,
    layer_cost,
    tp_comm_s,
)
from optimizer.cost.num import Num, maximum, minimum, select
from optimizer.cost.pipeline import in_flight_microbatches
from optimizer.cost.rules import ResolvedLayout, divisors
from optimizer.cost.split_bound import stage_split_reaches
from optimizer.cost.topology import (
    AxisGroups,
    GroupGeometry,
    axis_groups,
    candidate_orders,
    group_geometry,
)

WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES = HALF_GRAD_BYTES  # the source text's 16-bit gradients; a job's own: JobContext.grad_bytes
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam first and second moments
FP8_COPY_BYTES = 1.0  # transposed/quantised FP8 weight copies kept by FP8 training
FP4_COPY_BYTES = 2 * (0.5 + 1 / 16)  # NVFP4 row- and column-wise weight copies, one fp8 scale per 16 values
ADAM_STEP_BYTES = 32.0  # HBM traffic per parameter of one Adam step (read p, m, v, g; write p, m, v, bf16 p)


class StageLayout(Protocol):
    """The layout fields the stage arithmetic reads (``stage_fixed_terms``, ``_stage_memory``,
    ``_dp_exposed_s``, ``pp_comm_s``, ``step_breakdown``): a ``ResolvedLayout``, or a batch of
    layouts whose depth, micro-batch size and count and sequence parallelism are numpy columns
    (``cost.columns.LayoutColumns``)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def zero_stage(self) -> int: ...
    @property
    def vpp(self) -> Num: ...
    @property
    def micro_batch_size(self) -> Num: ...
    @property
    def num_micro_batches(self) -> Num: ...
    @property
    def sequence_parallel(self) -> bool | np.ndarray: ...


@dataclass(frozen=True)
class StageMemory:
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes + self.buffers_bytes
        )


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
        return self.memory[self.peak_stage].total_bytes

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


def split_kind_counts(ctx: JobContext, pp: int, stage_layers: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Layers of each kind on each of ``pp`` stages under the chunk split ``stage_layers`` (memoised)."""
    key = ("counts", pp, stage_layers)
    cached = ctx.memo.get(key)
    if cached is None:
        stage_chunks: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
        start = 0
        for c, count in enumerate(stage_layers):
            stage_chunks[c % pp].append((start, count))
            start += count
        prefix = ctx.kind_prefix
        cached = [
            tuple(sum(prefix[k][f + n] - prefix[k][f] for f, n in chunks) for k in range(len(prefix)))
            for chunks in stage_chunks
        ]
        ctx.memo[key] = cached
    return cached


def steady_state_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``m * slowest stage + bubble``: a lower bound on ``estimate`` for this rank order (every
    other term is non-negative). Lets callers skip orders that cannot win."""
    kind_cost = _kind_costs(ctx, lay, groups)
    counts = _stage_kind_counts(ctx, lay)
    slowest = max(
        sum(n * lc.time_s for n, lc in zip(c, kind_cost, strict=True))
        for c in set(counts)
    )  # the LM head is left out: still a lower bound
    return (lay.num_micro_batches + (lay.pp - 1) / lay.vpp) * slowest


@dataclass(frozen=True)
class StageTerms:
    """One pipeline stage's share of the step: everything ``estimate`` takes a max or sum over.
    Numbers for one layout; arrays (layouts x stages) in ``cost.columns``."""

    fwd_s: float
    """Forward compute of one micro-batch (all its layers)."""
    bwd_s: float
    compute_s: float
    """Forward + backward compute of one micro-batch, LM head included on the last stage."""
    tp_s: float
    cp_s: float
    ep_s: float
    dp_exposed_s: float
    """Data-parallel communication this stage leaves exposed at the end of the step."""
    optimizer_s: float
    memory: StageMemory

    @property
    def time_s(self) -> float:
        """One micro-batch through the stage, forward and backward, with exposed TP/CP/EP."""
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s


def _kind_costs(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> list[LayerCost]:
    dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    return kind_costs(ctx, dims, groups)


def kind_costs(ctx: JobContext, dims: Dims, groups: AxisGroups) -> list[LayerCost]:
    """``layer_cost`` of every layer kind of the job (memoised per dims and TP / CP / EP geometry)."""
    key = (dims, groups.tp, groups.cp, groups.ep)
    kind_cost: list[LayerCost] | None = ctx.memo.get(key)
    if kind_cost is None:
        kind_cost = [layer_cost(ctx, k, dims, groups) for k in ctx.kinds]
        ctx.memo[key] = kind_cost
    return kind_cost


def stage_terms(
    ctx: JobContext,
    lay: ResolvedLayout,
    groups: AxisGroups,
    stage: int,
    kind_counts: tuple[int, ...],
) -> StageTerms:
    """Cost of pipeline stage ``stage`` holding ``kind_counts[k]`` layers of each layer kind.

    Stage 0 also holds the embedding, the last stage the LM head and loss (both with ``pp = 1``).
    Memoised per job: the search's layer-split tables call it for many layer counts.
    """
    # the last chunk, v*pp + pp-1, always sits on the last stage
    partial, stored, grads_bytes = _stage_core_cached(ctx, lay, groups, kind_counts, stage == 0, stage == lay.pp - 1)
    return StageTerms(  # positional construction: dataclasses.replace is slow on this hot path
        partial.fwd_s, partial.bwd_s, partial.compute_s, partial.tp_s, partial.cp_s, partial.ep_s,
        partial.dp_exposed_s, partial.optimizer_s, _stage_memory(ctx, lay, stage, partial.memory, stored, grads_bytes),
    )


def _stage_memory(
    ctx: JobContext, lay: StageLayout, stage: Num, mem: StageMemory, stored: Num, grads_bytes: Num
) -> StageMemory:
    """A stage's memory from its core's (``mem``, ``stored``, ``grads_bytes``)."""
    # activations: the in-flight micro-batches depend on the stage's position in the pipeline
    acts = in_flight_microbatches(stage, lay.pp, lay.vpp, lay.num_micro_batches) * stored + mem.activations_bytes
    buffers = mem.buffers_bytes + ctx.cal.fragmentation * (acts + grads_bytes)
    return StageMemory(mem.weights_bytes, mem.gradients_bytes, mem.optimizer_bytes, acts, buffers)


def stage_memory_bytes(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, stage: int, kind_counts: tuple[int, ...]
) -> float:
    """``stage_terms(...).memory.total_bytes`` without the stage's exposed data-parallel time
    (memory does not depend on it): the layer-split fit limits probe many layer counts."""
    t, stored, grads_bytes, _ = _stage_fixed_cached(ctx, lay, groups, kind_counts, stage == 0, stage == lay.pp - 1)
    return _stage_memory(ctx, lay, stage, t.memory, stored, grads_bytes).total_bytes


def _stage_core_cached(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, float, float]:
    """``_stage_core``, memoised per job."""
    # the interleaving depth does not enter (only the in-flight count, added in _stage_memory)
    key = ("stage", lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
           lay.recompute, lay.sequence_parallel, lay.num_micro_batches,
           # the only geometries a stage's own terms depend on (pp placement does not enter)
           groups.tp, groups.cp, groups.ep, groups.dp_cp, groups.edp, first, last, kind_counts)
    core = ctx.memo.get(key)
    if core is None:
        core = _stage_core(ctx, lay, groups, kind_counts, first, last)
        ctx.memo[key] = core
    return core


def _stage_core(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, float, float]:
    """Everything of a stage but its in-flight activations: (terms with the stage's activations
    set to its one-micro-batch extras and buffers before fragmentation, stored activation bytes
    per micro-batch, gradient bytes).

    Only the exposed data-parallel time depends on the dp / edp groups; the rest is memoised
    without them, so rank orders that move only the data-parallel axes share it.
    """
    t, stored, grads_bytes, dp_inputs = _stage_fixed_cached(ctx, lay, groups, kind_counts, first, last)
    dp_exposed = _dp_exposed_s(ctx, lay, groups, *dp_inputs)
    terms = StageTerms(t.fwd_s, t.bwd_s, t.compute_s, t.tp_s, t.cp_s, t.ep_s, dp_exposed, t.optimizer_s, t.memory)
    return terms, stored, grads_bytes


def _stage_fixed_cached(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, float, float, tuple[float, float, int, float, float, float, float]]:
    """``_stage_fixed``, memoised per job."""
    # neither the interleaving depth nor the micro-batch count enters (the in-flight activations
    # are added in _stage_memory, the exposed data-parallel time in _stage_core)
    key = ("fixed", lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
           lay.recompute, lay.sequence_parallel,
           # with the sizes above, dp_cp.size > 1 completes memory_signature(groups)
           groups.tp, groups.cp, groups.ep, groups.dp_cp.size > 1, first, last, kind_counts)
    fixed = ctx.memo.get(key)
    if fixed is None:
        fixed = _stage_fixed(ctx, lay, groups, kind_counts, first, last)
        ctx.memo[key] = fixed
    return fixed


def _dp_levels(ctx: JobContext, groups: AxisGroups) -> tuple[tuple[Level, ...], tuple[Level, ...]]:
    """The levels the dense (``dp x cp``) and expert data-parallel collectives run over
    (``training.dp_collectives``).

    A model without MoE layers has no expert parameters and issues no expert collectives. The
    rule is per job, not per message: a stage of an MoE model that holds only dense layers still
    pays the expert groups' latency, which keeps every data-parallel time affine in the stage's
    parameters (``split_floor_s`` bounds stages by their average).
    """
    key = ("dp-levels", groups.dp_cp, groups.edp)  # geometries hash by identity: a cheap key
    levels = ctx.memo.get(key)
    if levels is None:
        levels = ctx.memo[key] = (_dp_ring(ctx, groups.dp_cp), _expert_dp_ring(ctx, groups.edp))
    return levels


def _dp_ring(ctx: JobContext, geo: GroupGeometry) -> tuple[Level, ...]:
    """The levels a data-parallel collective runs over in ``geo``: hierarchical, or one flat ring."""
    return flat_ring_levels(geo.levels) if ctx.job.training.dp_collectives == "flat" else geo.levels


def _expert_dp_ring(ctx: JobContext, geo: GroupGeometry) -> tuple[Level, ...]:
    """``_dp_ring`` of an expert data-parallel group (none without MoE layers)."""
    return () if ctx.job.model.moe is None else _dp_ring(ctx, geo)


def _dp_collective_parts_s(
    zero_stage: int, dp_cp: tuple[Level, ...], edp: tuple[Level, ...], g_dense: Num, g_exp: Num, n_layers: Num,
    grad_bytes: float,
) -> tuple[Num, Num]:
    """A stage's data-parallel collectives over ``dp_cp`` (dense gradient bytes ``g_dense``) and
    ``edp`` (expert, ``g_exp``), gradients of ``grad_bytes`` each: (dense part, expert part), per
    step for ZeRO-0/1/2 (all-reduce, or reduce-scatter, which the parameter all-gather mirrors),
    per layer and micro-batch for ZeRO-3 (gather the layer's 16-bit weights for forward and for
    backward and reduce-scatter its gradients, each collective paying its own latency). Each part
    is affine in its bytes (and ZeRO-3's, times the layer count, in the layer count). Numbers or
    numpy arrays."""
    if zero_stage == 3:
        return _zero3_layer_s(g_dense / n_layers, dp_cp, grad_bytes), _zero3_layer_s(g_exp / n_layers, edp, grad_bytes)
    collective = hierarchical_allreduce_time_s if zero_stage == 0 else hierarchical_reduce_scatter_time_s
    return collective(g_dense, dp_cp), collective(g_exp, edp)


def _zero3_layer_s(grads: Num, levels: tuple[Level, ...], grad_bytes: float) -> Num:
    """ZeRO-3's collectives for one layer of ``grads`` gradient bytes: two weight gathers and a
    gradient reduce-scatter (the same ring time for the same bytes)."""
    reduce = hierarchical_reduce_scatter_time_s(grads, levels)
    if grad_bytes == WEIGHT_BYTES:
        return 3 * reduce
    return 2 * hierarchical_allgather_time_s(grads * (WEIGHT_BYTES / grad_bytes), levels) + reduce


def _dp_exposed_from_parts_s(
    ctx: JobContext, zero_stage: int, m: Num, n_layers: Num, parts: tuple[Num, Num], unhidden: Num,
    compute: Num, fwd: Num, bwd: Num, gather: Num | None = None,
) -> Num:
    """A stage's exposed data-parallel time from its ``_dp_collective_parts_s`` and the term no
    overlap hides (``unhidden``: ZeRO-3's first weight gather, else the last gradient bucket).
    ZeRO-3 overlaps its per-layer collectives with every micro-batch's compute; ZeRO-0/1/2 their
    gradient collectives with the last micro-batch's backward and (ZeRO-1/2) the parameter
    all-gather (``gather``, ``_weight_gather_s``; the reduce-scatter's time when the gradients
    are as wide as the weights) with the next step's first forward. Non-decreasing in every part
    and in ``unhidden``. Numbers or numpy arrays."""
    dense, expert = parts
    if zero_stage == 3:
        per_mb = n_layers * (dense + expert)
        return contended(ctx, maximum(unhidden, m * per_mb - ctx.dp_overlap * m * compute), m * per_mb)
    t_b = dense + expert
    exposed = contended(ctx, maximum(unhidden, t_b - ctx.dp_overlap * bwd), t_b)
    if zero_stage != 0:  # the parameter all-gather, the reduce-scatter's mirror in weight bytes
        t_g = t_b if gather is None else gather
        exposed = exposed + contended(ctx, maximum(unhidden, t_g - ctx.dp_overlap * fwd), t_g)
    return np.where(t_b > 0, exposed, 0.0) if isinstance(exposed, np.ndarray) else (exposed if t_b > 0 else 0.0)


def _gather_scale(ctx: JobContext, zero_stage: int) -> float | None:
    """Weight bytes per gradient byte of ZeRO-1/2's parameter all-gather, when it differs from the
    reduce-scatter's (fp32 gradients); None when the gather mirrors the reduce-scatter."""
    if zero_stage not in (1, 2) or ctx.grad_bytes == WEIGHT_BYTES:
        return None
    return WEIGHT_BYTES / ctx.grad_bytes


def _weight_gather_s(
    ctx: JobContext, zero_stage: int, dp_cp: tuple[Level, ...], edp: tuple[Level, ...], g_dense: Num, g_exp: Num
) -> Num | None:
    """ZeRO-1/2's parameter all-gather of a stage whose gradient bytes are ``g_dense`` and
    ``g_exp``: the reduce-scatter's collectives over the 16-bit weights' bytes. None when the
    gradients are as wide as the weights (the gather then takes the reduce-scatter's time)."""
    ratio = _gather_scale(ctx, zero_stage)
    if ratio is None:
        return None
    dense, expert = _dp_collective_parts_s(zero_stage, dp_cp, edp, g_dense * ratio, g_exp * ratio, 1, WEIGHT_BYTES)
    return dense + expert


def _dp_exposed_s(
    ctx: JobContext, lay: StageLayout, groups: AxisGroups, dense: Num, expert: Num, n_layers: Num,
    max_layer_params: Num, compute: Num, fwd: Num, bwd: Num,
) -> Num:
    """Data-parallel communication a stage leaves exposed at the end of the step."""
    dp_cp, edp = _dp_levels(ctx, groups)
    g_dense, g_exp = dense * ctx.grad_bytes, expert * ctx.grad_bytes
    parts = _dp_collective_parts_s(lay.zero_stage, dp_cp, edp, g_dense, g_exp, n_layers, ctx.grad_bytes)
    if lay.zero_stage == 3:
        unhidden = hierarchical_allgather_time_s(max_layer_params * WEIGHT_BYTES, dp_cp)
    else:
        unhidden = _last_bucket_s(ctx, lay.zero_stage, dp_cp, g_dense)
    gather = _weight_gather_s(ctx, lay.zero_stage, dp_cp, edp, g_dense, g_exp)
    return _dp_exposed_from_parts_s(ctx, lay.zero_stage, lay.num_micro_batches, n_layers, parts, unhidden,
                                    compute, fwd, bwd, gather)  # fmt: skip


def _last_bucket_s(ctx: JobContext, zero_stage: int, dp_cp: tuple[Level, ...], g_dense: float) -> float:
    """The last dense gradient bucket's collective (ZeRO-0/1/2): what no overlap hides."""
    bucket = minimum(ctx.cal.dp_bucket_bytes, g_dense)
    if zero_stage == 0:
        return hierarchical_allreduce_time_s(bucket, dp_cp)
    return hierarchical_reduce_scatter_time_s(bucket, dp_cp)


def _dp_bucketed_times_s(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, dense: float, expert: float
) -> tuple[float, float, float, float]:
    """ZeRO-0/1/2 data-parallel collectives of a stage: (gradient time, its last bucket,
    parameter all-gather time, its last bucket), each affine in the stage's parameters."""
    g_dense, g_exp = dense * ctx.grad_bytes, expert * ctx.grad_bytes
    dp_cp, edp = _dp_levels(ctx, groups)
    d, e = _dp_collective_parts_s(lay.zero_stage, dp_cp, edp, g_dense, g_exp, 1, ctx.grad_bytes)
    t_b = d + e
    last_b = _last_bucket_s(ctx, lay.zero_stage, dp_cp, g_dense)
    if lay.zero_stage == 0:
        return t_b, last_b, 0.0, 0.0
    gather = _weight_gather_s(ctx, lay.zero_stage, dp_cp, edp, g_dense, g_exp)
    # the parameter all-gather mirrors the gradient reduce-scatter in the weights' bytes
    return t_b, last_b, (t_b if gather is None else gather), last_b


def memory_signature(groups: AxisGroups) -> tuple[bool, ...]:
    """All a stage's memory takes from the rank order: which axes have groups (NCCL buffers).

    The dense data-parallel group is ``cp x dp`` only when the two axes are adjacent in the
    order, so with ``dp = 1`` and ``cp > 1`` it differs between orders; otherwise it does not.
    """
    return tuple(g.size > 1 for g in (groups.tp, groups.cp, groups.ep, groups.dp_cp, groups.pp))


def _stage_fixed(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, float, float, tuple[float, float, int, float, float, float, float]]:
    """``_stage_core`` without the data-parallel term (left at 0), plus that term's inputs."""
    head = head_time_s(ctx, lay) if last else 0.0
    return stage_fixed_terms(
        ctx, lay, sum(memory_signature(groups)), _kind_costs(ctx, lay, groups), kind_counts, first, last, head
    )


def stage_fixed_terms(
    ctx: JobContext, lay: StageLayout, n_groups: int, kind_cost: Sequence[LayerCost], kind_counts: Sequence[Num],
    first: bool | np.ndarray, last: bool | np.ndarray, head_s: Num,
) -> tuple[StageTerms, Num, Num, tuple[Num, Num, Num, Num, Num, Num, Num]]:
    """``_stage_fixed`` from its inputs: the layer costs of each kind (``kind_cost``), the stage's
    layers of each kind, whether it is the first / last stage, the LM head's time (read on the last
    stage) and the number of process groups the rank order forms (``memory_signature``).

    Numbers, or numpy arrays that broadcast (``cost.columns`` costs many layouts at once: the
    micro-batch size, interleaving depth, micro-batch count and sequence parallelism of ``lay``,
    the counts, ``first`` / ``last`` (masks over a stage axis), the head time and every
    ``LayerCost`` field may be arrays; the parallel sizes and ZeRO stage are numbers). Terms are
    summed in the same order either way, so both give the same floats.
    """
    cal = ctx.cal
    fwd = sum(n * lc.fwd_s for n, lc in zip(kind_counts, kind_cost, strict=True))
    bwd = sum(n * lc.bwd_s for n, lc in zip(kind_counts, kind_cost, strict=True))
    tp_s = sum(n * lc.tp_s for n, lc in zip(kind_counts, kind_cost, strict=True))
    cp_s = sum(n * lc.cp_s for n, lc in zip(kind_counts, kind_cost, strict=True))
    ep_s = sum(n * lc.ep_s for n, lc in zip(kind_counts, kind_cost, strict=True))
    stored = sum(n * lc.stored_act_bytes for n, lc in zip(kind_counts, kind_cost, strict=True))
    working: Num = 0.0  # the largest working set of a kind the stage holds
    for n, lc in zip(kind_counts, kind_cost, strict=True):
        working = maximum(working, select(n > 0, lc.working_act_bytes, 0.0))
    dense = sum(n * lc.dense_params for n, lc in zip(kind_counts, kind_cost, strict=True))
    expert = sum(n * lc.expert_params for n, lc in zip(kind_counts, kind_cost, strict=True))
    n_layers = maximum(1, sum(kind_counts))
    max_layer_params = functools.reduce(maximum, [lc.dense_params + lc.expert_params for lc in kind_cost])
    compute = fwd + bwd
    # first / last as factors (a stage-axis mask in cost.columns): adding 0.0 leaves a float as it is
    dense += first * (ctx.embedding_params / lay.tp)
    compute += last * head_s
    if ctx.lm_head_params:
        dense += last * (ctx.lm_head_params / lay.tp)
    else:  # tied embeddings: the last stage keeps its own copy unless it is also the first
        dense += (last * (1 - first)) * (ctx.embedding_params / lay.tp)
    dp_shard, ep_shard = shard_group_sizes(lay.dp, lay.cp, lay.tp, lay.ep)
    opt_dense_shard, opt_expert_shard = optimizer_shards(lay.zero_stage, lay.dp, lay.cp, lay.tp, lay.ep)

    # ---- optimizer step (memory-bound Adam on the local shard) ----------------------------------
    opt_params = dense / opt_dense_shard + expert / opt_expert_shard
    t_opt = opt_params * ADAM_STEP_BYTES / ctx.hbm_bytes_per_s

    # ---- memory -----------------------------------------------------------------------------
    w_bytes = _weight_bytes_per_param(ctx)
    weights_bytes, grads_bytes, optim_bytes = static_memory_bytes(ctx, lay.zero_stage, dense, expert, dp_shard, ep_shard,
                                                                  opt_dense_shard, opt_expert_shard)  # fmt: skip
    acts = working  # plus the in-flight micro-batches' stored activations (added per stage)
    tokens = lay.micro_batch_size * ctx.job.training.seq_len / lay.cp
    acts += last * (tokens * float(ctx.job.model.vocab_size or 0) / lay.tp * ctx.logit_bytes)
    buffers = cal.cuda_context_bytes + n_groups * cal.nccl_buffer_bytes_per_group
    if lay.zero_stage == 3:
        # two layers gathered at a time (current + prefetch); their non-local part
        total = dense + expert
        share_d = select(total > 0, dense / select(total > 0, total, 1.0), 1.0)
        gathered = minimum(2 * max_layer_params, total) * (
            share_d * (1.0 - 1.0 / dp_shard) + (1.0 - share_d) * (1.0 - 1.0 / ep_shard)
        )
        buffers += gathered * w_bytes
    elif lay.dp * lay.cp > 1:
        buffers += 2 * minimum(cal.dp_bucket_bytes, (dense + expert) * ctx.grad_bytes)
    memory = StageMemory(weights_bytes, grads_bytes, optim_bytes, acts, buffers)
    terms = StageTerms(fwd, bwd, compute, tp_s, cp_s, ep_s, 0.0, t_opt, memory)
    return terms, stored, grads_bytes, (dense, expert, n_layers, max_layer_params, compute, fwd, bwd)


def _weight_bytes_per_param(ctx: JobContext) -> float:
    """Bytes of one stored weight: bf16, plus the low-precision copy FP8 / FP4 training keeps."""
    return WEIGHT_BYTES + {"fp8": FP8_COPY_BYTES, "fp4": FP4_COPY_BYTES}.get(ctx.job.training.precision, 0.0)


def static_memory_bytes(
    ctx: JobContext, zero_stage: int, dense: Num, expert: Num, dp_shard: Num, ep_shard: Num,
    opt_dense_shard: Num, opt_expert_shard: Num,
) -> tuple[Num, Num, Num]:
    """(weights, gradients, optimizer state) bytes of a stage holding ``dense`` and ``expert``
    parameters, sharded as ZeRO ``zero_stage`` shards them (``shard_group_sizes``,
    ``optimizer_shards``). Linear in the parameters. Numbers or numpy arrays."""
    w_bytes = _weight_bytes_per_param(ctx)
    weights = (dense / dp_shard if zero_stage == 3 else dense) + (expert / ep_shard if zero_stage == 3 else expert)
    grads = (dense / dp_shard if zero_stage >= 2 else dense) + (expert / ep_shard if zero_stage >= 2 else expert)
    optim = dense / opt_dense_shard + expert / opt_expert_shard
    return weights * w_bytes, grads * ctx.grad_bytes, optim * OPTIMIZER_BYTES


def memory_floor_bytes(
    ctx: JobContext, zero_stage: int, dp: Num, cp: Num, tp: Num, ep: Num, pp: Num, totals: tuple[Num, ...]
) -> Num:
    """A lower bound on the peak per-GPU memory of a layout over every rank order and layer split,
    from its ``lower_bound_layer_totals``: that of the average stage (every layer and the
    embedding over ``pp``) counting only the CUDA context, its weights, gradients and optimizer
    state, one micro-batch of its stored activations, and the allocator's fragmentation share of
    those activations and the gradients. Each stage holds at least that much of its own (every
    stage has at least one micro-batch in flight: ``in_flight_microbatches``), it is linear in
    the stage's parameters and stored activations (sharded alike on every stage), so the largest
    stage's is at least the average's; working buffers and NCCL groups only add. A layout whose
    floor is above the usable capacity fits in memory under no split. ``zero_stage`` is a number;
    the rest numbers or numpy arrays (broadcast)."""
    dense, expert, stored = totals[1] / pp, totals[2] / pp, totals[5] / pp
    shards = shard_group_sizes(dp, cp, tp, ep)
    weights, grads, optim = static_memory_bytes(ctx, zero_stage, dense, expert, *shards,
                                                *optimizer_shards(zero_stage, dp, cp, tp, ep))  # fmt: skip
    frag = ctx.cal.fragmentation
    floor = ctx.cal.cuda_context_bytes + (weights + grads + optim) + (1.0 + frag) * stored + frag * grads
    # less 1e-9 relative: the terms are summed differently from a stage's own
    return floor * (1.0 - STEP_FLOOR_MARGIN)


def pp_comm_s(ctx: JobContext, lay: StageLayout, groups: AxisGroups, vpp: int | None = None) -> Num:
    """Exposed pipeline send/recv: a share of the steady-state sends plus the fill/drain chain
    (at interleaving depth ``vpp``, default the layout's: nothing else of the layout's depth
    enters)."""
    if lay.pp == 1 or not groups.pp.levels:
        return 0.0
    outer = groups.pp.levels[-1]
    t_p2p = p2p_time_s(_pp_message_bytes(ctx, lay), outer.beta_bytes_per_s, outer.alpha_s)
    return pp_comm_from_p2p_s(ctx, lay.pp, lay.vpp if vpp is None else vpp, lay.num_micro_batches, t_p2p)


def _pp_message_bytes(ctx: JobContext, lay: StageLayout) -> Num:
    """One micro-batch's activations crossing a pipeline boundary (split by TP with SP)."""
    h = float(ctx.job.model.hidden_size or 0)
    tokens = lay.micro_batch_size * ctx.job.training.seq_len / lay.cp
    return tokens * h * ACT_BYTES / select(lay.sequence_parallel, lay.tp, 1)


def pp_comm_from_p2p_s(ctx: JobContext, pp: int, vpp: int, m: int, t_p2p: float) -> float:
    """``pp_comm_s`` from one send's time: every chunk boundary sends forward and backward per
    micro-batch (the exposed share of them), plus the fill / drain chain across the stages."""
    exposed = ctx.cal.pp_comm_exposed if ctx.job.training.pp_comm_overlap else 1.0
    return exposed * m * 2 * vpp * t_p2p + 2 * (pp - 1) * t_p2p


def compose_step(
    lay: ResolvedLayout, stages: list[StageTerms], pp_comm: float
) -> tuple[dict[str, float], int]:
    """Step-time breakdown from the stage terms (and the index of the slowest stage)."""
    slow = max(range(len(stages)), key=lambda i: stages[i].time_s)
    dp_comm = max(t.dp_exposed_s for t in stages)
    optimizer = max(t.optimizer_s for t in stages)
    return step_breakdown(lay, stages[slow], dp_comm, optimizer, pp_comm), slow


def step_breakdown(lay: StageLayout, slowest: StageTerms, dp_comm: Num, optimizer: Num, pp_comm: Num) -> dict[str, Num]:
    """``compose_step``'s breakdown from the slowest stage's terms and the largest exposed
    data-parallel and optimizer times over the stages. Numbers or numpy arrays (``cost.columns``);
    the step time is the sum of the values in this order."""
    m = lay.num_micro_batches
    return {
        "compute": m * slowest.compute_s,
        "tp_comm": m * slowest.tp_s,
        "cp_comm": m * slowest.cp_s,
        "ep_comm": m * slowest.ep_s,
        "pp_comm": pp_comm,
        "pp_bubble": (lay.pp - 1) / lay.vpp * slowest.time_s,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
    }


def _distinct_stages(ctx: JobContext, lay: ResolvedLayout) -> list[tuple[bool, bool, tuple[int, ...]]]:
    """The distinct ``(first, last, kind counts)`` of the stages, in order of first occurrence
    (memoised per split). Stages that share them have the same time terms."""
    key = ("distinct", lay.pp, lay.stage_layers)
    cached = ctx.memo.get(key)
    if cached is None:
        counts = _stage_kind_counts(ctx, lay)
        cached = list(dict.fromkeys((s == 0, s == lay.pp - 1, counts[s]) for s in range(lay.pp)))
        ctx.memo[key] = cached
    return cached


def step_time_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``estimate(...).step_time_s`` without building the estimate: same terms, same arithmetic.

    ``compose_step`` takes maxima over stages and reads the first slowest stage; stages with the
    same ``(first, last, kind counts)`` have identical terms, so one of each, in stage order,
    gives the same floats. Lets ``best_estimate`` compare rank orders cheaply.
    """
    stages = [_stage_core_cached(ctx, lay, groups, c, f, la)[0] for f, la, c in _distinct_stages(ctx, lay)]
    breakdown, _ = compose_step(lay, stages, pp_comm_s(ctx, lay, groups))
    return sum(breakdown.values())


def peak_memory_bytes(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """``estimate(ctx, lay, order).peak_memory_bytes`` for any order whose groups have
    ``memory_signature(groups)``: the same stage memories without the time terms."""
    counts = _stage_kind_counts(ctx, lay)
    last = lay.pp - 1
    fixed = {d: _stage_fixed_cached(ctx, lay, groups, d[2], d[0], d[1]) for d in _distinct_stages(ctx, lay)}
    peak = 0.0
    for s in range(lay.pp):
        t, stored, grads_bytes, _ = fixed[(s == 0, s == last, counts[s])]
        peak = max(peak, _stage_memory(ctx, lay, s, t.memory, stored, grads_bytes).total_bytes)
    return peak


def _order_geometries(
    ctx: JobContext, lay: ResolvedLayout
) -> tuple[list[AxisGroups], list[AxisGroups], list[AxisGroups]]:
    """One rank order's groups per distinct (tp, cp, ep) geometry, which is all the per-layer
    costs read; per distinct (dp x cp, expert-dp, pp) geometry, which is all the exposed
    data-parallel and pipeline communication read; and per distinct pair of the two, which is
    all a whole step reads (memoised per axis sizes)."""
    key = ("order_geometries", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep)
    reps = ctx.memo.get(key)
    if reps is None:
        sizes = lay.sizes()
        layer: dict[tuple, AxisGroups] = {}
        comm: dict[tuple, AxisGroups] = {}
        both: dict[tuple, AxisGroups] = {}
        for o in candidate_orders(sizes):
            g = axis_groups(ctx.topology, o, sizes)
            layer.setdefault((g.tp, g.cp, g.ep), g)
            comm.setdefault((g.dp_cp, g.edp, g.pp), g)
            both.setdefault((g.tp, g.cp, g.ep, g.dp_cp, g.edp, g.pp), g)
        reps = (list(layer.values()), list(comm.values()), list(both.values()))
        ctx.memo[key] = reps
    return reps


def any_order_groups(ctx: JobContext, lay: ResolvedLayout) -> AxisGroups:
    """The groups of one rank order of the layout (the canonical first; memoised), for terms
    that do not depend on the order."""
    return _order_geometries(ctx, lay)[0][0]


def _kind_times(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> tuple[float, ...]:
    """Per layer kind, ``LayerCost.time_s`` under the groups' (tp, cp, ep) geometry (memoised)."""
    key = ("times", lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute,
           groups.tp, groups.cp, groups.ep)  # fmt: skip
    times = ctx.memo.get(key)
    if times is None:
        times = tuple(c.time_s for c in _kind_costs(ctx, lay, groups))
        ctx.memo[key] = times
    return times


def kind_time_floor(ctx: JobContext, lay: ResolvedLayout) -> tuple[float, ...]:
    """Per layer kind, the smallest ``LayerCost.time_s`` over every rank order of the layout
    (memoised: ZeRO stage, pipeline interleaving and the layer split do not change it)."""
    key = ("floor", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.micro_batch_size, lay.sequence_parallel,
           lay.recompute)
    floor = ctx.memo.get(key)
    if floor is None:
        per_geometry = [_kind_times(ctx, lay, g) for g in _order_geometries(ctx, lay)[0]]
        floor = tuple(min(times[k] for times in per_geometry) for k in range(len(ctx.kinds)))
        ctx.memo[key] = floor
    return floor


STEP_FLOOR_MARGIN = 1e-9
"""Relative slack of ``step_floor_s`` for float rounding (the exact terms are summed differently)."""


def _uniform_floor_terms(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups
) -> tuple[list[tuple[float, tuple, AxisGroups]], float, list[tuple[float, float, int, float, float, float, float]]]:
    """(per distinct rank-order geometry: ``m + (pp-1)/vpp`` times the slowest stage under it, the
    key of its data-parallel/pipeline geometry and a representative order's groups, ascending;
    slowest optimizer step; every distinct stage's data-parallel inputs) of the layout's own
    split. ``groups``: any order's, for the order-free terms."""
    head = head_time_s(ctx, lay)
    stages = _distinct_stages(ctx, lay)
    optimizer = 0.0
    dp_inputs = []
    for first, last, counts in stages:
        fixed = _stage_fixed_cached(ctx, lay, groups, counts, first, last)
        optimizer = max(optimizer, fixed[0].optimizer_s)
        dp_inputs.append(fixed[3])
    mult = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    pairs: list[tuple[float, tuple, AxisGroups]] = []
    per_layer_geometry: dict[tuple, float] = {}
    for g in _order_geometries(ctx, lay)[2]:
        key = (g.tp, g.cp, g.ep)
        if key not in per_layer_geometry:
            per_layer_geometry[key] = mult * _slowest_stage_s(ctx, lay, g, stages, head)
        pairs.append((per_layer_geometry[key], (g.dp_cp, g.edp, g.pp), g))
    pairs.sort(key=lambda p: p[0])
    return pairs, optimizer, dp_inputs


def _slowest_stage_s(
    ctx: JobContext, lay: ResolvedLayout, g: AxisGroups, stages: list[tuple[bool, bool, tuple[int, ...]]], head: float
) -> float:
    """The slowest of ``stages`` (``_distinct_stages``) counting its layers' times under ``g``'s
    per-layer geometry and the LM head on the last stage. Memoised per distinct stages: the ZeRO
    stage and the interleaving depth do not enter, so layouts that differ only in them share it."""
    key = ("slowest", tuple(stages), lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel,
           lay.recompute, g.tp, g.cp, g.ep)  # fmt: skip
    slowest = ctx.memo.get(key)
    if slowest is None:
        times = _kind_times(ctx, lay, g)
        slowest = ctx.memo[key] = max(
            sum(n * t for n, t in zip(counts, times, strict=True)) + (head if last else 0.0)
            for _, last, counts in stages
        )
    return slowest


def _uniform_comm_s(ctx: JobContext, lay: ResolvedLayout, g: AxisGroups, dp_inputs: list) -> float:
    """Slowest stage's exposed data-parallel time + pipeline send/recv under ``g``."""
    return max(_dp_exposed_s(ctx, lay, g, *inputs) for inputs in dp_inputs) + pp_comm_s(ctx, lay, g)


def step_floor_s(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> float:
    """A lower bound on ``estimate(ctx, lay, order).step_time_s`` over every rank order, for the
    layout's own layer split (``groups``: any order's; only its order-free terms are read).

    The step is ``(m + (pp-1)/vpp) * slowest stage + pipeline send/recv + slowest exposed DP +
    slowest optimizer``. Per rank order: each stage's time is at least its layers' times plus the
    LM head on the last stage; the communication terms are exact. The smallest over the orders'
    distinct geometries is taken; the optimizer term does not depend on the order.
    """
    pairs, optimizer, dp_inputs = _uniform_floor_terms(ctx, lay, groups)
    comm: dict[tuple, float] = {}
    best = float("inf")
    for st, ckey, g in pairs:
        if ckey not in comm:
            comm[ckey] = _uniform_comm_s(ctx, lay, g, dp_inputs)
        best = min(best, st + comm[ckey])
    return (best + optimizer) * (1.0 - STEP_FLOOR_MARGIN)


def step_floor_exceeds(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, threshold: float) -> bool:
    """``step_floor_s(ctx, lay, groups) > threshold``, stopping as soon as that is decided.

    The same arithmetic: the floor is the smallest over the orders' geometries of a sum, so one
    geometry at or below the threshold settles False; geometries come in ascending order of their
    layer part, so once that alone (with the optimizer step) exceeds the threshold, so do the rest.
    """
    pairs, optimizer, dp_inputs = _uniform_floor_terms(ctx, lay, groups)
    comm: dict[tuple, float] = {}
    for st, ckey, g in pairs:
        if (st + 0.0 + optimizer) * (1.0 - STEP_FLOOR_MARGIN) > threshold:
            return True
        if ckey not in comm:
            comm[ckey] = _uniform_comm_s(ctx, lay, g, dp_inputs)
        if (st + comm[ckey] + optimizer) * (1.0 - STEP_FLOOR_MARGIN) <= threshold:
            return False
    return True


def _min_max_stage_floor_s(ctx: JobContext, lay: ResolvedLayout, times: tuple[float, ...]) -> float:
    """A lower bound on the slowest stage's time over every layer split, each layer kind taking
    ``times[k]`` (one rank order's, or a floor over orders).

    Stage times add up to every layer's time plus the LM head, so the slowest is at least their
    average. And stages hold whole layers, a stage of q layers taking at least the time of the
    model's q cheapest layers, with the head on the last stage: the best any split can do is the
    best choice of the last stage's layer count with the rest spread as evenly as whole layers
    allow (with one layer kind, q times its time; with several, e.g. DeepSeek-V3's three dense
    layers among 58 MoE layers, much more than q times the cheapest kind's).
    """
    key = ("min_max_stage", lay.pp, lay.tp, lay.cp, lay.micro_batch_size, times)  # all it reads
    floor = ctx.memo.get(key)
    if floor is None:
        floor = ctx.memo[key] = _min_max_stage_floor_uncached(ctx, lay, times)
    return floor


def _min_max_stage_floor_uncached(ctx: JobContext, lay: ResolvedLayout, times: tuple[float, ...]) -> float:
    head = head_time_s(ctx, lay)
    totals = [ctx.kind_prefix[k][-1] for k in range(len(times))]
    average = (sum(n * f for n, f in zip(totals, times, strict=True)) + head) / lay.pp
    if lay.pp == 1:
        return average
    layers = sum(totals)
    by_time = sorted(range(len(times)), key=lambda k: times[k])

    def cheapest(q: int) -> float:
        """The time of the model's q cheapest layers: no stage of q layers is faster."""
        t, left = 0.0, q
        for k in by_time:
            take = min(left, totals[k])
            t += take * times[k]
            left -= take
        return t

    def worst(n_last: int) -> float:  # the last stage holds n_last layers, the rest spread evenly
        return max(cheapest(n_last) + head, cheapest(-(-(layers - n_last) // (lay.pp - 1))))

    # The last stage's time grows with n_last and the others' shrinks (in steps), so the smallest
    # worst case is at the first n_last where the last stage is the slowest, or just before it.
    lo, hi = 0, layers
    while lo < hi:
        mid = (lo + hi) // 2
        if cheapest(mid) + head >= cheapest(-(-(layers - mid) // (lay.pp - 1))):
            hi = mid
        else:
            lo = mid + 1
    whole = min(worst(lo), worst(lo - 1)) if lo > 0 else worst(lo)
    return max(average, whole)


NO_OVERLAP_S = 1e30
"""Compute time passed to ``_dp_exposed_s`` so that overlap hides everything it can."""


def split_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A lower bound on ``estimate(...).step_time_s`` over every rank order and every layer
    split with at least one layer per stage (all the search builds).

    The smallest, over the distinct geometries of the rank orders, of ``(m + (pp-1)/vpp) *
    _min_max_stage_floor_s`` (the order's own layer times) + pipeline send/recv + a floor on the
    slowest stage's exposed data-parallel time; + the average stage's optimizer step. Less 1e-9
    relative for rounding. Layer and communication terms come from the same order: an order that
    puts TP or EP on NVLink cannot also put the data-parallel rings there.

    The data-parallel floor is ``_dp_exposed_s`` of the average stage (its parameters,
    compute and layer count are the totals over ``pp``): the collectives are affine in their
    bytes (and, per ZeRO-3 layer gather, in the layer count) and the overlap terms are maxima,
    so the slowest stage's time is at least the average's, provided the term no overlap hides is
    the same for every stage or largest on the stage the floor takes it from: ZeRO-3's first
    gather (the largest layer, which some stage holds), or the last gradient bucket when each
    stage's dense gradients fill one. Otherwise it is ``_dp_exposed_s`` of the stage holding at
    least the average dense parameters with nothing to overlap against counted: what no overlap
    can hide (the last bucket).
    """
    floors = order_split_floors(ctx, lay)
    return floors[0][0]


def layers_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A cheap lower bound on ``split_floor_s``: its layer part with each layer kind at its
    fastest over every rank order (no communication, no optimizer step)."""
    steady = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    return steady * _min_max_stage_floor_s(ctx, lay, kind_time_floor(ctx, lay)) * (1.0 - STEP_FLOOR_MARGIN)


def order_split_floors(ctx: JobContext, lay: ResolvedLayout, vpp: int | None = None) -> list[tuple[float, AxisGroups]]:
    """``split_floor_s`` per distinct rank-order geometry of the layout (a representative order's
    groups), ascending: a lower bound on ``estimate`` in that order over every layer split. At
    interleaving depth ``vpp`` (default the layout's): the layout of ``lay``'s family at that
    depth gets the same floats, as nothing else of the depth enters. Memoised per layout and
    depth (the layout's own split does not enter); the terms that do not depend on the depth are
    shared by the family."""
    vpp = lay.vpp if vpp is None else vpp
    key = ("split_floors", lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, vpp, lay.micro_batch_size, lay.zero_stage,
           lay.recompute, lay.sequence_parallel, lay.num_micro_batches)
    floors = ctx.memo.get(key)
    if floors is not None:
        return floors
    optimizer, parts = _split_floor_parts(ctx, lay)
    steady = lay.num_micro_batches + (lay.pp - 1) / vpp
    sends: dict[GroupGeometry, float] = {}
    floors = []
    for stage, dp, g in parts:
        send = sends.get(g.pp)
        if send is None:
            send = sends[g.pp] = pp_comm_s(ctx, lay, g, vpp)
        floors.append(((optimizer + (steady * stage + (dp + send))) * (1.0 - STEP_FLOOR_MARGIN), g))
    floors.sort(key=lambda fg: fg[0])
    ctx.memo[key] = floors
    return floors


def split_floor_at_vpp_s(ctx: JobContext, lay: ResolvedLayout, vpp: int) -> float:
    """``split_floor_s`` of the layout of ``lay``'s family at interleaving depth ``vpp``, without
    resolving that layout; the same memo entry as that layout's own ``split_floor_s``."""
    return order_split_floors(ctx, lay, vpp)[0][0]


def _depth_free_key(tag: str, lay: ResolvedLayout) -> tuple:
    """Memo key of a term the layouts of one family share: every field but the interleaving depth
    and the layer split (``num_micro_batches`` follows from ``dp`` and ``micro_batch_size``)."""
    return (tag, lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage, lay.recompute,
            lay.sequence_parallel)  # fmt: skip


def _split_floor_parts(
    ctx: JobContext, lay: ResolvedLayout
) -> tuple[float, list[tuple[float, float, AxisGroups]]]:
    """The terms of ``order_split_floors`` that do not depend on the interleaving depth: the
    average stage's optimizer step, and per distinct rank-order geometry the slowest stage's
    floor (``_min_max_stage_floor_s`` of that order's layer times), the data-parallel floor and
    a representative order's groups. Memoised."""
    key = _depth_free_key("split_floor_parts", lay)
    cached = ctx.memo.get(key)
    if cached is not None:
        return cached
    per_layer_geometry: dict[tuple, float] = {}
    per_dp_geometry: dict[tuple, float] = {}
    parts = []
    for g in _order_geometries(ctx, lay)[2]:
        lkey, dkey = (g.tp, g.cp, g.ep), (g.dp_cp, g.edp)
        if lkey not in per_layer_geometry:
            per_layer_geometry[lkey] = _min_max_stage_floor_s(ctx, lay, _kind_times(ctx, lay, g))
        if dkey not in per_dp_geometry:
            per_dp_geometry[dkey] = _split_floor_dp_s(ctx, lay, g)
        parts.append((per_layer_geometry[lkey], per_dp_geometry[dkey], g))
    cached = ctx.memo[key] = (_split_floor_stage_inputs(ctx, lay)[0], parts)
    return cached


def split_may_reach(ctx: JobContext, est: Estimate, limits: Sequence[int], threshold_s: float) -> bool:
    """False only when no layer split of ``est``'s layout in ``est``'s rank order with stage
    ``s`` holding at most ``limits[s]`` layers (``stage_fit_limits``) can have a step time at
    most ``threshold_s`` (True does not promise one: the test is of a relaxation, and rules
    nothing out for three or more layer kinds).

    The step is at least ``split_floor_s``'s terms of this order with the slowest stage at
    its smallest over such splits, and ``stage_split_reaches`` decides exactly, for a relaxation
    (layer kinds on any stage), whether that stage can be fast enough. Tighter than the floor when
    stages must hold whole layers of unequal kinds or memory caps some stages."""
    lay = est.layout
    if lay.pp == 1 or not math.isfinite(threshold_s):
        return True
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    steady = lay.num_micro_batches + (lay.pp - 1) / lay.vpp
    rest = _split_floor_stage_inputs(ctx, lay)[0] + _split_floor_dp_s(ctx, lay, groups) + pp_comm_s(ctx, lay, groups)
    stage_time = (threshold_s / (1.0 - STEP_FLOOR_MARGIN) - rest) / steady
    totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
    return stage_split_reaches(stage_time, _kind_times(ctx, lay, groups), totals, head_time_s(ctx, lay), lay.vpp, limits)


def _split_floor_stage_inputs(ctx: JobContext, lay: ResolvedLayout) -> tuple[float, tuple, tuple]:
    """(the average stage's optimizer step, the average stage's data-parallel inputs, the inputs
    of the stage the data-parallel floor is taken from) of ``split_floor_s``. Memoised."""
    key = _depth_free_key("split_floor_inputs", lay)
    cached = ctx.memo.get(key)
    if cached is not None:
        return cached
    groups = any_order_groups(ctx, lay)
    totals = tuple(ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds)))
    # one stage holding every layer and the embedding: its parameters, compute and optimizer step
    everything, _, _, dp_inputs = _stage_fixed_cached(ctx, lay, groups, totals, True, False)
    dense, expert, n_layers, max_layer_params, compute, fwd, bwd = dp_inputs
    pp = lay.pp
    smallest_layer = min(c.dense_params for c in _kind_costs(ctx, lay, groups))
    average = (dense / pp, expert / pp, n_layers / pp, max_layer_params, (compute + head_time_s(ctx, lay)) / pp,
               fwd / pp, bwd / pp)  # fmt: skip
    if lay.zero_stage == 3 or smallest_layer * ctx.grad_bytes >= ctx.cal.dp_bucket_bytes:
        stage = average  # the head is on the last stage: more compute to overlap with
    else:
        stage = (dense / pp, 0.0, 1, max_layer_params, NO_OVERLAP_S, NO_OVERLAP_S, NO_OVERLAP_S)
    cached = ctx.memo[key] = (everything.optimizer_s / pp, average, stage)
    return cached


def _split_floor_dp_s(ctx: JobContext, lay: ResolvedLayout, g: AxisGroups) -> float:
    """``split_floor_s``'s floor on the slowest stage's exposed data-parallel time in the rank
    order of ``g`` (the same for every interleaving depth)."""
    _, average, stage = _split_floor_stage_inputs(ctx, lay)
    if stage is average:
        return _dp_exposed_s(ctx, lay, g, *stage)
    # What no overlap hides, or the overlap-limited part of the average stage (each stage's
    # exposed time is at least its own, which is affine in the stage's parameters and compute).
    # (affine in the stage's bytes and compute, with the SM share overlapped time still costs)
    t_b, _, t_f, _ = _dp_bucketed_times_s(ctx, lay, g, *average[:2])
    excess = contended(ctx, t_b - ctx.dp_overlap * average[6], t_b) + contended(
        ctx, t_f - ctx.dp_overlap * average[5], t_f
    )
    return max(_dp_exposed_s(ctx, lay, g, *stage), excess if t_b > 0 else 0.0)


def geometry_key(groups: AxisGroups) -> tuple:
    """What a step reads of a rank order: the groups' geometries, not the order's name."""
    return (groups.tp, groups.cp, groups.ep, groups.dp_cp, groups.edp, groups.pp)


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
    breakdown, _ = compose_step(lay, stages, pp_comm_s(ctx, lay, groups))
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


def compute_lower_bound_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A lower bound on ``estimate(...).step_time_s`` for every rank order and layer split.

    The slowest stage is at least the average stage, so ``m * avg + (pp-1)/vpp * avg`` bounds the
    steady pipeline plus bubble, the average stage's optimizer step bounds the optimizer term, and
    ``pp_comm_s`` at the cheapest send any pipeline-group geometry gives bounds the pipeline
    sends; every other term is non-negative. Uses the same per-layer costs.
    """
    return compute_lower_bounds(ctx, (lay,))[0]


def compute_lower_bounds(ctx: JobContext, layouts: Sequence[ResolvedLayout]) -> list[float]:
    """``compute_lower_bound_s`` of each layout, in one loop (the search bounds every layout)."""
    return [
        bound_at_vpp(ctx, terms, lay.pp, lay.vpp, lay.num_micro_batches)
        for terms, lay in zip(lower_bound_terms(ctx, layouts), layouts)
    ]


def bound_at_vpp(ctx: JobContext, terms: tuple[Num, Num, Num, Num], pp: Num, vpp: Num, m: Num) -> Num:
    """The lower bound from a layout's ``lower_bound_terms`` at interleaving depth ``vpp``: the
    bubble falls as it rises, the pipeline sends grow with it (``pp_comm_from_p2p_s`` at the
    cheapest send). Plain arithmetic: the arguments may be numbers or numpy arrays (the search
    bounds whole blocks of layouts at once), with the same floats either way."""
    steady, avg, optimizer, p2p = terms
    return steady + (pp - 1) / vpp * avg + optimizer + pp_comm_from_p2p_s(ctx, pp, vpp, m, p2p)


def family_bound(ctx: JobContext, terms: tuple[Num, Num, Num, Num], pp: Num, vpps: Sequence[int], m: Num) -> Num:
    """The smallest ``bound_at_vpp`` over the depths ``vpps`` (ascending). The bound is
    ``a + b / vpp + c * vpp`` with ``b, c >= 0`` (the bubble falls, the sends grow), convex in
    ``vpp``: its smallest over a sorted set is at one of the two depths beside ``sqrt(b / c)``.
    ``b`` and ``c`` are read off ``bound_at_vpp`` and ``pp_comm_from_p2p_s`` (the sends' share
    per unit of depth): a change to either formula's shape must keep it convex in ``vpp`` or
    change this too (``test_family_bound_is_the_smallest_member_bound`` checks the two agree).
    ``terms``, ``pp`` and ``m`` may be numbers (the answer is a float) or numpy arrays of one
    shape (the answer is an array of it)."""
    if len(vpps) <= 2:
        best = functools.reduce(np.minimum, (bound_at_vpp(ctx, terms, pp, v, m) for v in vpps))
    else:
        depths = np.asarray(vpps)
        b = (pp - 1) * terms[1]
        c = pp_comm_from_p2p_s(ctx, pp, 1, m, terms[3]) - pp_comm_from_p2p_s(ctx, pp, 0, m, terms[3])
        with np.errstate(divide="ignore", invalid="ignore"):
            beside = np.where(c > 0, np.searchsorted(depths, np.sqrt(np.divide(b, c)), side="left"), len(vpps))
        below = bound_at_vpp(ctx, terms, pp, depths[np.maximum(beside - 1, 0)], m)
        above = bound_at_vpp(ctx, terms, pp, depths[np.minimum(beside, len(vpps) - 1)], m)
        best = np.minimum(np.where(beside >= 1, below, np.inf), np.where(beside < len(vpps), above, np.inf))
    return best if np.ndim(best) else float(best)


def bound_terms(
    ctx: JobContext, totals: tuple[Num, ...], pp: Num, m: Num, dense_shard: Num, expert_shard: Num, p2p: Num,
    dp_floor: Num,
) -> tuple[Num, Num, Num, Num]:
    """``lower_bound_terms`` from a layout's ``lower_bound_layer_totals`` (every layer's time,
    dense and expert parameters, ...), its ``pp`` and micro-batch count, the ranks its optimizer
    state is sharded over (dense, expert; 1 without ZeRO), its ``p2p_floor_s`` and its
    ``dp_exposed_floor_s``. Plain arithmetic: numbers or numpy arrays (``search.bounds`` bounds
    blocks of layouts with it)."""
    layer_time, dense, expert = totals[:3]
    hbm = ctx.hbm_bytes_per_s
    avg = layer_time / pp
    # The optimizer step of the heaviest stage is at least that of the average stage.
    optimizer = (dense / dense_shard + expert / expert_shard) / pp * ADAM_STEP_BYTES / hbm
    return (m * avg, avg, optimizer + dp_floor, p2p)


def dp_exposed_floor_s(
    ctx: JobContext, zero_stage: int, dp: Num, cp: Num, tp: Num, ep: Num, pp: Num, m: Num,
    totals: tuple[Num, ...], head: Num,
) -> Num:
    """A lower bound on the slowest stage's exposed data-parallel time over every rank order and
    every layer split with at least one layer per stage, from ``lower_bound_layer_totals`` and
    ``head_time_s`` (the LM head).

    With ZeRO-0/1/2 it is also at least the last gradient bucket's collective (twice with
    ZeRO-1/2, whose parameter gather leaves its mirror exposed) at the average stage's dense
    gradient bytes: no overlap hides it, and the bucket time does not decrease in the bytes.

    Each stage's exposed time is at least ``_dp_exposed_from_parts_s`` with nothing counted as
    unhidden (the maxima with 0 are convex, the collective parts affine in the stage's bytes and
    layer count), so the slowest stage's is at least the average stage's: every layer, the
    embedding, and for ZeRO-3's overlap the LM head, over ``pp``. It does not decrease in the
    collective parts, so it is at least its value at each part's smallest over every geometry
    its group can have (``_axis_geometries``): the dense ``dp x cp`` group (``dp`` alone when a
    rank order separates the two axes) and the expert ``tp x cp x dp / ep`` group. ``zero_stage``
    is a number; the rest numbers or numpy arrays of one shape (the answer is then an array)."""
    arrays = (dp, cp, tp, ep, pp, m, head, *totals)
    scalar = not any(isinstance(a, np.ndarray) for a in arrays)
    dp, cp, tp, ep, pp, m, head, _, dense, expert, fwd, bwd, _ = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(a)) for a in arrays)
    )
    n_layers = (ctx.job.model.num_layers or 0) / pp
    g_dense, g_exp = dense * ctx.grad_bytes / pp, expert * ctx.grad_bytes / pp

    def smallest(sizes: np.ndarray, ring, cost, g: np.ndarray) -> np.ndarray:
        """``cost(levels, selection, bytes)`` at its smallest over every geometry of the group."""
        best = np.full(sizes.shape, np.inf)
        for size in np.unique(sizes):
            sel = sizes == size
            for geo in _axis_geometries(ctx, int(size)):
                best[sel] = np.minimum(best[sel], cost(ring(ctx, geo), sel, g[sel]))
        return best

    def smallest_dense(cost, g: np.ndarray) -> np.ndarray:
        """``smallest`` over the dense ``dp x cp`` group, or ``dp`` alone when an order separates them."""
        best = smallest(dp * cp, _dp_ring, cost, g)
        if np.any(cp > 1):
            best = np.minimum(best, np.where(cp > 1, smallest(dp, _dp_ring, cost, g), np.inf))
        return best

    def dense_collective(levels, sel, g):  # the expert part runs over no levels: 0, not read
        return _dp_collective_parts_s(zero_stage, levels, (), g, g, n_layers[sel], ctx.grad_bytes)[0]

    def expert_collective(levels, sel, g):
        return _dp_collective_parts_s(zero_stage, (), levels, g, g, n_layers[sel], ctx.grad_bytes)[1]

    def parts(g_dense: np.ndarray, g_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (smallest_dense(dense_collective, g_dense),
                smallest(tp * cp * dp // ep, _expert_dp_ring, expert_collective, g_exp))  # fmt: skip

    dense_part, expert_part = parts(g_dense, g_exp)
    ratio = _gather_scale(ctx, zero_stage)
    gather = None if ratio is None else sum(parts(g_dense * ratio, g_exp * ratio))
    compute = (fwd + bwd + head) / pp
    floor = _dp_exposed_from_parts_s(ctx, zero_stage, m, n_layers, (dense_part, expert_part), 0.0,
                                     compute, fwd / pp, bwd / pp, gather)  # fmt: skip
    if zero_stage != 3:
        # the last gradient bucket is never hidden (twice with ZeRO-1/2: its parameter gather too);
        # the stage with the most dense parameters has at least the average's
        last_bucket = smallest_dense(lambda levels, _, g: _last_bucket_s(ctx, zero_stage, levels, g), g_dense)
        floor = np.maximum(floor, (1 if zero_stage == 0 else 2) * last_bucket)
    floor = floor * (1.0 - STEP_FLOOR_MARGIN)  # the terms are summed differently from the exact ones
    return float(floor[0]) if scalar else floor


def shard_group_sizes(dp: Num, cp: Num, tp: Num, ep: Num) -> tuple[Num, Num]:
    """The ranks ZeRO shards dense and expert state over: the dense data-parallel group
    (``dp x cp``) and the expert data-parallel group (``tp x dp x cp / ep``)."""
    return dp * cp, tp * dp * cp // ep


def optimizer_shards(zero_stage: Num, dp: Num, cp: Num, tp: Num, ep: Num) -> tuple[Num, Num]:
    """The ranks the dense and the expert optimizer state are sharded over: the groups of
    ``shard_group_sizes`` from ZeRO-1 on, 1 without ZeRO. Numbers or numpy arrays (broadcast)."""
    dense, expert = shard_group_sizes(dp, cp, tp, ep)
    sharded = zero_stage >= 1
    return select(sharded, dense, 1), select(sharded, expert, 1)


def lower_bound_terms(ctx: JobContext, layouts: Sequence[ResolvedLayout]) -> list[tuple[float, float, float, float]]:
    """Per layout, what its bound is made of apart from the interleaving depth: ``m`` times the
    average stage's time per micro-batch, that time, the average stage's optimizer step plus a
    floor on the exposed data-parallel time (``dp_exposed_floor_s``), and one pipeline send at its
    cheapest over every geometry the pipeline group can have."""
    out = []
    for lay in layouts:
        totals = lower_bound_layer_totals(
            ctx, lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute
        )
        shards = optimizer_shards(lay.zero_stage, lay.dp, lay.cp, lay.tp, lay.ep)
        dp_floor = dp_exposed_floor_s(ctx, lay.zero_stage, lay.dp, lay.cp, lay.tp, lay.ep, lay.pp,
                                      lay.num_micro_batches, totals, head_time_s(ctx, lay))  # fmt: skip
        out.append(bound_terms(ctx, totals, lay.pp, lay.num_micro_batches, *shards, p2p_floor_s(ctx, lay), dp_floor))
    return out


def lower_bound_layer_totals(
    ctx: JobContext, tp: int, cp: int, ep: int, micro_batch_size: int, sequence_parallel: bool, recompute: str
) -> tuple[float, float, float, float, float, float]:
    """``_lower_bound_totals``, memoised on the layout fields it reads."""
    key = ("lb", tp, cp, ep, micro_batch_size, sequence_parallel, recompute)
    totals = ctx.memo.get(key)
    if totals is None:
        totals = ctx.memo[key] = _lower_bound_totals(
            ctx, Dims(tp, cp, ep, micro_batch_size, sequence_parallel, recompute)
        )
    return totals


def p2p_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """``_p2p_floor_s`` memoised (0 without pipelining)."""
    if lay.pp == 1:
        return 0.0
    key = ("lb-p2p", lay.pp, lay.micro_batch_size, lay.cp, lay.tp if lay.sequence_parallel else 1)
    p2p = ctx.memo.get(key)
    if p2p is None:
        p2p = ctx.memo[key] = _p2p_floor_s(ctx, lay)
    return p2p


def _p2p_floor_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """The cheapest pipeline send of ``lay`` over every geometry its pipeline group can have."""
    msg = _pp_message_bytes(ctx, lay)
    return min(
        p2p_time_s(msg, g.levels[-1].beta_bytes_per_s, g.levels[-1].alpha_s) if g.levels else 0.0
        for g in _axis_geometries(ctx, lay.pp)
    )


def _axis_geometries(ctx: JobContext, size: int) -> tuple[GroupGeometry, ...]:
    """Every distinct geometry a ``size``-rank group can have: one per stride dividing
    ``num_gpus / size`` (a superset of what the rank orders give).

    Locality is not always cheaper under the cost model: a flat NVLink ring pays ``2(N-1)``
    latency steps where a group split over two tiers pays fewer, a partial scale-up mesh gets a
    fraction of the bandwidth, and a job spread over NVLink domains of 37 GPUs puts a 2-rank group
    at stride 1 across two domains but at stride 2 inside one."""
    key = ("axis-geometries", size)
    cached = ctx.memo.get(key)
    if cached is None:
        topo = ctx.topology
        rest = topo.num_gpus // size
        seen: dict[tuple, GroupGeometry] = {}
        for stride in divisors(rest):
            geo = group_geometry(topo, stride, size)
            seen.setdefault(geo.levels, geo)
        cached = tuple(seen.values())
        ctx.memo[key] = cached
    return cached


def _lower_bound_totals(ctx: JobContext, dims: Dims) -> tuple[float, float, float, float, float, float]:
    """(every layer's time, dense parameters with the embedding, expert parameters, every layer's
    forward compute, every layer's backward compute, every layer's stored activation bytes) on one
    GPU, per micro-batch.

    A layer's time is its compute plus its TP, CP and EP communication, each of which depends only
    on its own axis's group geometry (``layer.tp_comm_s`` etc.): each at its smallest over the
    geometries the axis can have bounds every rank order."""
    topo = ctx.topology
    one = group_geometry(topo, 1, 1)
    groups = AxisGroups(("tp", "cp", "dp", "pp"), one, one, one, one, one, one, one)
    memo = ctx.memo
    # A dense layer's cost does not depend on ep, nor its TP and CP terms on ep: keys without it
    # are shared by every expert-parallel degree (most of the keys of an MoE job).
    no_ep = Dims(dims.tp, dims.cp, 1, dims.micro_batch_size, dims.sequence_parallel, dims.recompute)
    times = []
    costs = []
    for i, kind in enumerate(ctx.kinds):
        kd = dims if kind.is_moe else no_ep
        c = memo.get(("lb-layer", i, kd))
        if c is None:
            c = memo[("lb-layer", i, kd)] = layer_cost(ctx, kind, kd, groups)  # compute and parameters only
        tp_cp = memo.get(("lb-tp-cp", i, no_ep))
        if tp_cp is None:
            tp_cp = 0.0
            if dims.tp > 1:
                tp_cp += min(tp_comm_s(ctx, kind, no_ep, g) for g in _axis_geometries(ctx, dims.tp))
            if dims.cp > 1:
                t_core, t_core_bwd = attention_core_times_s(ctx, kind, no_ep)
                tp_cp += min(cp_comm_s(ctx, no_ep, g, t_core, t_core_bwd) for g in _axis_geometries(ctx, dims.cp))
            memo[("lb-tp-cp", i, no_ep)] = tp_cp
        t = c.fwd_s + c.bwd_s + tp_cp
        if kind.is_moe and dims.ep > 1:
            t += min(ep_comm_s(ctx, kind, dims, g) for g in _axis_geometries(ctx, dims.ep))
        costs.append(c)
        times.append(t)
    per_layer_total = sum(ctx.kind_prefix[k][-1] * t for k, t in enumerate(times))
    dense = sum(ctx.kind_prefix[k][-1] * c.dense_params for k, c in enumerate(costs))
    expert = sum(ctx.kind_prefix[k][-1] * c.expert_params for k, c in enumerate(costs))
    fwd = sum(ctx.kind_prefix[k][-1] * c.fwd_s for k, c in enumerate(costs))
    bwd = sum(ctx.kind_prefix[k][-1] * c.bwd_s for k, c in enumerate(costs))
    stored = sum(ctx.kind_prefix[k][-1] * c.stored_act_bytes for k, c in enumerate(costs))
    return (per_layer_total, dense + ctx.embedding_params / dims.tp, expert, fwd, bwd, stored)


SPLIT_RADIUS_MIN = 4
SPLIT_FULL_TABLE_MAX = 128
"""Layer-split tables cover every possible layer count of every stage when that is at most this
many entries (small jobs, where a huge LM head or a tight memory limit may want a split such as
[L-1, 1]); otherwise each stage's even share +- max(4, share/2) layers."""


@dataclass(frozen=True)
class SplitTables:
    """Exact per-stage cost tables of one layout and rank order, indexed by the stage's layer count.

    ``time_s[s][i]``, ``dp_s[s][i]``, ``optimizer_s[s][i]`` and ``memory_bytes[s][i]`` are the
    cost model's ``stage_terms`` for stage ``s`` holding ``lo + i`` layers. The step time of a
    split is ``steady_coefficient * max time + max dp + max optimizer + pp_comm_s``: the same
    composition as ``estimate``. Exact for models with one layer kind. With several kinds a
    stage's mix depends on which layers it holds: ``by_start`` then lists, per stage, every
    (first layer, layers, time, dp, optimizer, memory) a one-chunk-per-stage split can give it,
    and ``by_mix`` (interleaved stages) every mix its chunks can add up to. When neither is built
    (a per-mix table too large) the mix is taken from where the even split puts it and ``exact``
    is False.
    """

    lo: int
    hi: int
    time_s: tuple[tuple[float, ...], ...]
    dp_s: tuple[tuple[float, ...], ...]
    optimizer_s: tuple[tuple[float, ...], ...]
    memory_bytes: tuple[tuple[float, ...], ...]
    steady_coefficient: float
    pp_comm_s: float
    by_start: tuple[tuple[tuple[int, int, float, float, float, float], ...], ...] | None = None
    by_mix: tuple[tuple[tuple[int, tuple[int, ...], float, float, float, float], ...], ...] | None = None
    """Interleaved stages of a model with several layer kinds: per stage, (layers, layers of each
    kind, time, dp, optimizer, memory) for every kind mix the stage's chunks can add up to; the
    model then follows each chunk's first layer and count through ``kind_prefix``."""
    kind_prefix: tuple[tuple[int, ...], ...] = ()
    exact: bool = True


SPLIT_CERTIFIED_TABLE_MAX = 4096
"""Largest certified table (entries over all stages) ``certified_split_range`` hands out."""


def _table_stage_terms(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, stage: int, n: int, offsets: list[int]
) -> StageTerms:
    """``stage_terms`` of stage ``stage`` holding ``n`` layers, its kind mix taken from where the
    even split (``offsets``: first layer of each stage) puts it."""
    start = 0 if stage == 0 else min(offsets[stage], len(ctx.layer_kind) - n)
    return stage_terms(ctx, lay, groups, stage, _counts_at(ctx, start, n))


def _counts_at(ctx: JobContext, start: int, n: int) -> tuple[int, ...]:
    """Layers of each kind among layers ``start .. start + n - 1``."""
    prefix = ctx.kind_prefix
    return tuple(prefix[k][start + n] - prefix[k][start] for k in range(len(prefix)))


def _mixes(ctx: JobContext, starts: range, n: int) -> frozenset[tuple[int, ...]]:
    """The distinct layer-kind mixes of ``n`` consecutive layers starting anywhere in ``starts``
    (memoised per job)."""
    key = ("mixes", n, starts.start, starts.stop)
    mixes = ctx.memo.get(key)
    if mixes is None:
        found: set[tuple[int, ...]] = set()
        if len(starts):
            kinds = ctx.layer_kind
            counts = list(_counts_at(ctx, starts.start, n))
            found.add(tuple(counts))
            for s in range(starts.start + 1, starts.stop):  # slide: drop layer s - 1, add s + n - 1
                out, add = kinds[s - 1], kinds[s + n - 1]
                if out != add:
                    counts[out] -= 1
                    counts[add] += 1
                    found.add(tuple(counts))
        mixes = frozenset(found)
        ctx.memo[key] = mixes
    return mixes


def _stage_starts(lay: ResolvedLayout, layers: int, stage: int, n: int, lo: int, hi: int) -> range:
    """First layers stage ``stage`` can have when it holds ``n`` layers and every stage holds
    ``lo .. hi`` (one chunk per stage: the stages before it hold the layers before it)."""
    if stage == 0:
        return range(1)
    if stage == lay.pp - 1:
        return range(layers - n, layers - n + 1)
    first = max(stage * lo, layers - n - (lay.pp - 1 - stage) * hi)
    last = min(stage * hi, layers - n - (lay.pp - 1 - stage) * lo)
    return range(first, last + 1)


SPLIT_MIX_TABLE_MAX = 20_000
"""Largest per-mix table (entries over all stages) ``split_tables`` builds for interleaved stages
of a model with several layer kinds; beyond it the tables fall back to the even split's mixes."""


def _mix_vectors(n: int, totals: Sequence[int]) -> list[tuple[int, ...]]:
    """Every way to pick ``n`` layers when there are ``totals[k]`` layers of kind ``k``."""
    if len(totals) == 1:
        return [(n,)] if n <= totals[0] else []
    out = []
    for first in range(max(0, n - sum(totals[1:])), min(n, totals[0]) + 1):
        out += [(first, *rest) for rest in _mix_vectors(n - first, totals[1:])]
    return out


def _chunk_sum_mixes(ctx: JobContext, vpp: int, most: int) -> frozenset[tuple[int, ...]]:
    """Every layer-kind mix (layers of each kind) that ``vpp`` runs of consecutive layers, each
    of at least one layer and together at most ``most``, can add up to (memoised per job).

    A stage of an interleaved split holds ``vpp`` such runs (its chunks), so its mix is among
    these; the runs' order and disjointness are left out, so some of them no split gives. With
    MoE on every second layer a run of ``n`` layers holds ``n // 2`` or ``n - n // 2`` MoE layers,
    so a stage of ``n`` layers holds within ``vpp / 2`` of ``n / 2``: of the ``n + 1`` mixes a
    stage of ``n`` layers could otherwise hold, at most ``vpp + 1`` remain.
    """
    key = ("chunk_sum_mixes", vpp, most)
    found = ctx.memo.get(key)
    if found is None:
        layers = len(ctx.layer_kind)
        longest = most - (vpp - 1)
        runs = set().union(*(_mixes(ctx, range(layers - n + 1), n) for n in range(1, min(longest, layers) + 1)))
        found = _sums_of_runs(runs, vpp, most, len(ctx.kinds))
        ctx.memo[key] = found
    return found


CHUNK_SUM_GRID_MAX = 2_000_000
"""Largest kind-count grid (``(most + 1) ** kinds`` cells) ``_sums_of_runs`` fills as an array."""


def _sums_of_runs(
    runs: set[tuple[int, ...]], vpp: int, most: int, kinds: int
) -> frozenset[tuple[int, ...]]:
    """Every sum of ``vpp`` mixes from ``runs`` (repeats allowed) with at most ``most`` layers in
    all: a reachability grid over the kind counts, shifted by each run ``vpp`` times (a set of
    tuples when the grid would be larger than ``CHUNK_SUM_GRID_MAX``)."""
    if (most + 1) ** kinds > CHUNK_SUM_GRID_MAX:
        sums: set[tuple[int, ...]] = {(0,) * kinds}
        for _ in range(vpp):
            sums = {tuple(a + b for a, b in zip(x, r, strict=True)) for x in sums for r in runs if sum(x) + sum(r) <= most}
        return frozenset(sums)
    size = most + 1
    reach = np.zeros((size,) * kinds, dtype=bool)
    reach[(0,) * kinds] = True
    for _ in range(vpp):
        nxt = np.zeros_like(reach)
        for r in runs:
            if max(r) >= size:
                continue
            dst = tuple(slice(c, size) for c in r)
            src = tuple(slice(0, size - c) for c in r)
            nxt[dst] |= reach[src]
        reach = nxt
    total = np.indices(reach.shape).sum(axis=0)
    return frozenset(tuple(int(c) for c in idx) for idx in np.argwhere(reach & (total <= most)))


def _several_kinds_one_chunk(ctx: JobContext, lay: ResolvedLayout) -> bool:
    return len(ctx.kinds) > 1 and lay.vpp == 1 and lay.pp > 1


def _per_stage_layers(lay: ResolvedLayout) -> list[int]:
    return [sum(lay.stage_layers[j] for j in range(s, len(lay.stage_layers), lay.pp)) for s in range(lay.pp)]


def some_split_may_fit(ctx: JobContext, lay: ResolvedLayout, cap_bytes: float) -> bool:
    """False when no layer split of ``lay`` in any of its rank orders fits within ``cap_bytes``
    per GPU: for every memory signature of its orders, some stage cannot hold one layer per chunk
    or the stages' limits (``stage_fit_limits``, sharing its memo) add up to fewer layers than the
    model has. The split phase skips such layouts before computing their split floors."""
    total = len(ctx.layer_kind)
    seen = set()
    for g in _order_geometries(ctx, lay)[2]:
        sig = memory_signature(g)
        if sig in seen:
            continue
        seen.add(sig)
        key = ("fit-admits", lay, sig, cap_bytes)
        admits = ctx.memo.get(key)
        if admits is None:
            limits = _stage_fit_limits(ctx, lay, g, cap_bytes, needed=total)
            if limits is not None:  # computed in full: the per-pair test reads them
                ctx.memo[_fit_limits_key(lay, sig, cap_bytes)] = tuple(limits)
            admits = ctx.memo[key] = limits is not None and limits_admit_split(limits, lay.vpp, total)
        if admits:
            return True
    return False


def limits_admit_split(limits: Sequence[int], vpp: int, num_layers: int) -> bool:
    """Some layer split fits within per-stage ``limits``: every stage holds one layer per chunk
    and together they hold every layer."""
    return min(limits) >= vpp and sum(limits) >= num_layers


def _fit_limits_key(lay: ResolvedLayout, signature: tuple[bool, ...], cap: float) -> tuple:
    # memory takes nothing else from the rank order (see memory_signature): every geometry of a
    # layout shares its limits
    return ("fit-limits", lay, signature, cap)


def _cached_fit_limits(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, cap: float) -> tuple[int, ...]:
    key = _fit_limits_key(lay, memory_signature(groups), cap)
    cached = ctx.memo.get(key)
    if cached is None:
        limits = _stage_fit_limits(ctx, lay, groups, cap)
        assert limits is not None
        cached = ctx.memo[key] = tuple(limits)
    return cached


def stage_fit_limits(ctx: JobContext, est: Estimate) -> list[int]:
    """Per pipeline stage of ``est``'s layout in ``est``'s rank order, the most layers it can hold
    with its memory within capacity less headroom (``vpp - 1`` when not even one layer per chunk
    fits). A stage's memory grows with its layers, so a split fits only if every stage is within
    its limit; binary search over the same stage terms as ``split_tables`` (with several layer
    kinds and one chunk per stage: at some position the stage can start at; with several kinds
    and interleaved stages: with the kind mix of that many layers that needs the least memory,
    as the stage's chunks may add up to any mix)."""
    lay = est.layout
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    return list(_cached_fit_limits(ctx, lay, groups, est.capacity_bytes - est.headroom_bytes))


def _stage_fit_limits(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, cap: float, needed: int | None = None
) -> list[int] | None:
    """``stage_fit_limits`` of one memory signature. With ``needed`` (the model's layers): None as
    soon as stage 0 cannot hold one layer per chunk or the first, last and largest middle limits
    show that the stages cannot hold ``needed`` layers together."""
    per_stage = _per_stage_layers(lay)
    offsets = [sum(per_stage[:s]) for s in range(lay.pp)]
    layers = len(ctx.layer_kind)
    most = layers - (lay.pp - 1) * lay.vpp
    by_start = _several_kinds_one_chunk(ctx, lay)
    totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]

    def fits(s: int, n: int) -> bool:
        if len(ctx.kinds) == 1:
            start = 0 if s == 0 else min(offsets[s], layers - n)  # as _table_stage_terms places it
            return stage_memory_bytes(ctx, lay, groups, s, _counts_at(ctx, start, n)) <= cap
        if by_start:  # n layers fit if they do at some position the stage can start at
            mixes = _mixes(ctx, _stage_starts(lay, layers, s, n, lay.vpp, most), n)
        else:
            # interleaved stages: the chunks' cuts decide the stage's mix, so n layers fit if some
            # mix of n layers does (a stage's memory never shrinks when it gains a layer, so the
            # least over the mixes grows with n and the binary search below holds)
            mixes = _mix_vectors(n, totals)
        return any(stage_memory_bytes(ctx, lay, groups, s, c) <= cap for c in mixes)

    def limit(s: int, lo: int, hi: int) -> int:
        """The most layers stage s fits, given that ``lo`` fits (or is vpp - 1) and ``hi + 1``
        does not: doubling strides up from ``lo``, then a bisection of the last stride."""
        step = 1
        while lo < hi:
            probe = min(hi, lo + step)
            if not fits(s, probe):
                hi = probe - 1
                break
            lo, step = probe, 2 * step
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(s, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    pp, none_fit = lay.pp, lay.vpp - 1
    # Middle stages try the same mixes and differ only in their in-flight micro-batches, which
    # never grow with the stage index: what fits stage s - 1 fits stage s, so their limits rise
    # along the pipeline and the last middle stage's bounds them all.
    ordered_middle = not by_start and pp > 3
    first_fits = none_fit
    if needed is not None:
        # Two probes settle most layouts that no split fits: stage 0 must hold one layer per
        # chunk, and some stage must hold ceil(needed / pp) layers (pigeonhole), which, unless
        # stages start at different kind mixes, the largest-limit stages (the last middle one:
        # what fits stage s - 1 fits stage s, stage 0 included as it also holds the embedding;
        # and the last one) must then hold.
        if not fits(0, lay.vpp):
            return None
        first_fits = lay.vpp
        share = -(-needed // pp)
        if pp > 1 and not by_start and lay.vpp <= share <= most and not fits(pp - 2, share) and not fits(pp - 1, share):
            return None
    first = limit(0, first_fits, most)
    known = {0: first}
    if ordered_middle:
        known[pp - 1] = limit(pp - 1, none_fit, most)
        known[pp - 2] = limit(pp - 2, none_fit, most)
        if needed is not None and first + known[pp - 1] + (pp - 2) * known[pp - 2] < needed:
            return None
    limits: list[int] = []
    for s in range(pp):
        if s in known:
            limits.append(known[s])
        elif ordered_middle and s > 1:
            limits.append(limit(s, limits[-1], known[pp - 2]))
        else:
            limits.append(limit(s, none_fit, most))
    return limits


def certified_split_range(
    ctx: JobContext, est: Estimate, threshold_s: float, most_fitting: int
) -> tuple[int, int] | None:
    """Layer counts per stage that every split of ``est``'s layout in ``est``'s rank order that
    fits in memory (no stage above ``most_fitting`` layers) and has a step time at most
    ``threshold_s`` keeps, or None when that range is too wide to tabulate.

    A stage holding ``n`` layers takes at least ``n`` times the cheapest layer of this order, and
    the step at least ``(m + (pp-1)/vpp)`` times its slowest stage, which bounds ``n`` from above
    (``hi``); the other ``pp - 1`` stages hold at most ``hi`` each, which bounds it from below.
    An empty range (``lo > hi``) means no such split in this order.
    """
    lay = est.layout
    layers = len(ctx.layer_kind)
    hi = min(layers - (lay.pp - 1) * lay.vpp, most_fitting)
    if math.isfinite(threshold_s):
        groups = axis_groups(ctx.topology, est.order, lay.sizes())
        per_layer = min(_kind_times(ctx, lay, groups)) * (lay.num_micro_batches + (lay.pp - 1) / lay.vpp)
        if per_layer > 0:
            hi = min(hi, int(threshold_s * (1 + 1e-9) / per_layer))
    lo = max(lay.vpp, layers - (lay.pp - 1) * hi)
    if (hi - lo + 1) * lay.pp > SPLIT_CERTIFIED_TABLE_MAX:
        return None
    return lo, hi


def split_tables(ctx: JobContext, est: Estimate, layer_range: tuple[int, int] | None = None) -> SplitTables:
    """``SplitTables`` of ``est``'s layout in ``est``'s rank order, over ``layer_range`` (from
    ``certified_split_range``) or, without one, over every layer count when that is at most
    ``SPLIT_FULL_TABLE_MAX`` entries and each stage's even share +- max(4, share/2) otherwise. The
    uniform split's counts are always included."""
    lay = est.layout
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    layers = len(ctx.layer_kind)
    per_stage = _per_stage_layers(lay)
    share = layers / lay.pp
    most = layers - (lay.pp - 1) * lay.vpp  # every other stage keeps one layer per chunk
    if (most - lay.vpp + 1) * lay.pp <= SPLIT_FULL_TABLE_MAX:
        radius = layers  # every split (a huge LM head or a tight memory limit may want [L-1, 1])
    else:
        radius = max(SPLIT_RADIUS_MIN, int(share // 2))
    lo = max(lay.vpp, int(share) - radius) if lay.pp > 1 else layers
    hi = min(most, int(share) + 1 + radius) if lay.pp > 1 else layers
    if layer_range is not None:
        lo, hi = layer_range
    lo = min(lo, *per_stage)
    hi = max(hi, *per_stage)
    offsets = [sum(per_stage[:s]) for s in range(lay.pp)]
    time_t, dp_t, opt_t, mem_t = [], [], [], []
    for s in range(lay.pp):
        row_t, row_d, row_o, row_m = [], [], [], []
        for n in range(lo, hi + 1):
            t = _table_stage_terms(ctx, lay, groups, s, n, offsets)
            row_t.append(t.time_s)
            row_d.append(t.dp_exposed_s)
            row_o.append(t.optimizer_s)
            row_m.append(t.memory.total_bytes)
        time_t.append(tuple(row_t))
        dp_t.append(tuple(row_d))
        opt_t.append(tuple(row_o))
        mem_t.append(tuple(row_m))
    by_start = None
    if _several_kinds_one_chunk(ctx, lay):
        rows = []
        for s in range(lay.pp):
            row = []
            terms: dict[tuple[int, ...], tuple[float, float, float, float]] = {}
            for n in range(lo, hi + 1):
                for start in _stage_starts(lay, layers, s, n, lo, hi):
                    mix = _counts_at(ctx, start, n)
                    if mix not in terms:
                        t = stage_terms(ctx, lay, groups, s, mix)
                        terms[mix] = (t.time_s, t.dp_exposed_s, t.optimizer_s, t.memory.total_bytes)
                    row.append((start, n, *terms[mix]))
            rows.append(tuple(row))
        by_start = tuple(rows)
    by_mix = None
    if len(ctx.kinds) > 1 and lay.vpp > 1 and lay.pp > 1:
        totals = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
        reachable = _chunk_sum_mixes(ctx, lay.vpp, hi)
        mixes = {n: [v for v in _mix_vectors(n, totals) if v in reachable] for n in range(lo, hi + 1)}
        if sum(len(v) for v in mixes.values()) * lay.pp <= SPLIT_MIX_TABLE_MAX:
            rows = []
            for s in range(lay.pp):
                row = []
                for n, vectors in mixes.items():
                    for mix in vectors:
                        t = stage_terms(ctx, lay, groups, s, mix)
                        row.append((n, mix, t.time_s, t.dp_exposed_s, t.optimizer_s, t.memory.total_bytes))
                rows.append(tuple(row))
            by_mix = tuple(rows)
    return SplitTables(
        lo, hi, tuple(time_t), tuple(dp_t), tuple(opt_t), tuple(mem_t),
        lay.num_micro_batches + (lay.pp - 1) / lay.vpp, pp_comm_s(ctx, lay, groups),
        by_start, by_mix, ctx.kind_prefix,
        exact=len(ctx.kinds) == 1 or by_start is not None or by_mix is not None,
    )


def head_time_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """Forward and backward of the LM head and loss for one micro-batch (memoised per job)."""
    return head_time_at_s(ctx, lay.tp, lay.cp, lay.micro_batch_size)


def head_time_at_s(ctx: JobContext, tp: int, cp: int, micro_batch_size: int) -> float:
    """``head_time_s`` of a layout with these sizes (the only fields it reads; memoised per job)."""
    key = ("head", tp, cp, micro_batch_size)
    t = ctx.memo.get(key)
    if t is None:
        t = ctx.memo[key] = _head_time_uncached(ctx, tp, cp, micro_batch_size)
    return t


def _head_time_uncached(ctx: JobContext, tp: int, cp: int, micro_batch_size: int) -> float:
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    vocab = float(model.vocab_size or 0)
    tokens = micro_batch_size * ctx.job.training.seq_len / cp
    t = 3.0 * gemm_time_s(ctx, 2.0 * tokens * h * vocab / tp, tokens, vocab / tp, h)
    t += 3.0 * tokens * vocab / tp * ctx.logit_bytes / ctx.hbm_bytes_per_s
    return t
