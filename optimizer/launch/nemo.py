"""Megatron-Bridge (NeMo) recipe overrides for a planned layout (``ConfigContainer`` Hydra
overrides; Megatron-Core's field names)."""

from __future__ import annotations

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch.bridge_sections import hydra_value, recipe_has_section, section_tokens
from optimizer.launch.common import Geometry, dp_overlapped, geometry
from optimizer.launch.megatron import (
    ATTENTION_BACKEND,
    MEGATRON_FSDP_STRATEGY,
    Split,
    costed_dropout,
    launched_dispatcher,
    megatron_recompute_modules,
    needs_current_scaling,
)
from optimizer.specs import ModelSpec, TrainingSpec

NEMO_COMM_OVERLAP_NOTE = (
    "Megatron-Bridge: the comm_overlap.* overrides need the recipe's comm_overlap section (the GPT, Llama 3 / "
    "3.1 and DeepSeek recipes have one; the Qwen, Llama 4 and Mamba recipes at v0.1.0rc4 do not: for those give "
    'the section whole instead, "comm_overlap={_target_:megatron.bridge.training.comm_overlap.CommOverlapConfig,'
    'tp_comm_overlap:false,<field>:<value>,...}")'
)
"""Said on a plan of a model with no known recipe whose overrides write ``comm_overlap.*`` keys
(Hydra refuses keys under a None section)."""


def tp_overlap_left_to_recipe_note(
    model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout, can_overlap: bool = True
) -> list[str]:
    """A plan costed without TP overlap on a layout with sequence parallelism, of a model with no
    known recipe (``bridge_sections``): the overrides leave ``comm_overlap.tp_comm_overlap`` to the
    recipe (recipes without the section refuse the key), and the Llama 3 / 3.1 and GPT-3 175B
    recipes turn it on. ``can_overlap``: the overlap would
    apply to this layout (its TP group inside one NVLink domain), so planning with it is an option."""
    if training.tp_comm_overlap or layout.tp == 1 or not layout.sequence_parallel:
        return []
    if recipe_has_section(model) is not None:  # the overrides name tp_comm_overlap, or there is no section
        return []
    option = " (or plan with training.tp_comm_overlap true)" if can_overlap else ""
    return [
        "Megatron-Bridge: recipes whose comm_overlap section turns TP communication overlap on (Llama 3 / 3.1, "
        f"GPT-3 175B at v0.1.0rc4) run it, which this plan does not cost: with those, add "
        f"comm_overlap.tp_comm_overlap=false{option}; recipes without the section (Qwen) run it off, as planned"
    ]


def nemo_overrides(
    model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout, geo: Geometry, split: Split
) -> str:
    vpp = geo.vpp if geo.pp > 1 and geo.vpp > 1 else None
    over: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", geo.tp),
        ("model.pipeline_model_parallel_size", geo.pp),
        ("model.virtual_pipeline_model_parallel_size", vpp),
        ("model.context_parallel_size", geo.cp),
    ]
    if model.is_moe:
        over += _moe_overrides(model, training, geo)
    over += _p2p_overrides(training, geo)
    if training.ep_comm_overlap and model.is_moe and geo.ep > 1:
        over.append(("comm_overlap.overlap_moe_expert_parallel_comm", True))
        over.append(("comm_overlap.delay_wgrad_compute", True))
        # Bridge copies it into the DDP config only with the distributed optimizer
        # (comm_overlap.py _get_optimizer_overlap_cfgs); DDP hooks the reduction on it
        over.append(("ddp.delay_wgrad_compute", True))
    over += [
        ("model.sequence_parallel", geo.sp),
        ("model.seq_length", geo.seq),
        ("dataset.sequence_length", geo.seq),  # pretraining GPTDatasetConfig (Megatron-Core's name)
        ("train.micro_batch_size", geo.mbs),
        ("train.global_batch_size", geo.gbs),
        ("mixed_precision", _nemo_precision(model, training, layout.recompute)),
        ("model.attention_backend", ATTENTION_BACKEND[training.attention_kernel]),
        ("ddp.use_distributed_optimizer", layout.zero_stage >= 1),
        ("optimizer.use_distributed_optimizer", layout.zero_stage >= 1),
        ("ddp.overlap_grad_reduce", dp_overlapped(training, geo, layout.zero_stage)),
        ("ddp.overlap_param_gather", dp_overlapped(training, geo, layout.zero_stage) and layout.zero_stage >= 1),
    ]
    over += [(f"model.{name}", value) for name, value in costed_dropout(model)]
    over += _dp_overlap_kept(training, layout, geo)
    if layout.zero_stage in MEGATRON_FSDP_STRATEGY:
        over += [
            ("dist.use_megatron_fsdp", True),
            ("ddp.use_megatron_fsdp", True),
            ("ddp.data_parallel_sharding_strategy", MEGATRON_FSDP_STRATEGY[layout.zero_stage]),
            ("ddp.average_in_collective", False),
            ("model.gradient_accumulation_fusion", False),
            ("checkpoint.ckpt_format", "fsdp_dtensor"),
        ]
    granularity = {"none": None, "moe": "selective", "op": "selective", "core_attn": "selective"}.get(
        layout.recompute, layout.recompute
    )
    full = layout.recompute == "full"
    over += [
        ("model.recompute_granularity", granularity),
        ("model.recompute_method", "uniform" if full else None),
        ("model.recompute_num_layers", 1 if full else None),
        ("model.num_layers_in_first_pipeline_stage", split.first),
        ("model.num_layers_in_last_pipeline_stage", split.last),
        # recipes that count the embedding and loss as layers (Llama 3.1 405B) conflict with both
        ("model.account_for_embedding_in_pipeline_split", False),
        ("model.account_for_loss_in_pipeline_split", False),
        ("model.mtp_num_layers", None),  # plans cost no MTP layers (DeepSeek-V3, GLM-4.5 recipes: 1)
    ]
    modules = megatron_recompute_modules(model, layout.recompute) if granularity == "selective" else None
    if modules:
        over.append(("model.recompute_modules", "[" + ",".join(modules) + "]"))
    section = [(k.removeprefix("comm_overlap."), v) for k, v in over if k.startswith("comm_overlap.")]
    tokens = [f"{k}={hydra_value(v)}" for k, v in over if not k.startswith("comm_overlap.")]
    no_defer = geo.pp == 1 or layout.zero_stage in MEGATRON_FSDP_STRATEGY  # Megatron-FSDP: no wgrad fusion
    tokens += section_tokens(model, section, bool(training.tp_comm_overlap and geo.sp), no_defer)
    # Hydra needs '|' quoted; the outer double quotes keep the single quotes through a shell.
    layout_value = "null" if split.layout is None else f"'{split.layout}'"
    token = f"model.pipeline_model_parallel_layout={layout_value}"
    tokens.append(token if split.layout is None else f'"{token}"')
    return " ".join(tokens)


def _p2p_overrides(training: TrainingSpec, geo: Geometry) -> list[tuple[str, object]]:
    """Interleaved pipeline sends as costed. Overlapped: on the model itself, since only a recipe's
    ``comm_overlap`` section turns the overlap on (``comm_overlap.py``; the Qwen and Llama 4
    recipes have none, leaving Megatron-Core's blocking batched sends), and the section's setup
    writes the same. Blocking: through the section, which would turn it back on; not with two
    stages, where the interleaved schedule would send and receive twice between the same two ranks
    in one communication batch (Megatron-LM's ``validate_args`` refuses it; Bridge does not check,
    the hazard is Megatron-Core's): the plan is then costed as blocking and runs overlapped.
    Without interleaving Megatron-Core's schedule blocks anyway."""
    if geo.pp == 1 or geo.vpp == 1:
        return []
    if training.pp_comm_overlap:
        return [("model.overlap_p2p_comm", True), ("model.batch_p2p_comm", False)]
    return [("comm_overlap.overlap_p2p_comm", False)] if geo.pp > 2 else []


def _dp_overlap_kept(training: TrainingSpec, layout: ResolvedLayout, geo: Geometry) -> list[tuple[str, object]]:
    """With the distributed optimizer, a recipe's ``comm_overlap`` section rewrites the two
    ``ddp`` overlap fields from the data-parallel size (on with dp > 1, off otherwise;
    ``comm_overlap.py`` ``_get_optimizer_overlap_cfgs``) unless it names them: named only where
    that would differ from the plan (dp 1 with cp > 1, where Megatron-FSDP asserts the overlap;
    a blocking plan with dp > 1), since recipes without the section (Qwen) refuse the keys."""
    overlapped = dp_overlapped(training, geo, layout.zero_stage)
    if layout.zero_stage < 1 or overlapped == (geo.dp > 1):
        return []
    return [
        ("comm_overlap.overlap_grad_reduce", overlapped),
        ("comm_overlap.overlap_param_gather", overlapped),
    ]


def _moe_overrides(model: ModelSpec, training: TrainingSpec, geo: Geometry) -> list[tuple[str, object]]:
    """The MoE model's expert layout, dispatcher and grouped GEMM."""
    over: list[tuple[str, object]] = []
    over.append(("model.expert_model_parallel_size", geo.ep))
    over.append(("model.expert_tensor_parallel_size", geo.etp))  # unset: 1 with ep > 1, tp otherwise
    dispatcher = launched_dispatcher(training.moe_dispatcher, geo)
    flex = dispatcher in ("deepep", "hybridep")
    over.append(("model.moe_token_dispatcher_type", "flex" if flex else dispatcher))
    if flex:  # DeepEP: Megatron-Core 0.14's only flex backend (no HybridEP plan runs on Megatron-Bridge)
        over.append(("model.moe_enable_deepep", True))
    if model.moe is not None and model.moe.num_shared_experts:
        # the DeepSeek and Llama 4 providers turn the shared-expert overlap on; the plan does not
        # cost it (and it runs only with the alltoall dispatcher, without the expert overlap)
        over.append(("model.moe_shared_expert_overlap", False))
    if training.moe_capacity_factor is not None:
        over.append(("model.moe_expert_capacity_factor", training.moe_capacity_factor))
        over.append(("model.moe_pad_expert_input_to_capacity", True))
    over.append(("model.moe_grouped_gemm", True))
    return over


def _nemo_precision(model: ModelSpec, training: TrainingSpec, recompute: str) -> str:
    """The mixed-precision recipe: per-tensor current scaling where the recompute modules rule out
    fp8 delayed scaling (``needs_current_scaling``)."""
    if needs_current_scaling(model, training, recompute):
        return "bf16_with_fp8_current_scaling_mixed"
    return _NEMO_PRECISION[training.precision]


# Megatron-Bridge mixed-precision recipes (``mixed_precision.py``); its fp8 recipes use the hybrid
# format as Megatron-LM's ``--fp8-format hybrid`` does, and also keep FP8 weights
# (``fp8_param_gather``), which frameworks.toml leaves to ZeRO-1 and above.
_NEMO_PRECISION = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_delayed_scaling_mixed",
}
"""(fp4: Megatron-Bridge has no NVFP4 recipe at the profile's version, so no plan launches it there.)"""


def first_last_bf16_note(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout) -> list[str]:
    """A Bridge fp8 plan whose recompute needs per-tensor current scaling: that recipe runs the
    first and last transformer layer in bf16, which a named recipe cannot turn off
    (``mixed_precision.py`` ``bf16_with_fp8_current_scaling_mixed``: ``first_last_layers_bf16``)."""
    if not needs_current_scaling(model, training, layout.recompute):
        return []
    return [
        "Megatron-Bridge: bf16_with_fp8_current_scaling_mixed (needed with this recompute) runs the first and "
        "last transformer layer in bf16, costed here in fp8: their stages run a little slower"
    ]


def bridge_delayed_wgrad_te_note(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout) -> list[str]:
    """A Megatron-Bridge plan that overlaps the expert all-to-all (``delay_wgrad_compute``): Bridge
    asserts Transformer Engine 2.7 with it when the gradient reduction overlaps or gradient
    accumulation is fused (its default with Transformer Engine or apex)."""
    geo = geometry(training, layout, model.is_moe)
    if not (model.is_moe and training.ep_comm_overlap and geo.ep > 1):
        return []
    return [
        "Megatron-Bridge: comm_overlap.delay_wgrad_compute needs Transformer Engine 2.7 or later with overlapped "
        "gradient reduction or gradient-accumulation fusion (src/megatron/bridge/training/comm_overlap.py asserts it)"
    ]
