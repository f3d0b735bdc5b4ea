"""Launch settings for a planned layout, for four training frameworks.

``build_launch(model, training, layout)`` is a pure function: it turns one planned layout (the
layout value, ``optimizer.cost.rules.ResolvedLayout``) into Megatron-LM command-line arguments, a
torchtitan TOML fragment, a DeepSpeed config JSON and Megatron-Bridge recipe overrides. Only the
settings the layout decides are emitted (parallel degrees, batch geometry, pipeline split,
optimizer sharding, recompute, precision); model architecture, data, optimizer hyper-parameters
and checkpoint paths stay with the user.

Where each framework's names come from (read in the framework's own repository):

* Megatron-LM -- ``NVIDIA/Megatron-LM`` ``megatron/training/arguments.py`` (commit
  000c4ac24f61159c138b0975def722c65245983c): ``_add_distributed_args``, ``_add_training_args``,
  ``_add_mixed_precision_args``, ``_add_transformer_engine_args``, ``_add_moe_args``,
  ``_add_data_args``, ``_add_checkpointing_args``, ``validate_args``. Semantics of the uneven split:
  ``megatron/core/transformer/transformer_layer.py`` (``get_transformer_layer_offset``) and
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``. Megatron-FSDP required
  flags: Megatron-Core developer guide, "Megatron-FSDP User Guide".
* torchtitan -- ``pytorch/torchtitan`` ``torchtitan/config/job_config.py`` (commit
  6404b932421f5ce382e7dac5ad381b2c17b1373c, the TOML job-config generation: ``[parallelism]``,
  ``[training]``, ``[activation_checkpoint]``, ``[model]``); module names for
  ``module_fqns_per_model_part`` from ``torchtitan/distributed/pipeline.py``
  (``generate_llm_fqn_per_model_part``: ``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``).
  Newer torchtitan replaces TOML files with Python configurations
  (``torchtitan/config/README.md``); the ``section.option`` names still work as
  ``--section.option`` command-line flags there, except the two pipeline keys noted in
  ``docs/launch.md``.
* DeepSpeed -- ``microsoft/DeepSpeed`` ``docs/_pages/config-json.md`` (commit
  da7f21a2516a693f973a5f4b26affcce1de6d38d): batch-size keys, ``zero_optimization.stage``,
  ``zero_optimization.overlap_comm``, ``zero_optimization.sub_group_size``, ``zero_optimization.stage3_prefetch_bucket_size`` (default
  from ``deepspeed/runtime/zero/config.py``), ``bf16.enabled``, ``fp16.enabled``,
  ``activation_checkpointing``.
* Megatron-Bridge (NeMo's current training library; ``ConfigContainer`` Hydra overrides) --
  ``NVIDIA-NeMo/Megatron-Bridge`` ``docs/megatron-lm-to-megatron-bridge.md`` (flag-to-field
  mapping), ``src/megatron/bridge/training/mixed_precision.py`` (precision recipe names),
  ``src/megatron/bridge/training/utils/omegaconf_utils.py`` (Hydra ``OverridesParser``); field
  names under ``model.*`` and ``ddp.*`` are Megatron-Core's ``ModelParallelConfig``
  (``megatron/core/model_parallel_config.py``), ``TransformerConfig`` and
  ``DistributedDataParallelConfig`` fields.

``docs/launch.md`` has the full mapping table.
"""

from __future__ import annotations

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch.common import default_stage_layers, geometry
from optimizer.launch.deepspeed import deepspeed_config
from optimizer.launch.environment import megatron_env, nemo_env
from optimizer.launch.megatron import (
    ATTENTION_BACKEND,
    MEGATRON_FLAGS,
    MEGATRON_MOE_RECOMPUTE_MODULES,
    megatron_args,
    megatron_recompute_modules,
    megatron_split,
)
from optimizer.launch.nemo import nemo_overrides
from optimizer.launch.torchtitan import torchtitan_toml
from optimizer.results import LaunchArgs
from optimizer.specs import ModelSpec, TrainingSpec

__all__ = [
    "ALL_LAUNCH_FIELDS",
    "ATTENTION_BACKEND",
    "MEGATRON_FLAGS",
    "MEGATRON_MOE_RECOMPUTE_MODULES",
    "build_launch",
    "default_stage_layers",
    "megatron_recompute_modules",
]

ALL_LAUNCH_FIELDS = ("megatron", "torchtitan", "deepspeed", "nemo")


MEGATRON_PP_DP_MAPPING = "--use-tp-pp-dp-mapping"
"""Megatron-LM's rank order with pipeline stages inside data parallelism (``tp-cp-ep-pp-dp``)."""
NEMO_PP_DP_MAPPING = "dist.use_tp_pp_dp_mapping=true"
"""Megatron-Bridge's (``DistributedInitConfig.use_tp_pp_dp_mapping``: order ``tp-pp-dp``)."""


def build_launch(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ResolvedLayout,
    fields: tuple[str, ...] = ALL_LAUNCH_FIELDS,
    pp_inside_dp: bool = False,
) -> LaunchArgs:
    """Launch settings for ``layout`` (the layout value, recompute in the cost model's names), for
    the ``LaunchArgs`` ``fields`` named (the frameworks that run the plan as costed); the others
    stay empty. ``pp_inside_dp``: the plan's rank order puts pipeline stages inside data
    parallelism (``optimizer/rank_orders.py``), which only Megatron's mapping flag lays out."""
    geo = geometry(training, layout, model.is_moe)
    split = megatron_split(geo)
    mapping = ([MEGATRON_PP_DP_MAPPING], [NEMO_PP_DP_MAPPING]) if pp_inside_dp else ([], [])
    builders = {
        "megatron": lambda: " ".join([megatron_args(model, training, layout, geo, split), *mapping[0]]),
        # torchtitan has no NVFP4 recipe at its profile's commit (float8 and MXFP8 only)
        "torchtitan": lambda: (
            "" if training.precision == "fp4" else torchtitan_toml(training, layout, geo, model.is_moe)
        ),
        "deepspeed": lambda: deepspeed_config(model, training, layout, geo),
        # Megatron-Bridge has no NVFP4 recipe at its profile's version: no fp4 plan runs there
        "nemo": lambda: (
            ""
            if training.precision == "fp4"
            else " ".join([nemo_overrides(model, training, layout, geo, split), *mapping[1]])
        ),
    }
    env = {"megatron_env": megatron_env(model, training, layout)} if "megatron" in fields else {}
    if "nemo" in fields and training.precision != "fp4":
        env["nemo_env"] = nemo_env(training)
    return LaunchArgs(**{name: builders[name]() for name in fields}, **env)
