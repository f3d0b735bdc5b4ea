"""The base of every request model (``optimizer.specs``, ``optimizer.topology_spec``, sweeps)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base of every request model: unknown fields, type coercion (``"8"`` for 8, ``"yes"`` or 1
    for true, true for 1) and non-finite floats are a 422 naming the field. Request models added
    later inherit this by deriving from ``Strict``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
