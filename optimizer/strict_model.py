"""The base of every request model (``optimizer.specs``, ``optimizer.topology_spec``, sweeps)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic puts before a message raised in a validator."""


def error_reason(error: Any) -> str:
    """A pydantic error's message without the prefix pydantic adds to messages raised in
    validators: the reason itself, which is what a client needs."""
    msg = str(error.get("msg", ""))
    for prefix in VALIDATOR_PREFIXES:
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


class Strict(BaseModel):
    """Base of every request model: unknown fields, type coercion (``"8"`` for 8, ``"yes"`` or 1
    for true, true for 1) and non-finite floats are a 422 naming the field. Request models added
    later inherit this by deriving from ``Strict``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
