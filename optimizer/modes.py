"""Names the planner branches on, defined once: activation recompute modes, parallel axes and
the low-bit GEMM precisions.

The two enums are ``StrEnum``s whose values are the strings of the HTTP contract (``specs.Recompute``,
``specs.AXES``): a member equals, hashes and formats as its string, so requests, plans, cache
keys and messages read the same whichever of the two a value is.
"""

from __future__ import annotations

from enum import StrEnum


class RecomputeMode(StrEnum):
    """Activation recompute in the cost model's names (``specs.Recompute`` describes each)."""

    NONE = "none"
    CORE_ATTN = "core_attn"
    SELECTIVE = "selective"
    OP = "op"
    MOE = "moe"
    FULL = "full"

    def __repr__(self) -> str:
        """The string's repr, so that messages and lists read as they do with plain strings."""
        return repr(self.value)


class Axis(StrEnum):
    """A parallel axis that owns process groups."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"

    def __repr__(self) -> str:
        """The string's repr, so that messages and lists read as they do with plain strings."""
        return repr(self.value)


LOW_BIT_PRECISIONS: frozenset[str] = frozenset({"fp8", "fp4"})
"""``specs.Precision`` values whose GEMMs run below 16 bits (quantized inputs, scaling recipes,
low-bit weight copies)."""


def is_low_bit(precision: str) -> bool:
    """True for ``fp8`` and ``fp4`` GEMMs."""
    return precision in LOW_BIT_PRECISIONS


FLASH3_GENERATIONS = frozenset({"hopper", "blackwell", "blackwell-ultra"})
"""GPU generations with kernels of the FlashAttention-3 class (asynchronous warp-group MMA and
TMA: Hopper; tcgen05 on Blackwell, cuDNN 9.x and FlashAttention-4 kernels). Earlier NVIDIA parts
and the AMD parts in the catalog are costed with FlashAttention-2-class kernels."""
