"""Model presets: published architectures a request can name (``{"model": {"preset": "llama3-70b"}}``).

The data lives in ``optimizer/data/models.toml``, one table per preset id, each with the source of
its numbers and the parameter count its authors published (the tests check ``optimizer.params``
against it). Every preset is validated as a ``ModelSpec`` when the file is loaded, so a broken
entry fails at start-up with a message naming its id, never inside a request.
"""

from __future__ import annotations

import functools
from typing import Any

from optimizer.preset_file import DATA_FILE, ModelPreset, PresetLoadError, parse_preset_tables, read_preset_document
from optimizer.specs.model import ModelSpec

__all__ = ["ModelPreset", "PresetLoadError", "load_model_presets", "parse_model_presets"]


def parse_model_presets(data: dict[str, Any], origin: str = "<data>") -> dict[str, ModelPreset]:
    """Presets from the parsed TOML document ``{"models": {id: {...}}}``, each checked as a ModelSpec.

    Raises ``PresetLoadError`` naming the preset id (and ``origin``) on the first broken entry.
    """
    return parse_preset_tables(data, origin, check=_check_as_model_spec)


def _check_as_model_spec(preset: ModelPreset) -> None:
    ModelSpec(**preset.architecture())


@functools.cache
def load_model_presets() -> dict[str, ModelPreset]:
    """All presets from ``optimizer/data/models.toml``, by id (parsed and validated once)."""
    return parse_model_presets(read_preset_document(), origin=DATA_FILE)
