"""Memory a stage's data-parallel sharding holds beside its shards: ZeRO-0/1's gradient buckets,
ZeRO-3's gathered layers and, by ``training.fsdp_buffers``, Megatron-FSDP's reduce-scatter queue,
parameter prefetch and never-released embedding and output layer (ZeRO-2/3)."""

from __future__ import annotations

from optimizer.cost.context import JobContext
from optimizer.cost.num import Num, maximum, minimum, select

MEGATRON_FSDP_UNIT_FLOOR = 1e9
"""Elements: Megatron-FSDP's ``suggested_communication_unit_size`` is at least this
(``megatron_fsdp.py`` at Megatron-LM 000c4ac2, "Cap to 1B elements": ``max(1e9, 2 x the average
FSDP unit)`` at ZeRO-3, ``max(1e9, bucket_size)`` at ZeRO-2; exactly 1e9 at Megatron-Core 0.14.0,
Megatron-Bridge's: ``JobContext.fsdp_unit_scales``). The reduce-scatter queue holds up
to that many unsharded gradient elements (``GradReducePipeline`` frees a bucket only when the
queue passes it), and the all-gather prefetch reaches half of it ahead."""


FSDP2_GRAD_COPY_BYTES = 2.0
"""Bytes per element of the 16-bit gradients FSDP2 produces for a gathered layer, alive until
``foreach_reduce`` has copied them into its reduce-scatter input (of the reduce dtype:
``JobContext.grad_bytes``)."""


def megatron_fsdp(ctx: JobContext) -> bool:
    """Whether ZeRO-2/3 hold Megatron-FSDP's buffers (``JobContext.fsdp_buffers``)."""
    return ctx.fsdp_buffers == "megatron-fsdp"


def zero_buffer_bytes(
    ctx: JobContext,
    zero_stage: int,
    data_parallel: bool,
    layers: tuple[Num, Num, Num],
    kept: Num,
    shards: tuple[Num, Num],
    weight_bytes: float,
    head: Num = 0.0,
) -> Num:
    """Buffer bytes of a stage holding ``layers`` = (dense, expert, its largest layer's)
    parameters on this rank, ``kept`` of the dense ones its embedding and output layer's, sharded
    over ``shards`` = (dense, expert) data-parallel ranks.

    ZeRO-0/1 (``data_parallel``: a ``dp x cp`` group exists): two gradient buckets (at most the
    stage's gradients). ZeRO-3:
    the non-local part of the gathered layers, two (the current and the prefetched) or, with
    Megatron-FSDP, the current one plus half its unit size ahead, and then also its queue of
    unsharded gradients and the gathered embedding and output layer. ZeRO-2 with Megatron-FSDP:
    the queue (weights are whole already); otherwise one bucket pair. FSDP2 (``fsdp2``) at ZeRO-3:
    two layers gathered whole and the current layer's 16-bit gradients with their reduce-dtype
    copy, or, if more, the output layer (``head`` parameters) kept gathered across the loss; at
    ZeRO-2 a layer's gradients and copy only (``fsdp2_buffer_bytes``).
    Numbers or numpy arrays."""
    dense, expert, max_layer = layers
    dp_shard, ep_shard = shards
    total = dense + expert
    grad_bytes = ctx.grad_bytes
    mfsdp = megatron_fsdp(ctx)
    if zero_stage >= 2 and ctx.fsdp_buffers == "fsdp2":
        return fsdp2_buffer_bytes(ctx, zero_stage, (total, max_layer, head), weight_bytes)
    if zero_stage <= 1 or (zero_stage == 2 and not mfsdp):
        # two buckets in flight, never more than the stage's gradients
        return minimum(2 * ctx.cal.dp_bucket_bytes, total * grad_bytes) if data_parallel else 0.0
    if zero_stage == 2:
        return minimum(total, MEGATRON_FSDP_UNIT_FLOOR + max_layer) * grad_bytes
    share_d = select(total > 0, dense / select(total > 0, total, 1.0), 1.0)
    non_local = share_d * (1.0 - 1.0 / dp_shard) + (1.0 - share_d) * (1.0 - 1.0 / ep_shard)
    if not mfsdp:
        return minimum(2 * max_layer, total) * non_local * weight_bytes
    unit = maximum(MEGATRON_FSDP_UNIT_FLOOR, 2 * max_layer) if ctx.fsdp_unit_scales else MEGATRON_FSDP_UNIT_FLOOR
    gathered = minimum(max_layer + maximum(max_layer, unit / 2), total) * non_local * weight_bytes
    queue = minimum(total, unit + max_layer) * grad_bytes
    return gathered + queue + kept * (1.0 - 1.0 / dp_shard) * weight_bytes


def fsdp2_buffer_bytes(ctx: JobContext, zero_stage: int, sizes: tuple[Num, Num, Num], weight_bytes: float) -> Num:
    """FSDP2's ZeRO-2/3 buffers of a stage with ``sizes`` = (its parameters, its largest layer's,
    its output layer's). A layer's backward holds its 16-bit gradients and their reduce-dtype
    copy, and at ZeRO-3 two layers gathered whole (it and the one prefetched). ZeRO-3 also keeps
    the output layer gathered from its forward to its backward, across the loss's peak (charged
    with the activations); its gradients come after that peak, when the logits' 12-16 bytes have
    fallen to their 2-byte gradient."""
    total, max_layer, head = sizes
    reduce_bytes = FSDP2_GRAD_COPY_BYTES + ctx.grad_bytes
    if zero_stage == 2:  # weights stay whole
        return max_layer * reduce_bytes
    layers = minimum(2 * max_layer, total) * weight_bytes + max_layer * reduce_bytes
    return maximum(layers, head * weight_bytes)
