"""Attention-core time of one layer and micro-batch: fused (flash) kernels, or unfused kernels
that materialise the scores in HBM."""

from __future__ import annotations

from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.layer_base import Dims, gemm_time_s

UNFUSED_SCORE_BYTES_FWD = 13.0
"""HBM bytes per attention-score element in forward when the scores are materialised
(``attention_kernel`` 'unfused', 16-bit): QK^T writes S (2), the fused scale-mask-softmax reads S
and writes P (4), attention dropout reads P and writes P' and a 1-byte mask (5), the PV GEMM
reads P' (2)."""
UNFUSED_SCORE_BYTES_BWD = 19.0
"""The same in backward: the dP' GEMM writes it (2), dropout backward reads dP' and the mask and
writes dP (5), softmax backward reads P and dP and writes dS (6), the dQ and dK GEMMs read dS
(4), the dV GEMM reads P' (2)."""
UNFUSED_SCORE_BYTES_STORED = 5.0
"""Bytes per score element kept for backward (Korthikanti et al. 2022: softmax output 2, dropout
mask 1, dropout output 2; ``5 a s^2 b`` per layer)."""


def score_elements(ctx: JobContext, kind: LayerKind, d: Dims) -> float:
    """Attention-score elements of one layer and micro-batch on one GPU (``b a/tp s^2``; the
    unfused kernels compute and store the full square, masked half included; no CP)."""
    if kind.attn_core_flops <= 0:
        return 0.0
    s = ctx.job.training.seq_len
    heads = float(ctx.job.model.num_attention_heads or 0)
    return d.micro_batch_size * heads / d.tp * s * s


def attention_core_times_s(ctx: JobContext, kind: LayerKind, d: Dims) -> tuple[float, float]:
    """Forward and backward attention-core time of one layer and micro-batch.

    Fused (flash) kernels: ``attention_core_time_s`` forward, 2.5x that backward (the scores are
    recomputed). Unfused: the QK^T and PV batched GEMMs at the bf16 GEMM rate of their shapes
    (twice as many GEMMs backward), plus the HBM traffic of the materialised scores."""
    if ctx.attention_kernel != "unfused":
        t = attention_core_time_s(ctx, kind, d)
        return t, 2.5 * t
    elems = score_elements(ctx, kind, d)
    if elems <= 0:
        return 0.0, 0.0
    s = float(ctx.job.training.seq_len)
    bf16_rate = ctx.bf16_peak_flops * ctx.bf16_gemm_efficiency
    qk = gemm_time_s(ctx, 2.0 * elems * ctx.d_qk, s, s, ctx.d_qk, bf16_rate)
    pv = gemm_time_s(ctx, 2.0 * elems * ctx.d_v, s, ctx.d_v, s, bf16_rate)
    hbm = ctx.hbm_bytes_per_s
    fwd = qk + pv + UNFUSED_SCORE_BYTES_FWD * elems / hbm
    bwd = 2.0 * (qk + pv) + UNFUSED_SCORE_BYTES_BWD * elems / hbm
    return fwd, bwd


def attention_core_time_s(ctx: JobContext, kind: LayerKind, d: Dims) -> float:
    """Forward fused attention-core time of one layer and micro-batch (what CP's ring hides behind)."""
    cal = ctx.cal
    s = ctx.job.training.seq_len
    tokens = d.micro_batch_size * s / d.cp
    q_local = s / d.cp
    attn_eff = ctx.attention_efficiency * q_local / (q_local + cal.attention_seq_half)
    return kind.attn_core_flops * tokens / d.tp / (ctx.bf16_peak_flops * attn_eff)
