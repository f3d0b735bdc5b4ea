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
from optimizer.cost.topology import AxisGroups, axis_groups

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
    ctx: JobContext, lay: ResolvedLayout, order: tuple[str, ...], headroom_bytes: float | None = None
) -> Estimate:
    cal = ctx.cal
    model = ctx.job.model
    sizes = lay.sizes()
    groups = axis_groups(ctx.topology, order, sizes)
    dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    kind_cost: list[LayerCost] = [layer_cost(ctx, k, dims, groups) for k in ctx.kinds]
    h = float(model.hidden_size or 0)
    vocab = float(model.vocab_size or 0)
    seq = ctx.job.training.seq_len
    tokens = lay.micro_batch_size * seq / lay.cp
    last_chunk = len(lay.stage_layers) - 1
    # LM head + loss on the last stage: three GEMM passes and the cross-entropy (memory-bound).
    head_flops = 2.0 * tokens * h * vocab / lay.tp
    t_head = 3.0 * gemm_time_s(ctx, head_flops, tokens, vocab / lay.tp, h)
    t_head += 3.0 * tokens * vocab / lay.tp * LOGIT_BYTES / (ctx.gpu.hbm_bandwidth_bytes_per_s.value * cal.hbm_efficiency)

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
    max_layer_params = 0.0
    for st, chunks in enumerate(stage_chunks):
        for first, count in chunks:
            for li in range(first, first + count):
                lc = kind_cost[ctx.layer_kind[li]]
                fwd_only[st] += lc.fwd_s
                bwd_only[st] += lc.bwd_s
                tp_c[st] += lc.tp_s
                cp_c[st] += lc.cp_s
                ep_c[st] += lc.ep_s
                stored[st] += lc.stored_act_bytes
                working[st] = max(working[st], lc.working_act_bytes)
                dense_p[st] += lc.dense_params
                expert_p[st] += lc.expert_params
                max_layer_params = max(max_layer_params, lc.dense_params + lc.expert_params)
        compute[st] = fwd_only[st] + bwd_only[st]
    dense_p[0] += ctx.embedding_params / lay.tp
    last_stage = last_chunk % lay.pp
    compute[last_stage] += t_head
    if ctx.lm_head_params or (lay.pp > 1):
        dense_p[last_stage] += (ctx.lm_head_params or ctx.embedding_params) / lay.tp if (
            ctx.lm_head_params or last_stage != 0
        ) else 0.0
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
            per_mb = 2 * hierarchical_allgather_time_s(g_dense, groups.dp_cp.levels)
            per_mb += hierarchical_reduce_scatter_time_s(g_dense, groups.dp_cp.levels)
            per_mb += 2 * hierarchical_allgather_time_s(g_exp, groups.edp.levels)
            per_mb += hierarchical_reduce_scatter_time_s(g_exp, groups.edp.levels)
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
            buffers += 2 * max_layer_params * WEIGHT_BYTES * (lay.dp * lay.cp) / dp_shard  # gathered layers
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
        capacity_bytes=ctx.gpu.memory_usable_bytes.value,
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
