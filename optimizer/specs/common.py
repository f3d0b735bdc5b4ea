"""Value types and limits the request specs share."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator

from optimizer.modes import Axis

Precision = Literal["bf16", "fp16", "fp8", "fp4"]
"""GEMM precision; everything else runs in bf16 (fp16 for ``fp16``). ``fp8``: FP8 GEMMs
(Transformer Engine hybrid / torchao float8); ``fp4``: block-scaled FP4 GEMMs (NVFP4) on GPUs with
FP4 tensor cores."""
Recompute = Literal["none", "selective", "op", "moe", "full", "core_attn"]
"""Activation recompute. ``selective``: the attention core (Megatron), norms and activation
functions, and on MLA models the up-projections (the latents are kept). ``op``: torchtitan's
op-level selective checkpointing: keeps the attention output, the expert all-to-all output and
every second matmul output; re-runs the other matmuls, the elementwise ops and the tensor-parallel
all-gathers / all-reduces in backward (searched only when ``search.allow`` or ``search.fix`` names
it). ``moe``: ``selective`` plus the whole MoE block
(router, dispatch, experts, combine), recomputed from its input (MoE models only). ``full``: every
layer from its input. ``core_attn``: Megatron-Core's selective recompute (its default module
``core_attn``, plus ``mla_up_proj`` on MLA models): the attention core only, norm and activation
outputs kept (what Megatron-LM and Megatron-Bridge run as ``selective``). With
``training.framework`` named, ``recompute`` takes that framework's own names instead
(docs/frameworks.md)."""
Framework = Literal["megatron-lm", "megatron-bridge", "torchtitan", "deepspeed"]
Activation = Literal["swiglu", "gelu"]
AXES: tuple[str, ...] = tuple(Axis)
"""Parallel axes that own process groups, in the canonical (innermost-first) rank order."""

MAX_NUM_GPUS = 1_048_576
MAX_LAYERS = 1_024
MAX_HIDDEN = 131_072


MAX_ALLOW_VALUES = 256
"""Most candidate values one ``search.allow`` list may hold (720,720 GPUs have 240 divisors)."""


def _integer_stage(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be one of 0, 1, 2 or 3, not a boolean")
    if isinstance(value, float):
        raise ValueError("Input should be a valid integer (0, 1, 2 or 3), not a float")
    return value


ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(_integer_stage)]
"""ZeRO stage; ``Literal`` alone would take ``true`` for 1 and ``2.0`` for 2 (it compares by
equality), where every other integer field refuses floats."""


def check_derived_bounds(model: BaseModel, fields: tuple[str, ...], derived_from: str) -> None:
    """Raise ``ValueError`` when a field a validator worked out (from ``derived_from``) is
    outside the bounds its ``Field`` declares: the request then gets a 422 naming the fields it
    gave, not a failure when the value is validated again later."""
    for name in fields:
        value = getattr(model, name)
        if value is None:
            continue
        for meta in type(model).model_fields[name].metadata:
            high, low = getattr(meta, "le", None), getattr(meta, "ge", None)
            if (high is not None and value > high) or (low is not None and value < low):
                bound = f"at most {high:,}" if high is not None and value > high else f"at least {low:,}"
                raise ValueError(f"{name} worked out from {derived_from} is {value:,}; it must be {bound}")
