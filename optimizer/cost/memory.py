"""Per-GPU memory of a pipeline stage: bytes per parameter, the ranks ZeRO shards state over,
the static (weights, gradients, optimizer state) and in-flight (activations, buffers) bytes, and
what of the rank order memory depends on (``memory_signature``)."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.cost.context import FP32_GRAD_BYTES, HALF_GRAD_BYTES, JobContext
from optimizer.cost.num import Num, maximum, minimum, select
from optimizer.cost.pipeline import in_flight_microbatches
from optimizer.cost.stage_layout import StageLayout
from optimizer.cost.topology import AxisGroups

WEIGHT_BYTES = 2.0  # bf16 weights
GRAD_BYTES = HALF_GRAD_BYTES  # the source text's 16-bit gradients; a job's own: JobContext.grad_bytes
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam first and second moments
FP8_COPY_BYTES = 1.0  # transposed/quantised FP8 weight copies kept by FP8 training
FP4_COPY_BYTES = 2 * (0.5 + 1 / 16)  # NVFP4 row- and column-wise weight copies, one fp8 scale per 16 values
ADAM_STEP_BYTES = 32.0  # HBM traffic per parameter of one Adam step (read p, m, v, g; write p, m, v, bf16 p)


@dataclass(frozen=True)
class StageMemory:
    weights_bytes: Num
    gradients_bytes: Num
    optimizer_bytes: Num
    activations_bytes: Num
    buffers_bytes: Num
    optimizer_step_bytes: Num = 0.0
    """What the optimizer step's fp32 gradient copy (``step_grad_copy_bytes``) needs beyond the
    activations it replaces: 0 unless it outgrows them."""

    @property
    def total_bytes(self) -> Num:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.buffers_bytes
            + self.optimizer_step_bytes
        )


def stage_memory(
    ctx: JobContext, lay: StageLayout, stage: Num, mem: StageMemory, stored: Num, grads_bytes: Num
) -> StageMemory:
    """A stage's memory from its core's (``mem``, ``stored``, ``grads_bytes``)."""
    # activations: the in-flight micro-batches depend on the stage's position in the pipeline
    # the expert all-to-all overlap's combined 1F1B runs one more warm-up forward (ep > 1)
    held = in_flight_microbatches(stage, lay.pp, lay.vpp, lay.num_micro_batches, 1 if ctx.expert_overlap(lay.ep) else 0)
    acts = held * stored + mem.activations_bytes
    # the optimizer step's fp32 gradient copy takes the place of the freed activations
    beyond = maximum(step_grad_copy_bytes(ctx, mem.optimizer_bytes, lay.zero_stage) - acts, 0.0)
    buffers = mem.buffers_bytes + ctx.cal.fragmentation * (acts + beyond + grads_bytes)
    return StageMemory(mem.weights_bytes, mem.gradients_bytes, mem.optimizer_bytes, acts, buffers, beyond)


DEEPSPEED_SUB_GROUP_ELEMS = 1e9
"""DeepSpeed ZeRO-3 steps its shard one sub group of this many elements at a time
(``zero_optimization.sub_group_size``, default 1e9: ``deepspeed/runtime/zero/config.py``; the
plan's config writes it)."""


def step_grad_copy_bytes(ctx: JobContext, optimizer_bytes: Num, zero_stage: int) -> Num:
    """Bytes the optimizer step's fp32 copy of the 16-bit gradients of the shard it updates holds at
    once (4 per parameter of the shard, read off its state bytes); 0 with fp32 gradients.

    Adam on fp32 master weights takes fp32 gradients. Megatron-Core's optimizers set
    ``main_param.grad = model_param.main_grad.float()`` (``optimizer.py``
    ``_copy_model_grads_to_main_grads``; the distributed optimizer for its shard,
    ``distrib_optimizer.py``) and DeepSpeed's ZeRO-1/2 casts its flat partition ``.to(fp32)``
    (``stage_1_and_2.py`` ``step``). DeepSpeed's ZeRO-3 (``training.fsdp_buffers`` layer) casts one
    sub group (``DEEPSPEED_SUB_GROUP_ELEMS``) at a time and frees it after its update (``stage3.py``
    ``_prepare_fp32_grad_for_sub_group``, ``_release_sub_group``; a group may run over by one
    parameter's partition, which the fragmentation charge covers). DeepSpeed flattens the 16-bit
    gradients before the cast, 2 bytes a parameter more for a moment, which is not charged
    (docs/cost-model.md). The copy lives from the step to the next step's ``zero_grad``, after the
    activations are freed; with fp32 gradients ``.float()`` returns the gradient itself."""
    if ctx.grad_bytes >= FP32_GRAD_BYTES:
        return 0.0
    shard = optimizer_bytes / OPTIMIZER_BYTES
    if zero_stage == 3 and ctx.fsdp_buffers == "layer":
        shard = minimum(shard, DEEPSPEED_SUB_GROUP_ELEMS)
    return shard * FP32_GRAD_BYTES


def memory_signature(groups: AxisGroups) -> tuple[bool, ...]:
    """All a stage's memory takes from the rank order: which axes have groups (NCCL buffers).

    The dense data-parallel group is ``cp x dp`` only when the two axes are adjacent in the
    order, so with ``dp = 1`` and ``cp > 1`` it differs between orders; otherwise it does not.
    """
    return tuple(g.size > 1 for g in (groups.tp, groups.cp, groups.ep, groups.dp_cp, groups.pp, groups.etp))


def weight_bytes_per_param(ctx: JobContext) -> float:
    """Bytes of one stored weight: bf16, plus the low-precision copy FP8 / FP4 training keeps."""
    return WEIGHT_BYTES + {"fp8": FP8_COPY_BYTES, "fp4": FP4_COPY_BYTES}.get(ctx.job.training.precision, 0.0)


def static_memory_bytes(
    ctx: JobContext,
    zero_stage: int,
    dense: Num,
    expert: Num,
    dp_shard: Num,
    ep_shard: Num,
    opt_dense_shard: Num,
    opt_expert_shard: Num,
) -> tuple[Num, Num, Num]:
    """(weights, gradients, optimizer state) bytes of a stage holding ``dense`` and ``expert``
    parameters, sharded as ZeRO ``zero_stage`` shards them (``shard_group_sizes``,
    ``optimizer_shards``). Linear in the parameters. Numbers or numpy arrays."""
    w_bytes = weight_bytes_per_param(ctx)
    weights = (dense / dp_shard if zero_stage == 3 else dense) + (expert / ep_shard if zero_stage == 3 else expert)
    grads = (dense / dp_shard if zero_stage >= 2 else dense) + (expert / ep_shard if zero_stage >= 2 else expert)
    optim = dense / opt_dense_shard + expert / opt_expert_shard
    return weights * w_bytes, grads * ctx.grad_bytes, optim * OPTIMIZER_BYTES


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
