"""Megatron-Bridge's ``comm_overlap`` section as a plan's overrides set it: field by field on a
recipe that has the section, as one whole section on a recipe that has none (Hydra refuses keys
under a None section), field by field with a note where the recipe is not known."""

from __future__ import annotations

from optimizer.specs import ModelSpec

RECIPES_WITH_SECTION = ("llama2-7b", "llama3-", "llama3.1-", "gpt3-", "deepseek-")
"""Model presets whose Megatron-Bridge v0.1.0rc4 recipe builds ``comm_overlap=CommOverlapConfig(...)``
(``src/megatron/bridge/recipes/llama/llama2_7b.py``, ``llama3_*.py``, ``llama31_*.py``,
``gpt/gpt3_175b.py``, ``deepseek/deepseek_v3.py`` at 6725f7049)."""

RECIPES_WITHOUT_SECTION = ("qwen3-", "llama4-")
"""Model presets whose recipe leaves ``comm_overlap`` None (``recipes/qwen/qwen3_*.py``,
``recipes/llama/llama4_e16.py``, ``llama4_e128.py`` at 6725f7049)."""

SECTION_TARGET = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
"""The section's class: an override ``comm_overlap={_target_:...,...}`` builds it where the recipe
has none (``utils/omegaconf_utils.py`` ``apply_overrides``); ``tp_comm_overlap`` has no default."""


def recipe_has_section(model: ModelSpec) -> bool | None:
    """Whether the model's Megatron-Bridge recipe has a ``comm_overlap`` section (None: no
    recipe of this preset is known, e.g. a custom model)."""
    preset = model.preset or ""
    if preset.startswith(RECIPES_WITH_SECTION):
        return True
    if preset.startswith(RECIPES_WITHOUT_SECTION):
        return False
    return None


def hydra_value(value: object) -> str:
    """A value as a Hydra override writes it (``null``, ``true`` / ``false``, else ``str``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def section_tokens(model: ModelSpec, fields: list[tuple[str, object]], tp_overlap: bool, no_defer: bool) -> list[str]:
    """The override tokens that give the section ``fields`` (names without ``comm_overlap.``) and
    TP overlap ``tp_overlap`` as costed. ``no_defer``: the layout cannot defer the embedding's
    weight gradient (pp 1, or no gradient-accumulation fusion: Megatron-Core's
    ``model_parallel_config.py`` refuses it), which the recipes with a section turn on."""
    has = recipe_has_section(model)
    if has is None:  # field by field, and TP overlap only when on (the recipe's otherwise)
        given = ([("tp_comm_overlap", True)] if tp_overlap else []) + fields
        return [f"comm_overlap.{k}={hydra_value(v)}" for k, v in given]
    named = [("tp_comm_overlap", tp_overlap), *fields]
    if has:
        named += [("defer_embedding_wgrad_compute", False)] if no_defer else []
        return [f"comm_overlap.{k}={hydra_value(v)}" for k, v in named]
    if not fields and not tp_overlap:  # no section: nothing overlapped, as planned
        return []
    body = ",".join([f"_target_:{SECTION_TARGET}"] + [f"{k}:{hydra_value(v)}" for k, v in named])
    return [f'"comm_overlap={{{body}}}"']  # quoted: a shell would brace-expand it
