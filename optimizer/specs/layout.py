"""Parallel layouts: one to score (``Layout``), and the fields a search pins or allows."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from optimizer.specs.common import MAX_ALLOW_VALUES, MAX_LAYERS, MAX_NUM_GPUS, Recompute, ZeroStage
from optimizer.strict_model import Strict
from optimizer.topology_spec import MAX_LEVEL_NAME

MAX_MICRO_BATCH_SIZE = 1 << 16
"""The largest micro-batch a layout may name (sequences)."""


class PlacementSpec(Strict):
    """For each parallel axis, the outermost network tier its process groups span (a cluster tier
    or a topology level: at most ``MAX_LEVEL_NAME`` characters)."""

    tp: str | None = Field(
        default=None, max_length=MAX_LEVEL_NAME, description="Outermost network tier the tensor-parallel groups span."
    )
    cp: str | None = Field(
        default=None, max_length=MAX_LEVEL_NAME, description="Outermost network tier the context-parallel groups span."
    )
    ep: str | None = Field(
        default=None, max_length=MAX_LEVEL_NAME, description="Outermost network tier the expert-parallel groups span."
    )
    dp: str | None = Field(
        default=None, max_length=MAX_LEVEL_NAME, description="Outermost network tier the data-parallel groups span."
    )
    pp: str | None = Field(
        default=None, max_length=MAX_LEVEL_NAME, description="Outermost network tier the pipeline groups span."
    )


class Layout(Strict):
    """A parallel layout (``config`` in requests and plans)."""

    tp: int = Field(default=1, ge=1, le=MAX_NUM_GPUS, description="Tensor-parallel size (GPUs).")
    pp: int = Field(default=1, ge=1, le=MAX_LAYERS, description="Pipeline stages.")
    dp: int | None = Field(
        default=None, ge=1, le=MAX_NUM_GPUS, description="Data-parallel size; derived: num_gpus / (tp*pp*cp)."
    )
    cp: int = Field(default=1, ge=1, le=MAX_NUM_GPUS, description="Context-parallel size (sequence split, GPUs).")
    ep: int = Field(
        default=1,
        ge=1,
        le=MAX_NUM_GPUS,
        description="Expert-parallel size: ep*etp must divide tp*dp*cp, and ep must divide num_experts.",
    )
    etp: int = Field(
        default=1,
        ge=1,
        le=MAX_NUM_GPUS,
        description=(
            "Expert tensor-parallel size: each routed expert's FFN split etp ways (Megatron-Core's "
            "expert_tensor_parallel_size; MoE models only; 1: experts whole). ep*etp must divide tp*dp*cp "
            "and etp the expert FFN width."
        ),
    )
    vpp: int = Field(
        default=1, ge=1, le=MAX_LAYERS, description="Virtual pipeline chunks per stage (interleaving; 1: none)."
    )
    micro_batch_size: int = Field(default=1, ge=1, le=MAX_MICRO_BATCH_SIZE, description="Sequences per micro-batch.")
    zero_stage: ZeroStage = Field(
        default=1, description="ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + weights sharded over dp."
    )
    recompute: Recompute = Field(
        default="none",
        description=(
            "Activation recompute mode (docs/cost-model.md; framework names with training.framework). Default "
            "none, what Megatron-LM, Megatron-Bridge and DeepSpeed run unless asked to recompute."
        ),
    )
    sequence_parallel: bool | None = Field(
        default=None,
        description=(
            "Sequence parallelism for the TP group; default: tp > 1. It needs tp > 1, and an MoE model with "
            "tp > 1 needs it (422 at config.sequence_parallel otherwise)."
        ),
    )
    num_micro_batches: int | None = Field(
        default=None, ge=1, description="Micro-batches per step; derived: gbs / (dp * micro_batch_size)."
    )
    stage_layers: list[int] | None = Field(
        default=None,
        max_length=4096,
        description=(
            "Layers per pipeline chunk in schedule order (pp*vpp entries, each at least 1; the first "
            "and last may be 0: an embedding-only or loss-only chunk); null = as even as possible."
        ),
    )
    placement: PlacementSpec | None = Field(
        default=None, description="/evaluate: the tier each axis spans; null: derived from the rank order."
    )

    @model_validator(mode="after")
    def _defaults(self) -> Layout:
        if self.sequence_parallel is None:
            self.sequence_parallel = self.tp > 1
        return self

    @property
    def stated_gpus(self) -> int:
        """tp x pp x cp x dp when ``dp`` is given; 0 when the job's GPU count sizes ``dp``."""
        return self.tp * self.pp * self.cp * (self.dp or 0)


class LayoutFix(Strict):
    """Layout fields to pin during search."""

    tp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the tensor-parallel size.")
    pp: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="Pin the pipeline stages.")
    dp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the data-parallel size.")
    cp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the context-parallel size.")
    ep: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the expert-parallel size.")
    etp: int | None = Field(
        default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the expert tensor-parallel size (MoE models)."
    )
    vpp: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="Pin the virtual pipeline chunks per stage.")
    micro_batch_size: int | None = Field(
        default=None, ge=1, le=MAX_MICRO_BATCH_SIZE, description="Pin the micro-batch size (sequences)."
    )
    zero_stage: ZeroStage | None = Field(default=None, description="Pin the ZeRO stage.")
    recompute: Recompute | None = Field(default=None, description="Pin the recompute mode.")
    sequence_parallel: bool | None = Field(default=None, description="Pin sequence parallelism on or off.")


def _allowed(limit: int) -> Any:
    """A ``search.allow`` list of sizes: at most ``MAX_ALLOW_VALUES`` values, each 1..``limit``."""
    return Annotated[list[Annotated[int, Field(ge=1, le=limit)]], Field(max_length=MAX_ALLOW_VALUES)]


class LayoutAllow(Strict):
    """Candidate values per layout field during search (each list at most ``MAX_ALLOW_VALUES``)."""

    tp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Tensor-parallel sizes to search.")  # type: ignore[valid-type]
    pp: _allowed(MAX_LAYERS) | None = Field(default=None, description="Pipeline stage counts to search.")  # type: ignore[valid-type]
    dp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Data-parallel sizes to search.")  # type: ignore[valid-type]
    cp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Context-parallel sizes to search.")  # type: ignore[valid-type]
    ep: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Expert-parallel sizes to search.")  # type: ignore[valid-type]
    etp: _allowed(MAX_NUM_GPUS) | None = Field(  # type: ignore[valid-type]
        default=None,
        description=(
            "Expert tensor-parallel sizes to search (any the layout rules allow). Default for MoE models: 1 and, "
            "with tp > 1, tp (where a target framework runs it)."
        ),
    )
    vpp: _allowed(MAX_LAYERS) | None = Field(  # type: ignore[valid-type]
        default=None,
        description=(
            "Interleaving depths to search (any the layout rules allow: pp*vpp <= num_layers). For models whose "
            "dense and MoE layers alternate (an MoE "
            "layer frequency above 1), depths whose "
            "pp*vpp chunks cannot hold equal layer counts are searched by default only when they add at most "
            "40,000 layouts to the space, and otherwise only when listed here (or pinned with fix.vpp); for every "
            "other model they are searched by default."
        ),
    )
    micro_batch_size: _allowed(MAX_MICRO_BATCH_SIZE) | None = Field(  # type: ignore[valid-type]
        default=None, description="Micro-batch sizes (sequences) to search."
    )
    zero_stage: list[ZeroStage] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="ZeRO stages to search."
    )
    recompute: list[Recompute] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="Recompute modes to search."
    )
    sequence_parallel: list[bool] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="Sequence-parallel settings to search."
    )

    @model_validator(mode="after")
    def _non_empty(self) -> LayoutAllow:
        for name, values in self:
            if values is not None and len(values) == 0:
                raise ValueError(f"allow.{name} is empty: no candidate value is allowed")
            if values is not None and name not in ("zero_stage", "recompute", "sequence_parallel"):
                bad = [v for v in values if v < 1]
                if bad:
                    raise ValueError(f"allow.{name} has non-positive values {bad}")
        return self
