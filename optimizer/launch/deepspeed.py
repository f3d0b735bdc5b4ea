"""DeepSpeed config JSON for a planned layout (``docs/_pages/config-json.md``)."""

from __future__ import annotations

import json
import math

from optimizer.calibration import DEFAULT
from optimizer.cost.context import FP32_GRAD_BYTES, HALF_GRAD_BYTES
from optimizer.cost.memory import DEEPSPEED_SUB_GROUP_ELEMS
from optimizer.cost.rules import ResolvedLayout
from optimizer.frameworks import balanced_partitions
from optimizer.launch.common import Geometry
from optimizer.params import layer_params
from optimizer.specs import ModelSpec, TrainingSpec

_DEEPSPEED_PREFETCH_DEFAULT = 50_000_000
"""DeepSpeed's ``stage3_prefetch_bucket_size`` default (``deepspeed/runtime/zero/config.py``)."""
_DEEPSPEED_LIVE_DEFAULT = 1_000_000_000
"""DeepSpeed's ``stage3_max_live_parameters`` default (``deepspeed/runtime/zero/config.py``)."""


def dp_bucket_elements(training: TrainingSpec) -> float:
    """Gradient elements in one of the plan's data-parallel buckets (``Calibration.dp_bucket_bytes``
    of gradients in the dtype the plan reduces them in, as ``JobContext.grad_bytes``)."""
    return DEFAULT.dp_bucket_bytes / (FP32_GRAD_BYTES if training.grad_reduce_in_fp32 else HALF_GRAD_BYTES)


def _bf16_model(training: TrainingSpec) -> bool:
    """DeepSpeed runs the model in bf16: its JSON has no FP8/FP4 switch (Transformer Engine
    handles those), so they run on bf16 too."""
    return training.precision in ("bf16", "fp8", "fp4")


BF16_OPTIMIZER_NOTE = (
    "DeepSpeed's BF16_Optimizer also holds each backward's bf16 gradients until it adds them to "
    "its fp32 ones, and reduces through a fixed 5e8-element fp32 buffer: up to 2 bytes a parameter "
    "and 2 GB more than the plan's memory counts"
)
"""The plan's line for a DeepSpeed plan with fp32 gradients of a bf16 model (``bf16_optimizer.py``
``update_hp_grads``, the pipeline engine's ``clear_lp_grads`` after each backward)."""


ALL_REDUCE_NOTE = (
    "DeepSpeed all-reduces ZeRO-0/1 gradients and then gathers the updated weights: about 1.5x the "
    "data-parallel bytes the plan costs at ZeRO-1"
)
"""The plan's line for a DeepSpeed ZeRO-0/1 plan with data parallelism (``engine.py``
``_configure_zero_optimizer``: stage 1 turns ``contiguous_gradients`` off, so
``stage_1_and_2.py`` reduces through ``buffered_reduce_fallback``'s all-reduce; ``BF16_Optimizer``
all-reduces too)."""


def deepspeed_notes(training: TrainingSpec, layout: ResolvedLayout) -> list[str]:
    """What a DeepSpeed plan's config cannot say or the cost model does not count, one line each."""
    notes = []
    if training.grad_reduce_in_fp32 and _bf16_model(training):
        notes.append(BF16_OPTIMIZER_NOTE)
    if layout.zero_stage <= 1 and layout.dp > 1:
        notes.append(ALL_REDUCE_NOTE)
    if layout.tp > 1 or layout.pp > 1:
        notes.append(_model_parallel_note(layout))
    if layout.pp == 1 and layout.recompute == "full":
        notes.append(
            "DeepSpeed recomputes only what the model code wraps: each transformer layer in "
            "deepspeed.checkpointing.checkpoint, after deepspeed.checkpointing.configure(mpu, "
            "deepspeed_config=...) applies the config's activation_checkpointing section"
        )
    return notes


def _model_parallel_note(layout: ResolvedLayout) -> str:
    """The DeepSpeed config holds no parallel sizes: the model code sets them."""
    parts = []
    if layout.tp > 1 and layout.pp == 1:
        # with a pipeline the topology carries TP: deepspeed.initialize asserts mpu is None there
        # and takes the module's (deepspeed/__init__.py, ``mpu must be None with pipeline parallelism``)
        parts.append("deepspeed.initialize(..., mpu=<the model's tensor-parallel mpu>)")
    if layout.pp > 1:
        topology = f"PipeModelDataParallelTopology(num_pp={layout.pp}, num_mp={layout.tp}, num_dp={layout.dp})"
        # partition_balanced of equal units: the end layers count as one each unless the split is the
        # layers' own (frameworks.balanced_partitions; the plan runs on DeepSpeed only with one of the two)
        own = balanced_partitions(sum(layout.stage_layers), layout.pp)[0] == tuple(layout.stage_layers)
        ends = "" if own else "|<embedding class>|<output layer class>"
        interval = ", activation_checkpoint_interval=1" if layout.recompute == "full" else ""
        parts.append(f"PipelineModule(..., topology={topology}, partition_method='type:<layer class>{ends}'{interval})")
    return f"DeepSpeed takes the parallel sizes from the model code: {'; '.join(parts)}"


def _largest_layer_params(model: ModelSpec, tp: int, ep: int) -> int:
    """Parameters of the largest layer on one rank, as the cost model holds them
    (``LayerParams.on_rank``): what a ZeRO-3 prefetch must hold to gather the next layer while the
    current one computes, and no more (a larger bucket would prefetch several layers, more memory
    than the plan holds for two)."""
    assert model.num_layers is not None  # set by the spec validators
    return math.ceil(max(sum(layer_params(model, i).on_rank(tp, ep)) for i in range(model.num_layers)))


def grad_accum_dtype(training: TrainingSpec) -> str:
    """``data_types.grad_accum_dtype`` of a ZeRO plan as costed (``training.grad_reduce_in_fp32``):
    fp32 runs a bf16 model's ZeRO-1 as ``BF16_Optimizer`` (fp32 gradients; what the pipeline
    engine needs), else the 16-bit model dtype (ZeRO's default, which it also reduces in:
    ``engine.py`` ``get_data_types``, ``communication_data_type``). The frameworks profile keeps
    each to the stages that run it."""
    if training.grad_reduce_in_fp32:
        return "fp32"
    return "fp16" if training.precision == "fp16" else "bf16"


def deepspeed_config(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout, geo: Geometry) -> str:
    # overlap_comm: gradient reduce-scatters under backward (stage 3's default, as costed there)
    zero: dict[str, object] = {"stage": layout.zero_stage}
    if layout.zero_stage >= 1:  # stage 0 builds no ZeRO optimizer to read it (engine.py zero_enabled)
        zero["overlap_comm"] = training.dp_comm_overlap or layout.zero_stage == 3
    if layout.zero_stage == 3 and training.dp_comm_overlap:
        # the default prefetch (5e7 elements) is a fraction of a large model's layer: gathers
        # would run on demand instead of under the previous layer's compute
        prefetch = max(_DEEPSPEED_PREFETCH_DEFAULT, _largest_layer_params(model, geo.tp, geo.ep * geo.etp))
        zero["stage3_prefetch_bucket_size"] = prefetch
        # room for the current layer and the prefetched one (the 1e9 default caps the prefetch at
        # what is not live: partitioned_param_coordinator.py), released once past (no reuse)
        zero["stage3_max_live_parameters"] = max(_DEEPSPEED_LIVE_DEFAULT, 2 * prefetch)
        zero["stage3_max_reuse_distance"] = prefetch
    if layout.zero_stage == 3:  # the step's fp32 gradient copy is costed one sub group at a time
        zero["sub_group_size"] = int(DEEPSPEED_SUB_GROUP_ELEMS)
    if layout.zero_stage >= 1:
        # the two gradient buckets the plan holds (DeepSpeed's default is 5e8 elements each)
        bucket = int(dp_bucket_elements(training))
        zero["reduce_bucket_size"] = bucket
        if layout.zero_stage <= 2:  # stage 3 gathers by its prefetch bucket, not this one
            zero["allgather_bucket_size"] = bucket
    config: dict[str, object] = {
        "train_batch_size": geo.mbs * geo.nmb * geo.dp,
        "train_micro_batch_size_per_gpu": geo.mbs,
        "gradient_accumulation_steps": geo.nmb,
        "zero_optimization": zero,
        "bf16": {"enabled": _bf16_model(training)},
        "fp16": {"enabled": training.precision == "fp16"},
    }
    if layout.zero_stage >= 1:
        # without ZeRO the profile's default (fp32 for bf16) stands: later releases refuse it explicit
        config["data_types"] = {"grad_accum_dtype": grad_accum_dtype(training)}
    if training.grad_reduce_in_fp32:
        # fp32 gradients are reduced in the model's 16-bit dtype unless told (engine.py
        # communication_data_type); the plan costs fp32 reductions
        config["communication_data_type"] = "fp32"
    if layout.recompute != "none":
        config["activation_checkpointing"] = {
            # partitioning keeps each TP rank's slice of a checkpointed input and all-gathers it
            # back: wrong under sequence parallelism (the ranks' inputs differ), and not costed
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return json.dumps(config, indent=2, sort_keys=True)
