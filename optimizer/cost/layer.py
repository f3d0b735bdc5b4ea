"""Per-layer, per-micro-batch cost on one GPU: compute, exposed communication, memory.

All quantities are for one micro-batch of ``b`` sequences passing through one layer on one GPU,
after the TP / CP / EP splits. ``T = b * s / cp`` is the number of tokens a tensor-parallel rank
feeds its GEMMs (sequence parallelism gathers the ``T / tp`` shard before each GEMM).
"""

from __future__ import annotations

from typing import NamedTuple

from optimizer.cost.attention import (
    UNFUSED_SCORE_BYTES_BWD,
    UNFUSED_SCORE_BYTES_FWD,
    UNFUSED_SCORE_BYTES_STORED,
    attention_core_time_s,
    attention_core_times_s,
)
from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.flops import MEGATRON_SELECTIVE
from optimizer.cost.grouped_gemm import expert_gemm_host_s, grouped_gemm_gpu_s
from optimizer.cost.layer_activations import activation_bytes
from optimizer.cost.layer_base import ACT_BYTES, ATTENTION_CORE_RECOMPUTED, Dims, LayerCost, gemm_time_s
from optimizer.cost.layer_comm import (
    contended,
    cp_comm_s,
    ep_comm_s,
    exposed_fraction,
    rank_tokens,
    tp_blocks,
    tp_comm_s,
)
from optimizer.cost.routing import router_bytes_fwd, routing_load
from optimizer.cost.topology import AxisGroups
from optimizer.modes import RecomputeMode, is_low_bit

__all__ = [
    "ACT_BYTES",
    "ATTENTION_CORE_RECOMPUTED",
    "MLA_UP_RECOMPUTED",
    "PERMUTE_BYTES",
    "RESIDUAL_STREAM_BYTES",
    "UNFUSED_SCORE_BYTES_BWD",
    "UNFUSED_SCORE_BYTES_FWD",
    "UNFUSED_SCORE_BYTES_STORED",
    "Dims",
    "LayerCost",
    "attention_core_time_s",
    "attention_core_times_s",
    "contended",
    "cp_comm_s",
    "elementwise_bytes_fwd",
    "ep_comm_s",
    "expert_gemm_times_s",
    "exposed_fraction",
    "gemm_time_s",
    "LayerCompute",
    "layer_compute",
    "layer_cost",
    "routed_tokens_per_gpu",
    "tp_comm_s",
]
"""The per-layer cost's names, wherever they are defined (``layer_base``, ``attention``,
``layer_comm``, ``layer_activations``), importable from here."""


PERMUTE_BYTES = 8.0
"""HBM bytes per routed token copy per hidden unit in an MoE layer's forward (bf16): the
permutation gathers each token's ``top_k`` copies into expert order (read and write each copy)
and the unpermutation reads the expert outputs back and accumulates them, weighted, into the
token's output. A middle value: fused kernels (Transformer Engine) move about ``4 + 4 / top_k``
bytes per copy, unfused index_select / multiply / scatter_add chains 12-14. Backward moves the
same bytes the other way (a scatter and a gather)."""


MLA_UP_RECOMPUTED = frozenset({RecomputeMode.SELECTIVE, RecomputeMode.MOE, MEGATRON_SELECTIVE})
"""Recompute modes that, on MLA models, keep the compressed query / key-value latents instead of
the per-head q, k, v and re-run the up-projections in backward (DeepSeek-V3 report section 3.2.3;
Megatron-Core's ``mla_up_proj`` recompute module). ``full`` re-runs them with the whole layer."""


def expert_gemm_times_s(ctx: JobContext, kind: LayerKind, d: Dims) -> tuple[float, float]:
    """(GPU time, host issue time) of one MoE layer's routed-expert GEMMs on one GPU per
    micro-batch, forward (fc1 and fc2 of each local expert; backward is twice each).

    The GPU time is the grouped GEMM at its tokens per expert and shape
    (``grouped_gemm.grouped_gemm_gpu_s``; with expert tensor parallelism ``d.etp`` times the
    rows and ``1/etp`` of each expert's width, the FLOPs unchanged). The host's: the per-expert split sizes come from the
    router on the device, so the host waits for them (a device-to-host sync) and then issues each
    expert's GEMMs in turn, ``cal.expert_gemm_host_s`` each, with the GPU idle until it catches up
    (0 when ``training.expert_gemm_host_splits`` is false: the stack keeps the host out of the
    loop). The layer takes the larger of the two (``layer_cost``)."""
    moe = ctx.job.model.moe
    assert moe is not None and kind.is_moe
    h = float(ctx.job.model.hidden_size or 0)
    each = kind.params.routed_expert_each
    routed = routed_tokens_per_gpu(ctx, d)
    local_experts = moe.num_experts / d.ep
    # expert TP: each rank runs its 1/etp slice of every local expert on the etp ranks' tokens
    # (same FLOPs, etp x the rows, 1/etp the width)
    rows = routed * d.etp
    gpu = grouped_gemm_gpu_s(ctx, 2 * routed * each, rows / local_experts, h, each / (2 * h * d.etp))
    return gpu, expert_gemm_host_s(ctx, local_experts)


RESIDUAL_STREAM_BYTES = 22.0
"""Of ``cal.elementwise_bytes_per_token_hidden``, the forward HBM bytes per token per hidden unit of
the kernels on the residual stream, which every tensor-parallel rank repeats on the full hidden
state unless sequence parallelism splits it: two norms (read and write 2 B each: 8) and two fused
bias-dropout-add kernels (read the input and the residual, write the sum: 6, and a 1-byte dropout
mask: 14). The rest (rotary, bias and scaling on q, k, v and the MLP's inputs) works on tensors
already split over TP. Korthikanti et al. 2022, Table 4: sequence parallelism alone saves 0.5 ms
of 7.7 ms in the forward of one 22B layer at TP8 (micro-batch 4, 2,048 tokens), which is 7/8 of
21 bytes per token and hidden unit at the A100's achievable HBM bandwidth."""


def elementwise_bytes_fwd(ctx: JobContext, tokens: float, tp: int, sp_div: int, ffn_active: float) -> float:
    """Forward HBM bytes of one layer's memory-bound kernels on one GPU (bf16, fused; before FP8
    casts): the residual-stream share split by sequence parallelism only (``sp_div``), the rest
    and the FFN activation by TP."""
    cal = ctx.cal
    h = float(ctx.job.model.hidden_size or 0)
    residual = min(RESIDUAL_STREAM_BYTES, cal.elementwise_bytes_per_token_hidden)
    split = cal.elementwise_bytes_per_token_hidden - residual
    return tokens * (residual * h / sp_div + (split * h + cal.elementwise_bytes_per_token_ffn * ffn_active) / tp)


def routed_tokens_per_gpu(ctx: JobContext, d: Dims) -> float:
    """Routed token copies an MoE layer's experts on one GPU process per micro-batch (experts are
    not tensor-split: each TP rank routes its own sequence shard)."""
    moe = ctx.job.model.moe
    assert moe is not None
    return rank_tokens(ctx, d) * moe.top_k * routing_load(ctx)


class LayerCompute(NamedTuple):
    """``layer_cost`` without its communication: what it computes from the layout's ``Dims`` alone
    (every rank order of a layout shares it; the search's bounds use it with communication floors)."""

    fwd_s: float
    bwd_s: float
    """Backward compute, including recomputed forward work."""
    t_core_s: float
    """Of ``fwd_s``, the attention core (context parallelism's ring overlaps it)."""
    t_core_bwd_s: float
    """The attention core's backward."""
    stored_act_bytes: float
    working_act_bytes: float
    dense_params: float
    expert_params: float
    tp_wgrad_windows_s: tuple[float, ...]
    """Per TP block, the column-parallel GEMM's forward time (``tp_wgrad_windows_s``)."""


def layer_cost(
    ctx: JobContext, kind: LayerKind, d: Dims, groups: AxisGroups, compute: LayerCompute | None = None
) -> LayerCost:
    """One layer's cost on one GPU per micro-batch: ``layer_compute`` (or ``compute``, the same
    already made) with the exposed TP, CP and EP communication in ``groups``."""
    c = layer_compute(ctx, kind, d) if compute is None else compute
    tp_s = tp_comm_s(ctx, kind, d, groups.tp, c.tp_wgrad_windows_s)
    cp_s = cp_comm_s(ctx, d, groups.cp, c.t_core_s, c.t_core_bwd_s)
    ep_s = ep_comm_s(ctx, kind, d, groups.ep, groups.etp, groups.tp_ep)
    return LayerCost(c.fwd_s, c.bwd_s, tp_s, cp_s, ep_s, c.stored_act_bytes, c.working_act_bytes, c.dense_params,
                     c.expert_params, c.tp_wgrad_windows_s)  # fmt: skip


def layer_compute(ctx: JobContext, kind: LayerKind, d: Dims) -> LayerCompute:
    """Compute, activation memory and parameters of one layer on one GPU per micro-batch."""
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    s = ctx.job.training.seq_len
    p = kind.params
    tp, cp, ep, b = d.tp, d.cp, d.ep, d.micro_batch_size
    tokens = b * s / cp  # tokens per GEMM on a TP rank
    t_attn_gemm, t_core, t_core_bwd, t_mlp, t_elem, t_perm, t_shared = _forward_times(ctx, kind, d, tokens)
    fwd = t_attn_gemm + t_core + t_mlp + t_elem + t_perm
    bwd = 2.0 * (t_attn_gemm + t_mlp + t_elem) + t_core_bwd + t_perm
    mla_up_kept = model.mla is None or d.recompute not in MLA_UP_RECOMPUTED
    if not mla_up_kept:
        assert model.mla is not None
        q_up, kv_up = ctx.mla_up_params
        heads_local = float(model.num_attention_heads or 0) / tp
        q_in = float(model.mla.q_lora_rank or h)  # the query latent, or the hidden state
        bwd += gemm_time_s(ctx, 2 * tokens * q_up / tp, tokens, heads_local * ctx.d_qk, q_in)
        kv_rank = float(model.mla.kv_lora_rank)
        bwd += gemm_time_s(
            ctx, 2 * tokens * kv_up / tp, tokens, heads_local * (model.mla.qk_nope_head_dim + ctx.d_v), kv_rank
        )
    moe_block = d.recompute == RecomputeMode.MOE and kind.is_moe  # the MoE block is re-run in backward
    if d.recompute == RecomputeMode.FULL:
        bwd += fwd
    elif d.recompute in (RecomputeMode.SELECTIVE, RecomputeMode.MOE):
        bwd += t_core + t_elem + (t_mlp + t_perm if moe_block else 0.0)
    elif d.recompute == MEGATRON_SELECTIVE:
        bwd += t_core  # the norms and activation functions are not re-run
    elif d.recompute == RecomputeMode.OP:
        # torchtitan's op-level policy: every second matmul's output is recomputed (half the
        # forward GEMM time), the attention core's is kept
        bwd += 0.5 * (t_attn_gemm + t_mlp) + t_elem + t_perm  # gathers and scatters are not saved
    windows = tp_wgrad_windows_s(ctx, kind, t_attn_gemm, t_shared if kind.is_moe else t_mlp)
    stored, working = activation_bytes(ctx, kind, d, tokens, mla_up_kept, moe_block)
    dense, expert = p.on_rank(tp, ep * d.etp)  # parameters on this GPU
    return LayerCompute(fwd, bwd, t_core, t_core_bwd, stored, working, dense, expert, windows)


def tp_wgrad_windows_s(ctx: JobContext, kind: LayerKind, t_attn_gemm: float, t_mlp: float) -> tuple[float, ...]:
    """Per TP block (attention, then the dense MLP or an MoE layer's shared experts, whose GEMM time
    is ``t_mlp``), the forward time of its column-parallel GEMM: the window
    ``layer_comm.tp_comm_s`` hides backward collectives in. Each is the block's GEMM time times the
    column-parallel linear's share of the block's parameters: q, k and v of the projections (MLA:
    the up-projections; its down-projections and the output projection are not column-parallel),
    the MLP's first linear (2/3 gated, 1/2 not)."""
    attention = column_share_attention(ctx, kind) * t_attn_gemm
    mlp = (2.0 / 3.0 if ctx.job.model.activation == "swiglu" else 0.5) * t_mlp
    return (attention, mlp)[: tp_blocks(kind)]


def column_share_attention(ctx: JobContext, kind: LayerKind) -> float:
    """The column-parallel projections' share of a layer's attention projection parameters."""
    model = ctx.job.model
    if model.mla is not None:
        return min(1.0, sum(ctx.mla_up_params) / max(kind.params.attention, 1.0))
    heads, kv_heads = float(model.num_attention_heads or 0), float(model.num_kv_heads or 0)
    qkv = heads * ctx.d_qk + kv_heads * (ctx.d_qk + ctx.d_v)
    return qkv / (qkv + heads * ctx.d_v) if qkv > 0 else 0.5


class _ForwardTimes(NamedTuple):
    """Forward times of one layer and micro-batch on one GPU (``t_core_bwd``: the attention
    core's backward)."""

    t_attn_gemm: float
    t_core: float
    t_core_bwd: float
    t_mlp: float
    t_elem: float
    t_perm: float
    t_shared: float
    """Of ``t_mlp``, an MoE layer's shared experts' GEMMs."""


def _forward_times(ctx: JobContext, kind: LayerKind, d: Dims, tokens: float) -> _ForwardTimes:
    """The forward compute terms of ``layer_cost``: the attention projections' and the MLP's (or
    the MoE block's) GEMMs, the attention core, the memory-bound elementwise kernels and the MoE
    permutation; ``tokens`` per GEMM on a TP rank."""
    cal = ctx.cal
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    p = kind.params
    tp = d.tp
    sp_div = tp if d.sequence_parallel else 1
    # ---- compute (forward) ---------------------------------------------------------------
    t_attn_gemm = gemm_time_s(ctx, kind.attn_proj_flops * tokens / tp, tokens, h, p.attention / (2 * h * tp))
    t_core, t_core_bwd = attention_core_times_s(ctx, kind, d)
    t_shared = 0.0
    if kind.is_moe:
        moe = model.moe
        assert moe is not None
        tok_gpu = tokens / tp  # experts are not tensor-split: each TP rank routes its own shard
        routed_tokens = routed_tokens_per_gpu(ctx, d)
        t_mlp = max(expert_gemm_times_s(ctx, kind, d))  # host bound when the expert GEMMs are small
        t_mlp += gemm_time_s(ctx, 2 * tok_gpu * p.router, tok_gpu, h, moe.num_experts)
        if p.shared_experts:
            t_shared = gemm_time_s(ctx, 2 * tokens * p.shared_experts / tp, tokens, h, p.shared_experts / (2 * h * tp))
            t_mlp += t_shared
        ffn_active = moe.top_k * p.routed_expert_each / (3 * h) * tp + p.shared_experts / (3 * h)
    else:
        t_mlp = gemm_time_s(ctx, kind.mlp_flops * tokens / tp, tokens, h, p.mlp_dense / (2 * h * tp))
        ffn_active = p.mlp_dense / (3 * h) if model.activation == "swiglu" else p.mlp_dense / (2 * h)
    elementwise_bytes = elementwise_bytes_fwd(ctx, tokens, tp, sp_div, ffn_active)
    if kind.is_moe:
        elementwise_bytes += router_bytes_fwd(ctx, tokens / tp)
    if is_low_bit(ctx.job.training.precision):
        # FP8 (and FP4) GEMM operands are cast from bf16 (scaling amax fused upstream). A block h -> w -> h with P
        # parameters on this GPU has 2h + P/h input+output elements per token (attention: qkv and
        # output projections; MLP: fc1 and fc2, gated or not).
        cast_elems = tokens * (2 * h + p.attention / tp / h)
        if kind.is_moe:
            cast_elems += routed_tokens * (2 * h * d.etp + p.routed_expert_each / h)
            if p.shared_experts:
                cast_elems += tokens * (2 * h + p.shared_experts / tp / h)
        else:
            cast_elems += tokens * (2 * h + p.mlp_dense / tp / h)
        elementwise_bytes += cal.fp8_cast_bytes * cast_elems
    if not ctx.job.training.fused_kernels:
        elementwise_bytes *= cal.unfused_elementwise_factor
    hbm_bytes_per_s = ctx.hbm_bytes_per_s
    t_elem = elementwise_bytes / hbm_bytes_per_s
    t_perm = routed_tokens * h * PERMUTE_BYTES / hbm_bytes_per_s if kind.is_moe else 0.0
    return _ForwardTimes(t_attn_gemm, t_core, t_core_bwd, t_mlp, t_elem, t_perm, t_shared)
