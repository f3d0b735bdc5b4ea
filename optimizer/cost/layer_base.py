"""The per-layer cost's shared vocabulary: the layout numbers it depends on (``Dims``, a view of the layout value: ``ResolvedLayout.dims``), its result
(``LayerCost``), the GEMM time at a shape, and the per-rank widths the compute, communication
and activation terms share."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.cost.context import JobContext
from optimizer.cost.flops import MEGATRON_SELECTIVE
from optimizer.cost.rules import Dims as Dims  # the layout value's view, kept importable from here
from optimizer.modes import RecomputeMode

ACT_BYTES = 2.0
"""Activations, activation gradients and TP/EP/PP messages are bf16 (also in FP8 runs)."""


ATTENTION_CORE_RECOMPUTED = frozenset(
    {RecomputeMode.SELECTIVE, RecomputeMode.MOE, RecomputeMode.FULL, MEGATRON_SELECTIVE}
)
"""Recompute modes that re-run the attention core in backward (``op`` keeps its output)."""


@dataclass(frozen=True)
class LayerCost:
    fwd_s: float
    bwd_s: float
    """Backward compute, including recomputed forward work."""
    tp_s: float
    cp_s: float
    ep_s: float
    stored_act_bytes: float
    """Activations kept from forward to backward for one micro-batch."""
    working_act_bytes: float
    """Transient activations of this layer while it runs (the full set for one micro-batch)."""
    dense_params: float
    """Parameters on this GPU that are replicated over data parallel (after TP split)."""
    expert_params: float
    """Routed-expert parameters on this GPU (after EP split)."""
    tp_wgrad_windows_s: tuple[float, ...] = ()
    """Per TP block, the column-parallel GEMM's forward time (``layer.tp_wgrad_windows_s``)."""

    @property
    def time_s(self) -> float:
        """Forward + backward compute with the exposed TP/CP/EP communication of this layer."""
        return self.fwd_s + self.bwd_s + self.tp_s + self.cp_s + self.ep_s


def gemm_time_s(ctx: JobContext, flops: float, m: float, n: float, k: float, rate_flops: float | None = None) -> float:
    """One GEMM of ``flops`` with dimensions (m, n, k) at the shape-dependent achievable rate
    (``rate_flops`` for large shapes; default the training precision's)."""
    if flops <= 0:
        return 0.0
    if rate_flops is None:
        rate_flops = ctx.gemm_peak_flops * ctx.gemm_efficiency
    d0 = ctx.cal.gemm_dim_half
    shape = (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))
    return flops / (rate_flops * shape)


def kv_width_local(ctx: JobContext, tp: int) -> float:
    """K and V elements per token on one TP rank (replicated when tp > KV heads; MLA exchanges
    decompressed K and V)."""
    model = ctx.job.model
    heads = float(model.num_attention_heads or 0)
    kv_heads = float(model.num_kv_heads or 0)
    if model.mla is not None:
        return heads * (ctx.d_qk + ctx.d_v) / tp
    return kv_heads * (ctx.d_qk + ctx.d_v) / min(tp, max(kv_heads, 1.0))


def attention_kv_width(ctx: JobContext, tp: int) -> float:
    """K and V elements per token on one TP rank as the attention kernel takes them: query-wide
    when the stack expands the key/value heads first (``training.kv_expanded``: torchtitan's
    repeat_kv; its context-parallel ring then passes the expanded copies too), else
    ``kv_width_local``."""
    model = ctx.job.model
    if ctx.kv_expanded and model.mla is None:
        return float(model.num_attention_heads or 0) * (ctx.d_qk + ctx.d_v) / tp
    return kv_width_local(ctx, tp)
