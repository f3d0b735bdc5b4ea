"""One pipeline stage's share of the step (``StageTerms``): compute, exposed TP / CP / EP
communication, exposed data-parallel time, optimizer step and memory, memoised per job; and the
LM head's time is in ``cost.head``. ``estimate`` composes the step from these, the search's split tables tabulate
them per layer count."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.deepep_buffers import dispatcher_buffer_bytes
from optimizer.cost.dp_comm import dp_exposed_s
from optimizer.cost.head import head_time_s
from optimizer.cost.layer import Dims, LayerCost, layer_cost
from optimizer.cost.layer_memo import kind_compute
from optimizer.cost.memory import (
    ADAM_STEP_BYTES,
    StageMemory,
    memory_signature,
    optimizer_shards,
    shard_group_sizes,
    stage_memory,
    static_memory_bytes,
    weight_bytes_per_param,
)
from optimizer.cost.num import Num, maximum, select
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.stage_layout import StageLayout
from optimizer.cost.topology import AxisGroups, GroupGeometry
from optimizer.cost.zero_buffers import zero_buffer_bytes


class SplitKey(NamedTuple):
    """A layer split: all ``split_kind_counts`` and ``estimate.distinct_stages`` read of a layout."""

    pp: int
    stage_layers: tuple[int, ...]


def split_key(lay: ResolvedLayout) -> SplitKey:
    return tuple.__new__(SplitKey, (lay.pp, lay.stage_layers))


SPLIT_KIND_COUNTS = Memo[SplitKey, list[tuple[int, ...]]]("split_kind_counts")


def split_kind_counts(ctx: JobContext, pp: int, stage_layers: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Layers of each kind on each of ``pp`` stages under the chunk split ``stage_layers`` (memoised)."""
    key = tuple.__new__(SplitKey, (pp, stage_layers))
    table = ctx.caches[SPLIT_KIND_COUNTS]
    cached = table.get(key)
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
        table[key] = cached
    return cached


@dataclass(frozen=True)
class StageTerms:
    """One pipeline stage's share of the step: everything ``estimate`` takes a max or sum over.
    Numbers for one layout; arrays (layouts x stages) in ``cost.columns``."""

    fwd_s: Num
    """Forward compute of one micro-batch (all its layers)."""
    bwd_s: Num
    compute_s: Num
    """Forward + backward compute of one micro-batch, LM head included on the last stage."""
    tp_s: Num
    cp_s: Num
    ep_s: Num
    dp_exposed_s: Num
    """Data-parallel communication this stage leaves exposed at the end of the step."""
    optimizer_s: Num
    memory: StageMemory

    @property
    def time_s(self) -> Num:
        """One micro-batch through the stage, forward and backward, with exposed TP/CP/EP."""
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s


class LayerKey(NamedTuple):
    """What a layer's cost (``layer.layer_cost``) reads of a layout and a rank order: the
    ``Dims`` fields and the TP / CP / EP group geometries."""

    tp: int
    cp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    tp_group: GroupGeometry
    cp_group: GroupGeometry
    ep_group: GroupGeometry
    etp: int
    etp_group: GroupGeometry
    tp_ep_group: GroupGeometry


def layer_key(dims: Dims, groups: AxisGroups) -> LayerKey:
    return tuple.__new__(LayerKey, (dims.tp, dims.cp, dims.ep, dims.micro_batch_size, dims.sequence_parallel,
                                    dims.recompute, groups.tp, groups.cp, groups.ep, dims.etp, groups.etp,
                                    groups.tp_ep))  # fmt: skip


def layout_layer_key(lay: ResolvedLayout, groups: AxisGroups) -> LayerKey:
    """``layer_key`` of the layout's ``Dims``."""
    return tuple.__new__(LayerKey, (lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel,
                                    lay.recompute, groups.tp, groups.cp, groups.ep, lay.etp, groups.etp,
                                    groups.tp_ep))  # fmt: skip


KIND_COSTS = Memo[LayerKey, list[LayerCost]]("kind_costs")


def kind_costs(ctx: JobContext, dims: Dims, groups: AxisGroups) -> list[LayerCost]:
    """``layer_cost`` of every layer kind of the job (memoised per ``layer_key``)."""
    key = layer_key(dims, groups)
    table = ctx.caches[KIND_COSTS]
    kind_cost = table.get(key)
    if kind_cost is None:
        kind_cost = table[key] = [layer_cost(ctx, k, dims, groups, kind_compute(ctx, i, dims))
                                  for i, k in enumerate(ctx.kinds)]  # fmt: skip
    return kind_cost


def layout_kind_costs(ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups) -> list[LayerCost]:
    """``kind_costs`` of the layout's ``Dims`` (made only when not cached yet)."""
    kind_cost = ctx.caches[KIND_COSTS].get(layout_layer_key(lay, groups))
    if kind_cost is None:
        kind_cost = kind_costs(ctx, lay.dims, groups)
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
    partial, stored, grads_bytes = stage_core_cached(ctx, lay, groups, kind_counts, stage == 0, stage == lay.pp - 1)
    return StageTerms(  # positional construction: dataclasses.replace is slow on this hot path
        partial.fwd_s,
        partial.bwd_s,
        partial.compute_s,
        partial.tp_s,
        partial.cp_s,
        partial.ep_s,
        partial.dp_exposed_s,
        partial.optimizer_s,
        stage_memory(ctx, lay, stage, partial.memory, stored, grads_bytes),
    )


def stage_memory_bytes(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, stage: int, kind_counts: tuple[int, ...]
) -> float:
    """``stage_terms(...).memory.total_bytes`` without the stage's exposed data-parallel time
    (memory does not depend on it): the layer-split fit limits probe many layer counts."""
    t, stored, grads_bytes, _ = stage_fixed_cached(ctx, lay, groups, kind_counts, stage == 0, stage == lay.pp - 1)
    # a number for one layout
    return cast(float, stage_memory(ctx, lay, stage, t.memory, stored, grads_bytes).total_bytes)


class StageCoreKey(NamedTuple):
    """What ``_stage_core`` reads: the layout but its interleaving depth (only the in-flight
    count, added in ``stage_memory``, reads it) and layer split (``kind_counts`` is the stage's
    share), the only geometries a stage's own terms depend on (the pipeline group's placement
    does not enter), and the stage's position and layers."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    num_micro_batches: int
    tp_group: GroupGeometry
    cp_group: GroupGeometry
    ep_group: GroupGeometry
    dp_cp_group: GroupGeometry
    edp_group: GroupGeometry
    first: bool
    last: bool
    kind_counts: tuple[int, ...]
    etp: int
    etp_group: GroupGeometry
    tp_ep_group: GroupGeometry


def stage_core_key(
    lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> StageCoreKey:
    return tuple.__new__(StageCoreKey, (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
                                        lay.recompute, lay.sequence_parallel, lay.num_micro_batches, groups.tp,
                                        groups.cp, groups.ep, groups.dp_cp, groups.edp, first, last,
                                        kind_counts, lay.etp, groups.etp, groups.tp_ep))  # fmt: skip


STAGE_CORE = Memo[StageCoreKey, tuple[StageTerms, Num, Num]]("stage_core")


def stage_core_cached(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, Num, Num]:
    """``_stage_core``, memoised per ``stage_core_key``."""
    key = stage_core_key(lay, groups, kind_counts, first, last)
    table = ctx.caches[STAGE_CORE]
    core = table.get(key)
    if core is None:
        core = table[key] = _stage_core(ctx, lay, groups, kind_counts, first, last)
    return core


def _stage_core(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, Num, Num]:
    """Everything of a stage but its in-flight activations: (terms with the stage's activations
    set to its one-micro-batch extras and buffers before fragmentation, stored activation bytes
    per micro-batch, gradient bytes).

    Only the exposed data-parallel time depends on the dp / edp groups; the rest is memoised
    without them, so rank orders that move only the data-parallel axes share it.
    """
    t, stored, grads_bytes, dp_inputs = stage_fixed_cached(ctx, lay, groups, kind_counts, first, last)
    dp_exposed = dp_exposed_s(ctx, lay, groups, *dp_inputs)
    terms = StageTerms(t.fwd_s, t.bwd_s, t.compute_s, t.tp_s, t.cp_s, t.ep_s, dp_exposed, t.optimizer_s, t.memory)
    return terms, stored, grads_bytes


class StageFixedKey(NamedTuple):
    """What ``_stage_fixed`` reads: ``StageCoreKey`` without the micro-batch count and the data-
    parallel groups (the in-flight activations are added in ``stage_memory``, the exposed
    data-parallel time in ``_stage_core``), but whether the dense data-parallel group has more
    than one rank (with the sizes, that completes ``memory_signature(groups)``)."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    tp_group: GroupGeometry
    cp_group: GroupGeometry
    ep_group: GroupGeometry
    dp_cp_grouped: bool
    first: bool
    last: bool
    kind_counts: tuple[int, ...]
    etp: int
    etp_group: GroupGeometry
    tp_ep_group: GroupGeometry


def stage_fixed_key(
    lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> StageFixedKey:
    return tuple.__new__(StageFixedKey, (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage,
                                         lay.recompute, lay.sequence_parallel, groups.tp, groups.cp, groups.ep,
                                         groups.dp_cp.size > 1, first, last, kind_counts, lay.etp, groups.etp,
                                         groups.tp_ep))  # fmt: skip


STAGE_FIXED = Memo[StageFixedKey, tuple[StageTerms, Num, Num, tuple[Num, Num, Num, Num, Num, Num, Num]]]("stage_fixed")


def stage_fixed_cached(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, Num, Num, tuple[Num, Num, Num, Num, Num, Num, Num]]:
    """``_stage_fixed``, memoised per ``stage_fixed_key``."""
    key = stage_fixed_key(lay, groups, kind_counts, first, last)
    table = ctx.caches[STAGE_FIXED]
    fixed = table.get(key)
    if fixed is None:
        fixed = table[key] = _stage_fixed(ctx, lay, groups, kind_counts, first, last)
    return fixed


def _stage_fixed(
    ctx: JobContext, lay: ResolvedLayout, groups: AxisGroups, kind_counts: tuple[int, ...], first: bool, last: bool
) -> tuple[StageTerms, Num, Num, tuple[Num, Num, Num, Num, Num, Num, Num]]:
    """``_stage_core`` without the data-parallel term (left at 0), plus that term's inputs."""
    head = head_time_s(ctx, lay) if last else 0.0
    return stage_fixed_terms(
        ctx, lay, sum(memory_signature(groups)), layout_kind_costs(ctx, lay, groups), kind_counts, first, last, head
    )


def stage_fixed_terms(
    ctx: JobContext,
    lay: StageLayout,
    n_groups: int,
    kind_cost: Sequence[LayerCost],
    kind_counts: Sequence[Num],
    first: bool | np.ndarray,
    last: bool | np.ndarray,
    head_s: Num,
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
    layer_params: list[Num] = [lc.dense_params + lc.expert_params for lc in kind_cost]
    max_layer_params = functools.reduce(maximum, layer_params)
    compute = fwd + bwd
    layer_dense = dense + 0.0  # a copy: the += below are in place on numpy arrays
    # first / last as factors (a stage-axis mask in cost.columns): adding 0.0 leaves a float as it is
    dense += first * (ctx.embedding_params / lay.tp)
    compute += last * head_s
    if ctx.lm_head_params:
        dense += last * (ctx.lm_head_params / lay.tp)
    else:  # tied embeddings: the last stage keeps its own copy unless it is also the first
        dense += (last * (1 - first)) * (ctx.embedding_params / lay.tp)
    expert_block = lay.ep * lay.etp  # ranks that split the experts (the expert-data-parallel group is the rest)
    dp_shard, ep_shard = shard_group_sizes(lay.dp, lay.cp, lay.tp, expert_block)
    opt_dense_shard, opt_expert_shard = optimizer_shards(lay.zero_stage, lay.dp, lay.cp, lay.tp, expert_block)

    # ---- optimizer step (memory-bound Adam on the local shard) ----------------------------------
    opt_params = dense / opt_dense_shard + expert / opt_expert_shard
    t_opt = opt_params * ADAM_STEP_BYTES / ctx.hbm_bytes_per_s

    # ---- memory -----------------------------------------------------------------------------
    w_bytes = weight_bytes_per_param(ctx)
    weights_bytes, grads_bytes, optim_bytes = static_memory_bytes(ctx, lay.zero_stage, dense, expert, dp_shard, ep_shard,
                                                                  opt_dense_shard, opt_expert_shard)  # fmt: skip
    acts = working  # plus the in-flight micro-batches' stored activations (added per stage)
    tokens = lay.micro_batch_size * ctx.job.training.seq_len / lay.cp
    acts += last * (tokens * float(ctx.job.model.vocab_size or 0) / lay.tp * ctx.loss_bytes_per_logit(lay.tp))
    buffers: Num = cal.cuda_context_bytes + n_groups * cal.nccl_buffer_bytes_per_group
    buffers += dispatcher_buffer_bytes(ctx, lay.ep * lay.etp)
    head = last * ((ctx.lm_head_params or ctx.embedding_params) / lay.tp)
    buffers += zero_buffer_bytes(ctx, lay.zero_stage, lay.dp * lay.cp > 1, (dense, expert, max_layer_params),
                                 dense - layer_dense, (dp_shard, ep_shard), w_bytes, head)  # fmt: skip
    memory = StageMemory(weights_bytes, grads_bytes, optim_bytes, acts, buffers)
    terms = StageTerms(fwd, bwd, compute, tp_s, cp_s, ep_s, 0.0, t_opt, memory)
    return terms, stored, grads_bytes, (dense, expert, n_layers, max_layer_params, compute, fwd, bwd)
