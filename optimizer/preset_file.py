"""The model preset file, ``optimizer/data/models.toml``: one table per preset id, each with the
source of its numbers and the parameter count its authors published. This module reads and parses
it; ``optimizer.presets`` also checks every entry as a ``ModelSpec``, which applies presets.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_DATA_PACKAGE = "optimizer"
DATA_FILE = "data/models.toml"


class PresetLoadError(RuntimeError):
    """The preset file is broken (a server-side defect, not a client error)."""


class ModelPreset(BaseModel):
    """One preset: the ``ModelSpec`` architecture fields plus where they come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Preset id (the table name in models.toml).")
    # Architecture (the ModelSpec fields; ModelSpec applies its defaults to those left out).
    name: str = Field(min_length=1)
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int | None = None
    num_attention_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int
    activation: Literal["swiglu", "gelu"]
    tied_embeddings: bool
    mla: dict[str, int | None] | None = None
    moe: dict[str, int | None] | None = None
    sliding_window: int | None = None
    sliding_window_every: int = 1
    dropout: float = 0.0  # hidden and attention dropout: none in the presets' pretraining recipes as planned
    # Provenance.
    source: str = Field(min_length=3, description="Model card / config.json / paper the numbers come from.")
    published_total_params: int = Field(gt=0, description="Total parameters as the source states them.")
    published_active_params: int | None = Field(
        default=None, gt=0, description="Parameters active per token as published (MoE models only)."
    )
    published_active_excludes_embedding: bool = Field(
        default=False,
        description="The published active count leaves out the input embedding table (gpt-oss convention).",
    )
    note: str | None = None

    @model_validator(mode="after")
    def _check_active(self) -> ModelPreset:
        if self.moe is not None and self.published_active_params is None:
            raise ValueError("an MoE preset needs published_active_params")
        if self.moe is None and (self.published_active_params is not None or self.published_active_excludes_embedding):
            raise ValueError("published_active_params / published_active_excludes_embedding are for MoE presets only")
        return self

    def architecture(self) -> dict[str, Any]:
        """Exactly the ``ModelSpec`` architecture fields (mla/moe as plain dicts or None)."""
        return {
            "name": self.name,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "ffn_hidden_size": self.ffn_hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "activation": self.activation,
            "tied_embeddings": self.tied_embeddings,
            "mla": dict(self.mla) if self.mla is not None else None,
            "moe": dict(self.moe) if self.moe is not None else None,
            "sliding_window": self.sliding_window,
            "sliding_window_every": self.sliding_window_every,
            "dropout": self.dropout,
        }


def parse_preset_tables(
    data: dict[str, Any], origin: str = "<data>", check: Callable[[ModelPreset], object] | None = None
) -> dict[str, ModelPreset]:
    """Presets from the parsed TOML document ``{"models": {id: {...}}}``, each passed to ``check``
    (which raises ``ValidationError`` on a bad entry) when given.

    Raises ``PresetLoadError`` naming the preset id (and ``origin``) on the first broken entry.
    """
    unknown = set(data) - {"models"}
    if unknown:
        raise PresetLoadError(f"{origin}: unknown top-level keys {sorted(unknown)}; expected [models.<id>] tables")
    tables = data.get("models")
    if not isinstance(tables, dict) or not tables:
        raise PresetLoadError(f"{origin}: no [models.<id>] tables")
    presets: dict[str, ModelPreset] = {}
    for preset_id, table in tables.items():
        if not isinstance(table, dict):
            raise PresetLoadError(f"{origin}: model preset {preset_id!r} is not a table")
        if "id" in table:
            raise PresetLoadError(f"{origin}: model preset {preset_id!r}: 'id' comes from the table name")
        try:
            preset = ModelPreset(id=preset_id, **table)
            if check is not None:
                check(preset)
        except ValidationError as exc:
            raise PresetLoadError(f"{origin}: model preset {preset_id!r} is invalid: {exc}") from exc
        presets[preset_id] = preset
    return presets


def read_preset_document() -> dict[str, Any]:
    """The parsed ``optimizer/data/models.toml``."""
    ref = resources.files(_DATA_PACKAGE).joinpath(DATA_FILE)
    try:
        return tomllib.loads(ref.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PresetLoadError(f"{DATA_FILE}: cannot read model presets: {exc}") from exc


@functools.cache
def read_model_presets() -> dict[str, ModelPreset]:
    """All presets from ``optimizer/data/models.toml``, by id, as ``ModelSpec`` applies them (each
    checked as a ``ModelSpec`` by ``optimizer.presets.load_model_presets``, which the server runs
    at start-up)."""
    return parse_preset_tables(read_preset_document(), origin=DATA_FILE)
