"""The cost model: step time, memory and MFU of one resolved layout on one rank order.

``estimate`` is the single source of truth: ``/evaluate``, ``/plan``, the CLI, the search tables
and the validation benchmark all call it. Step time is composed as

    step = m * t_stage_max                      (steady 1F1B / interleaved pipeline)
         + (pp - 1) / vpp * t_stage_max         (pipeline bubble)
         + exposed pipeline send/recv
         + exposed data-parallel collectives    (bucketed, overlapped with backward / forward)
         + optimizer step                       (memory-bound Adam on the local shard)

where ``t_stage`` is one micro-batch's forward + backward through a stage: compute plus the
exposed TP, CP and EP communication of its layers (``layer.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimizer.cost.comm import (
    hierarchical_allgather_time_s,
    hierarchical_allreduce_time_s,
    hierarchical_reduce_scatter_time_s,
    p2p_time_s,
)
from optimizer.cost.context import JobContext
from optimizer.cost.layer import ACT_BYTES, Dims, LayerCost, gemm_time_s, layer_cost
from optimizer.cost.pipeline import in_flight_microbatches
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import AxisGroups, axis_groups, group_geometry

WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES = 2.0  # bf16 gradients (reduced in bf16)
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam first and second moments
FP8_COPY_BYTES = 1.0  # transposed/quantised FP8 weight copies kept by FP8 training
ADAM_STEP_BYTES = 32.0  # HBM traffic per parameter of one Adam step (read p, m, v, g; write p, m, v, bf16 p)
LOGIT_BYTES = 6.0  # bf16 logits + fp32 softmax/gradient buffer per vocabulary entry


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
    def fits_memory(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes - self.headroom_bytes


def _stage_layers(lay: ResolvedLayout) -> list[list[tuple[int, int]]]:
    """For each stage, the (first layer, layer count) of each chunk it holds."""
    stages: list[list[tuple[int, int]]] = [[] for _ in range(lay.pp)]
    start = 0
    for c, count in enumerate(lay.stage_layers):
        stages[c % lay.pp].append((start, count))
        start += count
    return stages


def estimate(
    ctx: JobContext,
    lay: ResolvedLayout,
    order: tuple[str, ...],
    headroom_bytes: float | None = None,
    groups: AxisGroups | None = None,
) -> Estimate:
    cal = ctx.cal
    model = ctx.job.model
    if groups is None:
        groups = axis_groups(ctx.topology, order, lay.sizes())
    dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    key = (dims, groups.tp, groups.cp, groups.ep)
    kind_cost: list[LayerCost] | None = ctx.memo.get(key)
    if kind_cost is None:
        kind_cost = [layer_cost(ctx, k, dims, groups) for k in ctx.kinds]
        ctx.memo[key] = kind_cost
    h = float(model.hidden_size or 0)
    vocab = float(model.vocab_size or 0)
    seq = ctx.job.training.seq_len
    tokens = lay.micro_batch_size * seq / lay.cp
    last_chunk = len(lay.stage_layers) - 1
    # LM head + loss on the last stage: three GEMM passes and the cross-entropy (memory-bound).
    t_head = _head_time(ctx, lay)

    stage_chunks = _stage_layers(lay)
    n_stages = lay.pp
    compute = [0.0] * n_stages
    fwd_only = [0.0] * n_stages
    bwd_only = [0.0] * n_stages
    tp_c = [0.0] * n_stages
    cp_c = [0.0] * n_stages
    ep_c = [0.0] * n_stages
    stored = [0.0] * n_stages
    working = [0.0] * n_stages
    dense_p = [0.0] * n_stages
    expert_p = [0.0] * n_stages
    max_layer_params = max(lc.dense_params + lc.expert_params for lc in kind_cost)
    prefix = ctx.kind_prefix
    for st, chunks in enumerate(stage_chunks):
        for first, count in chunks:
            for k, lc in enumerate(kind_cost):
                n_k = prefix[k][first + count] - prefix[k][first]
                if n_k == 0:
                    continue
                fwd_only[st] += n_k * lc.fwd_s
                bwd_only[st] += n_k * lc.bwd_s
                tp_c[st] += n_k * lc.tp_s
                cp_c[st] += n_k * lc.cp_s
                ep_c[st] += n_k * lc.ep_s
                stored[st] += n_k * lc.stored_act_bytes
                working[st] = max(working[st], lc.working_act_bytes)
                dense_p[st] += n_k * lc.dense_params
                expert_p[st] += n_k * lc.expert_params
        compute[st] = fwd_only[st] + bwd_only[st]
    dense_p[0] += ctx.embedding_params / lay.tp
    last_stage = last_chunk % lay.pp
    compute[last_stage] += t_head
    if ctx.lm_head_params:
        dense_p[last_stage] += ctx.lm_head_params / lay.tp
    elif last_stage != 0:  # tied embeddings: the last stage keeps its own copy
        dense_p[last_stage] += ctx.embedding_params / lay.tp
    stage_time = [compute[i] + tp_c[i] + cp_c[i] + ep_c[i] for i in range(n_stages)]
    slow = max(range(n_stages), key=lambda i: stage_time[i])
    t_max = stage_time[slow]
    m = lay.num_micro_batches

    # ---- pipeline send/recv ----------------------------------------------------------------
    pp_comm = 0.0
    if lay.pp > 1 and groups.pp.levels:
        msg = tokens * h * ACT_BYTES / (lay.tp if lay.sequence_parallel else 1)
        outer = groups.pp.levels[-1]
        t_p2p = p2p_time_s(msg, outer.beta_bytes_per_s, outer.alpha_s)
        pp_comm = cal.pp_comm_exposed * m * 2 * lay.vpp * t_p2p + 2 * (lay.pp - 1) * t_p2p
    bubble = (lay.pp - 1) / lay.vpp * t_max

    # ---- data-parallel collectives (worst stage) ----------------------------------------------
    dp_shard = lay.dp * lay.cp
    ep_shard = lay.tp * lay.dp * lay.cp // lay.ep
    dp_exposed = 0.0
    for st in range(n_stages):
        g_dense = dense_p[st] * GRAD_BYTES
        g_exp = expert_p[st] * GRAD_BYTES
        if lay.zero_stage == 3:
            # FSDP: per layer and micro-batch, gather weights for forward and for backward and
            # reduce-scatter gradients; each collective pays its own latency.
            n_layers = max(1, sum(cnt for _, cnt in stage_chunks[st]))
            per_mb = n_layers * (
                3 * hierarchical_allgather_time_s(g_dense / n_layers, groups.dp_cp.levels)
                + 3 * hierarchical_allgather_time_s(g_exp / n_layers, groups.edp.levels)
            )
            first_gather = hierarchical_allgather_time_s(max_layer_params * WEIGHT_BYTES, groups.dp_cp.levels)
            exposed = max(first_gather, m * per_mb - cal.dp_overlap * m * compute[st])
        else:
            bucket_d = min(cal.dp_bucket_bytes, g_dense)
            if lay.zero_stage == 0:
                t_b = hierarchical_allreduce_time_s(g_dense, groups.dp_cp.levels)
                t_b += hierarchical_allreduce_time_s(g_exp, groups.edp.levels)
                last_b = hierarchical_allreduce_time_s(bucket_d, groups.dp_cp.levels)
                t_f = last_f = 0.0
            else:
                t_b = hierarchical_reduce_scatter_time_s(g_dense, groups.dp_cp.levels)
                t_b += hierarchical_reduce_scatter_time_s(g_exp, groups.edp.levels)
                last_b = hierarchical_reduce_scatter_time_s(bucket_d, groups.dp_cp.levels)
                t_f, last_f = t_b, last_b  # parameter all-gather mirrors the gradient reduce-scatter
            window_b = cal.dp_overlap * bwd_only[st]
            window_f = cal.dp_overlap * fwd_only[st]
            exposed = max(last_b, t_b - window_b) if t_b > 0 else 0.0
            if t_f > 0:
                exposed += max(last_f, t_f - window_f)
        dp_exposed = max(dp_exposed, exposed)

    # ---- optimizer step -----------------------------------------------------------------------
    opt_params = max(
        dense_p[st] / (dp_shard if lay.zero_stage >= 1 else 1) + expert_p[st] / (ep_shard if lay.zero_stage >= 1 else 1)
        for st in range(n_stages)
    )
    t_opt = opt_params * ADAM_STEP_BYTES / (ctx.gpu.hbm_bandwidth_bytes_per_s.value * cal.hbm_efficiency)

    breakdown = {
        "compute": m * compute[slow],
        "tp_comm": m * tp_c[slow],
        "cp_comm": m * cp_c[slow],
        "ep_comm": m * ep_c[slow],
        "pp_comm": pp_comm,
        "pp_bubble": bubble,
        "dp_comm": dp_exposed,
        "optimizer": t_opt,
    }
    step = sum(breakdown.values())

    # ---- memory per stage ---------------------------------------------------------------------
    fp8 = ctx.job.training.precision == "fp8"
    n_groups = sum(1 for g in (groups.tp, groups.cp, groups.ep, groups.dp_cp, groups.pp) if g.size > 1)
    memory = []
    for st in range(n_stages):
        d, e = dense_p[st], expert_p[st]
        w_d = d / dp_shard if lay.zero_stage == 3 else d
        w_e = e / ep_shard if lay.zero_stage == 3 else e
        weights = (w_d + w_e) * (WEIGHT_BYTES + (FP8_COPY_BYTES if fp8 else 0.0))
        g_d = d / dp_shard if lay.zero_stage >= 2 else d
        g_e = e / ep_shard if lay.zero_stage >= 2 else e
        grads = (g_d + g_e) * GRAD_BYTES
        o_d = d / dp_shard if lay.zero_stage >= 1 else d
        o_e = e / ep_shard if lay.zero_stage >= 1 else e
        optim = (o_d + o_e) * OPTIMIZER_BYTES
        inflight = in_flight_microbatches(st, lay.pp, lay.vpp, m)
        acts = inflight * stored[st] + working[st]
        if st == last_stage:
            acts += tokens * vocab / lay.tp * LOGIT_BYTES
        buffers = cal.cuda_context_bytes + n_groups * cal.nccl_buffer_bytes_per_group
        if lay.zero_stage == 3:
            # two layers gathered at a time (current + prefetch); their non-local part
            share_d = d / (d + e) if d + e > 0 else 1.0
            gathered = min(2 * max_layer_params, d + e) * (
                share_d * (1.0 - 1.0 / dp_shard) + (1.0 - share_d) * (1.0 - 1.0 / ep_shard)
            )
            buffers += gathered * (WEIGHT_BYTES + (FP8_COPY_BYTES if fp8 else 0.0))
        elif lay.dp * lay.cp > 1:
            buffers += 2 * min(cal.dp_bucket_bytes, (d + e) * GRAD_BYTES)
        buffers += cal.fragmentation * (acts + grads)
        memory.append(StageMemory(weights, grads, optim, acts, buffers))
    peak_stage = max(range(n_stages), key=lambda i: memory[i].total_bytes)

    tokens_step = float((ctx.job.training.global_batch_size or 0) * seq)
    model_flops = ctx.flops.model_per_token * tokens_step
    extra = 0.0
    if lay.recompute == "full":
        extra = ctx.flops.forward_layers_per_token
    elif lay.recompute == "selective":
        extra = ctx.flops.attn_core_forward_per_token
    hw_flops = model_flops + extra * tokens_step
    denom = step * ctx.num_gpus * ctx.mfu_peak_flops
    bottleneck = max(breakdown, key=lambda k: breakdown[k])
    if headroom_bytes is None:
        headroom_bytes = cal.memory_headroom_bytes
    return Estimate(
        layout=lay,
        order=order,
        placement=groups.placement(),
        step_time_s=step,
        breakdown_s=breakdown,
        memory=tuple(memory),
        peak_stage=peak_stage,
        capacity_bytes=ctx.capacity_bytes,
        headroom_bytes=headroom_bytes,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops,
        mfu=model_flops / denom,
        hfu=hw_flops / denom,
        tokens_per_step=tokens_step,
        bottleneck=bottleneck,
        notes=ctx.topology.notes,
    )


def groups_for(ctx: JobContext, lay: ResolvedLayout, order: tuple[str, ...]) -> AxisGroups:
    return axis_groups(ctx.topology, order, lay.sizes())


def compute_lower_bound_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """A lower bound on ``estimate(...).step_time_s`` for every rank order and layer split.

    The slowest stage is at least the average stage, so ``m * avg + (pp-1)/vpp * avg`` bounds the
    steady pipeline plus bubble; every other term is non-negative. Uses the same per-layer costs.
    """
    key = ("lb", lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    per_layer_total = ctx.memo.get(key)
    if per_layer_total is None:
        # Every axis at stride 1: the most local group it can have in any rank order, so the
        # fastest TP/CP/EP communication any placement can give.
        topo = ctx.topology
        local = {a: group_geometry(topo, 1, n) for a, n in (("tp", lay.tp), ("cp", lay.cp), ("ep", lay.ep))}
        one = group_geometry(topo, 1, 1)
        groups = AxisGroups(("tp", "cp", "dp", "pp"), local["tp"], local["cp"], one, one, local["ep"], one, one)
        dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
        costs = [layer_cost(ctx, k, dims, groups) for k in ctx.kinds]
        per_layer_total = sum(
            ctx.kind_prefix[k][-1] * (c.fwd_s + c.bwd_s + c.tp_s + c.cp_s + c.ep_s) for k, c in enumerate(costs)
        )
        ctx.memo[key] = per_layer_total
    avg = per_layer_total / lay.pp
    return lay.num_micro_batches * avg + (lay.pp - 1) / lay.vpp * avg


@dataclass(frozen=True)
class SplitTables:
    """Linear per-layer coefficients of one layout, for choosing a (non-uniform) layer split.

    Derived from the same per-layer costs as ``estimate`` (averaged over layer kinds); constants
    are read off the uniform-split estimate so that the tables reproduce it exactly.
    """

    layer_time_s: float
    """Per layer, one micro-batch forward + backward, with its exposed TP/CP/EP communication."""
    layer_static_bytes: float
    """Per layer: weights + gradients + optimizer state after sharding."""
    layer_act_bytes: float
    """Per layer, one micro-batch: stored activations (incl. allocator fragmentation)."""
    stage_const_time_s: tuple[float, ...]
    stage_const_bytes: tuple[float, ...]
    in_flight: tuple[float, ...]
    steady_coefficient: float
    """Step time = steady_coefficient * slowest stage time + other_time_s."""
    other_time_s: float


def split_tables(ctx: JobContext, est: Estimate) -> SplitTables:
    lay = est.layout
    groups = axis_groups(ctx.topology, est.order, lay.sizes())
    dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    costs = [layer_cost(ctx, k, dims, groups) for k in ctx.kinds]
    counts = [ctx.kind_prefix[k][-1] for k in range(len(ctx.kinds))]
    total_layers = sum(counts)

    def avg(f) -> float:  # noqa: ANN001
        return sum(n * f(c) for n, c in zip(counts, costs, strict=True)) / total_layers

    t_layer = avg(lambda c: c.fwd_s + c.bwd_s + c.tp_s + c.cp_s + c.ep_s)
    params = avg(lambda c: c.dense_params + c.expert_params)
    static_per_param = 0.0
    mem0 = est.memory[0]  # stage 0 holds whole layers plus the embedding
    stage_layers = _stage_layers(lay)
    layers_per_stage = [sum(cnt for _, cnt in chunks) for chunks in stage_layers]
    # bytes per parameter after ZeRO sharding, read off the uniform estimate's stage 0
    p0 = layers_per_stage[0] * params + ctx.embedding_params / lay.tp
    if p0 > 0:
        static_per_param = (mem0.weights_bytes + mem0.gradients_bytes + mem0.optimizer_bytes) / p0
    static_layer = static_per_param * params
    act_layer = avg(lambda c: c.stored_act_bytes) * (1.0 + ctx.cal.fragmentation)
    m = lay.num_micro_batches
    in_flight = tuple(in_flight_microbatches(s, lay.pp, lay.vpp, m) for s in range(lay.pp))
    const_b = tuple(
        est.memory[s].total_bytes - layers_per_stage[s] * (static_layer + in_flight[s] * act_layer)
        for s in range(lay.pp)
    )
    last = (len(lay.stage_layers) - 1) % lay.pp
    const_t = tuple(_head_time(ctx, lay) if s == last else 0.0 for s in range(lay.pp))
    slow_stage_time = (
        est.breakdown_s["compute"] + est.breakdown_s["tp_comm"] + est.breakdown_s["cp_comm"] + est.breakdown_s["ep_comm"]
    ) / m
    coef = m + (lay.pp - 1) / lay.vpp
    other = est.step_time_s - coef * slow_stage_time
    return SplitTables(t_layer, static_layer, act_layer, const_t, const_b, in_flight, coef, other)


def _head_time(ctx: JobContext, lay: ResolvedLayout) -> float:
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    vocab = float(model.vocab_size or 0)
    tokens = lay.micro_batch_size * ctx.job.training.seq_len / lay.cp
    t = 3.0 * gemm_time_s(ctx, 2.0 * tokens * h * vocab / lay.tp, tokens, vocab / lay.tp, h)
    t += 3.0 * tokens * vocab / lay.tp * LOGIT_BYTES / (ctx.gpu.hbm_bandwidth_bytes_per_s.value * ctx.cal.hbm_efficiency)
    return t
