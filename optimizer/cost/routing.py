"""MoE routing terms of one layer: the router's memory-bound kernels and the routed load.

The router's gating GEMM (``2 h E`` FLOPs a token) is costed with the layer's GEMMs. What follows
it is memory-bound and is costed here: scoring the ``E`` fp32 logits (softmax or sigmoid: read 4
and write 4 bytes an expert), top-k selection (read 4), writing the routing map and the gate
probabilities (1 + 4) and the auxiliary load-balancing loss over the probabilities (read 4):
``ROUTER_BYTES_PER_EXPERT`` = 21 bytes per token and expert forward, unfused (Megatron-Core's
``moe_router_fusion`` runs them as one kernel; the unfused count is kept as the upper end:
the term is about 1% of an MoE layer's memory-bound work at E = 128-256).

The routed load: expert-parallel ranks process the routed copies of their experts. Forced-balance
routing gives every rank the mean up to sampling noise (``cal.ep_load_imbalance``, 1). With a
capacity factor ``c`` and padding (``training.moe_capacity_factor``; Megatron's
``--moe-expert-capacity-factor c --moe-pad-expert-input-to-capacity``) every expert processes
exactly ``c`` times its mean share: tokens over capacity are dropped, the rest padded, and the
all-to-all moves the padded buffers.
"""

from __future__ import annotations

from optimizer.cost.context import JobContext

ROUTER_BYTES_PER_EXPERT = 21.0
"""HBM bytes per token and expert of the router's scoring, top-k, routing map and auxiliary loss
(forward; backward twice that, like the other memory-bound work)."""


def routing_load(ctx: JobContext) -> float:
    """Routed copies on the busiest expert-parallel rank over the balanced mean: the calibration's
    routing skew, times the capacity factor when the job pads experts to capacity."""
    factor = ctx.job.training.moe_capacity_factor
    return ctx.cal.ep_load_imbalance * (1.0 if factor is None else factor)


def router_bytes_fwd(ctx: JobContext, tokens: float) -> float:
    """Forward HBM bytes of the router's memory-bound kernels for ``tokens`` routed tokens."""
    moe = ctx.job.model.moe
    assert moe is not None
    return tokens * moe.num_experts * ROUTER_BYTES_PER_EXPERT
