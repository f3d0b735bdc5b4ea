"""Exposed tensor-, context- and expert-parallel communication of one layer and micro-batch on one
GPU; each term depends only on its own axis's group."""

from __future__ import annotations

from typing import cast

from optimizer.cost.comm import hierarchical_allreduce_time_s
from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.dispatch import DEDUPLICATING_DISPATCHERS, dispatch_time_s
from optimizer.cost.expert_tp import etp_collectives_fwd_s
from optimizer.cost.layer_base import ACT_BYTES, ATTENTION_CORE_RECOMPUTED, Dims, attention_kv_width
from optimizer.cost.num import Num
from optimizer.cost.routing import routing_load
from optimizer.cost.topology import GroupGeometry
from optimizer.modes import RecomputeMode


def tp_comm_s(
    ctx: JobContext, kind: LayerKind, d: Dims, geo: GroupGeometry, wgrad_windows_s: tuple[float, ...] = ()
) -> float:
    """Exposed tensor-parallel collective time of one layer and micro-batch (forward, backward,
    recomputed forward): all-reduces, or reduce-scatter + all-gather with sequence parallelism,
    of each block's column-parallel input and row-parallel output (``tp_block_widths``).

    With ``training.tp_dgrad_overlap`` the backward's column-parallel collectives run under that
    linear's GEMMs (``dgrad_overlap_s``); ``wgrad_windows_s`` holds, per TP block (attention, then
    the dense MLP), the forward time of its column-parallel GEMM, which each backward GEMM repeats
    (a block without one hides nothing)."""
    if d.tp <= 1:
        return 0.0
    tokens = d.micro_batch_size * ctx.job.training.seq_len / d.cp
    sp = d.sequence_parallel
    # GEMM/collective overlap (userbuffers, async TP), when the stack does it: needs sequence
    # parallelism and the group inside one scale-up domain
    overlap = ctx.job.training.tp_comm_overlap and sp
    in_domain = len(geo.levels) == 1 and geo.outermost_tier == "nvlink"
    hidden = ctx.cal.tp_comm_overlap if overlap and in_domain else 0.0
    ef = exposed_fraction(ctx, hidden)
    dgrad = ctx.job.training.tp_dgrad_overlap
    # op recompute re-runs the forward all-gathers: backward needs no re-gather
    regather = sp and d.recompute != RecomputeMode.OP
    deferred = wgrad_deferred(ctx, d)
    windows = tuple(wgrad_windows_s) + (0.0,) * max(0, tp_blocks(kind) - len(wgrad_windows_s))
    total = 0.0
    times: dict[float, float] = {}  # all-reduce time by width (blocks mostly share one)
    for (col_width, row_width), window in zip(tp_block_widths(ctx, kind), windows, strict=False):
        for width in (col_width, row_width):
            if width not in times:
                times[width] = cast(float, hierarchical_allreduce_time_s(tokens * width * ACT_BYTES, geo.levels))
        col, row = times[col_width], times[row_width]
        # forward: all-gather of the column input + reduce-scatter of the row output (SP), or the
        # row output's all-reduce
        fwd = 0.5 * (col + row) if sp else row
        blocking = fwd + (fwd if d.recompute == RecomputeMode.FULL else 0.0)
        if d.recompute == RecomputeMode.OP:  # the collectives it does not save, re-run
            blocking += 0.5 * col if sp else row
        if not dgrad:  # backward: the row output's gradient gather and the input-gradient reduction
            total += (blocking + (0.5 * (row + col) if sp else col)) * ef
            continue
        blocking += 0.5 * row if sp else 0.0
        total += blocking * ef + dgrad_overlap_s(ctx, col, sp, window, regather, deferred, hidden)
    return total


def tp_block_widths(ctx: JobContext, kind: LayerKind) -> tuple[tuple[float, float], ...]:
    """Per TP block, the elements per token of its column-parallel input and of its row-parallel
    output: the hidden size, but for MLA's column side the latents the up-projections take
    (``q_lora_rank`` or the hidden size, ``kv_lora_rank`` and the shared rotary key: Megatron-Core
    gathers those, the down-projections run on every rank)."""
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    attention = (h, h)
    if model.mla is not None:
        mla = model.mla
        attention = (float(mla.q_lora_rank or h) + mla.kv_lora_rank + mla.qk_rope_head_dim, h)
    return (attention, (h, h)) if tp_blocks(kind) == 2 else (attention,)


def tp_blocks(kind: LayerKind) -> int:
    """Tensor-parallel blocks of a layer (each a column- then a row-parallel linear with their
    collectives): attention, and the dense MLP or an MoE layer's shared experts (Megatron-Core's
    ``SharedExpertMLP`` is a tensor-parallel MLP); routed experts are not tensor-split here."""
    return 2 if not kind.is_moe or kind.params.shared_experts else 1


def wgrad_deferred(ctx: JobContext, d: Dims) -> bool:
    """The stack defers weight-gradient GEMMs (Megatron ``--delay-wgrad-compute``, which the launch
    arguments add with the expert all-to-all overlap on MoE layouts with ``ep > 1``): the
    input-gradient collective then has no weight-gradient GEMM to run under."""
    return ctx.expert_overlap(d.ep)


def dgrad_overlap_s(
    ctx: JobContext,
    per_ar_s: float,
    sequence_parallel: bool,
    window_s: float,
    regather: bool = True,
    wgrad_deferred: bool = False,
    hidden: float = 0.0,
) -> float:
    """Critical-path time of one TP block's backward collectives that run under its column-parallel
    linear's GEMMs (``window_s``: that GEMM's forward time; the input-gradient and the
    weight-gradient GEMM each take as long). Without sequence parallelism: the input-gradient
    all-reduce under the weight-gradient GEMM. With it: the input's re-gather (``regather``;
    Megatron-Core keeps only the shard from forward) under the input-gradient GEMM and the
    input-gradient reduce-scatter under the weight-gradient GEMM, half an all-reduce each. With
    ``wgrad_deferred`` the weight-gradient GEMM runs later: nothing hides under it. Each collective
    costs what its window leaves exposed plus ``cal.overlap_contention`` of the hidden rest, or
    what GEMM/collective overlap (``hidden``: ``training.tp_comm_overlap``) leaves of it, the
    smaller."""
    kept = exposed_fraction(ctx, hidden)

    def part(t: float, window: float) -> float:
        return min(cast(float, contended(ctx, max(0.0, t - window), t)), t * kept)

    wgrad_window = 0.0 if wgrad_deferred else window_s
    if not sequence_parallel:
        return part(per_ar_s, wgrad_window)
    half = 0.5 * per_ar_s
    return part(half, wgrad_window) + (part(half, window_s) if regather else 0.0)


def exposed_fraction(ctx: JobContext, hidden: float) -> float:
    """Share of a collective's time on the critical path when ``hidden`` of it overlaps compute:
    the overlapped part still delays compute by ``cal.overlap_contention`` (SM and HBM share)."""
    return 1.0 - hidden * (1.0 - ctx.cal.overlap_contention)


def contended(ctx: JobContext, exposed: Num, total: Num) -> Num:
    """Critical-path time of ``total`` seconds of communication of which ``exposed`` is not
    hidden: the hidden rest still costs ``cal.overlap_contention`` of its time (numbers or arrays)."""
    c = ctx.cal.overlap_contention
    return (1.0 - c) * exposed + c * total


def cp_comm_s(ctx: JobContext, d: Dims, geo: GroupGeometry, t_core: float, t_core_bwd: float) -> float:
    """Exposed context-parallel K/V ring time of one layer and micro-batch: ``cp - 1`` steps at
    the slowest tier, forward once and backward twice, hidden behind the attention core
    (``t_core`` forward, ``t_core_bwd`` backward: ``attention_core_times_s``)."""
    if d.cp <= 1 or not geo.levels:
        return 0.0
    cal = ctx.cal
    s = ctx.job.training.seq_len
    chunk = d.micro_batch_size * (s / d.cp) * attention_kv_width(ctx, d.tp) * ACT_BYTES
    slowest = min(lv.beta_bytes_per_s for lv in geo.levels)
    alpha = max(lv.alpha_s for lv in geo.levels)
    ring = (d.cp - 1) * (alpha + chunk / slowest)
    # no ``overlap_contention``: a ring step is a point-to-point send/receive, which NCCL runs on
    # one or two channels per peer (a thread block each), not the 16-32 of a collective
    cp_fwd = max(0.0, ring - cal.cp_overlap * t_core)
    cp_bwd = max(0.0, 2 * ring - cal.cp_overlap * t_core_bwd)
    return cp_fwd + cp_bwd + (cp_fwd if d.recompute in ATTENTION_CORE_RECOMPUTED else 0.0)


DISPATCH_REPLAYED = frozenset({RecomputeMode.FULL, RecomputeMode.MOE})
"""Recompute modes that re-run an MoE layer's forward dispatch and combine in backward."""


def rank_tokens(ctx: JobContext, d: Dims) -> float:
    """Tokens of one micro-batch on one GPU: its sequence share over ``cp`` and, as each
    tensor-parallel rank routes its own shard to the experts, over ``tp``."""
    return d.micro_batch_size * ctx.job.training.seq_len / d.cp / d.tp


def ep_comm_s(
    ctx: JobContext,
    kind: LayerKind,
    d: Dims,
    geo: GroupGeometry,
    etp_geo: GroupGeometry | None = None,
    block: GroupGeometry | None = None,
) -> float:
    """Exposed expert-parallel dispatch and combine time of one MoE layer and micro-batch
    (``dispatch.dispatch_time_s`` for the job's ``training.moe_dispatcher``): forward dispatch and
    combine, their bf16 mirrors in backward, and forward again when the block is recomputed
    (``op`` saves the all-to-all outputs). Nothing of it overlaps the same micro-batch's compute
    (Megatron-Core's dispatchers make the compute stream wait for them); batch-level overlap
    (``training.ep_comm_overlap``) hides ``cal.ep_comm_overlap_batched`` of it.

    With expert tensor parallelism (``d.etp > 1``; ``etp_geo`` the expert-TP group, ``block`` the
    ``etp x ep`` one) the dispatchers run as ``expert_tp`` describes."""
    if not kind.is_moe or d.ep * d.etp <= 1:
        return 0.0
    cal = ctx.cal
    moe = ctx.job.model.moe
    assert moe is not None
    training = ctx.job.training
    h = float(ctx.job.model.hidden_size or 0)
    tok_gpu = rank_tokens(ctx, d)
    dispatcher = training.moe_dispatcher
    recomputed = d.recompute in DISPATCH_REPLAYED
    a2a_eff = cal.scale_out_all_to_all_efficiency
    etp_fwd = 0.0
    if d.etp > 1 and dispatcher != "alltoall":
        # one transfer over the etp x ep block (flex: every token to all etp shards)
        assert block is not None
        tokens = tok_gpu * d.etp if dispatcher in DEDUPLICATING_DISPATCHERS else tok_gpu
        disp, comb = dispatch_time_s(dispatcher, tokens, h, moe.top_k, block.levels, routing_load(ctx), a2a_eff)
    else:
        disp, comb = dispatch_time_s(dispatcher, tok_gpu, h, moe.top_k, geo.levels, routing_load(ctx), a2a_eff)
        if d.etp > 1:
            assert etp_geo is not None
            routed = tok_gpu * moe.top_k * routing_load(ctx)
            etp_fwd = etp_collectives_fwd_s(routed, h, d.etp, etp_geo.levels)
    # backward sends bf16 gradients both ways: two combine-sized transfers
    total = disp + 3 * comb + (disp + comb if recomputed else 0.0)
    if etp_fwd:
        total += 2 * etp_fwd + (etp_fwd if recomputed else 0.0)
    # the overlap runs only with expert parallelism (Megatron's launch asks for it at ep > 1 only)
    hidden = cal.ep_comm_overlap_batched if ctx.expert_overlap(d.ep) else 0.0
    return total * exposed_fraction(ctx, hidden)
