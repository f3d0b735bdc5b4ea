"""Framework rules that hold only for some jobs: ``[[<framework>.when]]`` tables of
``optimizer/data/frameworks.toml``, each read in the framework's source at the profile's version.

A rule matches a job by its model (``moe``, ``mla``) and ``training.*`` knob values (``knobs``: the
values it matches, or ``"set"`` for any value but null). A matching rule either excludes the
framework for the job (``excluded``: the reason; the framework then does not run the job as
costed, like a stack knob outside its ``runs``), narrows what it runs for the job (ZeRO stages,
recompute modes and pipelines without interleaving on expert-parallel layouts, tensor parallelism), or sets the default of
knobs the job leaves out (``defaults``, applied with the framework named; such rules match on
the model and ``training.precision`` only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SET = "set"
"""A knob condition that matches any value but null."""


@dataclass(frozen=True)
class When:
    """One ``[[<framework>.when]]`` rule."""

    moe: bool | None
    mla: bool | None
    knobs: tuple[tuple[str, tuple[Any, ...] | str], ...]
    source: str
    excluded: str | None = None
    zero_stages_without_pp: tuple[int, ...] | None = None
    zero_stages_with_pp: tuple[int, ...] | None = None
    ep_layouts_drop_recompute: tuple[str, ...] = ()
    """Cost-model recompute modes it does not run on layouts with ep > 1."""
    ep_layouts_pp_needs_vpp: bool = False
    """Layouts with ep > 1 and pp > 1 only interleaved."""
    ep_layouts_zero_stages: tuple[int, ...] | None = None
    """ZeRO stages it runs on layouts with ep > 1."""
    ep_group_sizes: tuple[int, ...] | None = None
    """Expert groups (``ep x etp`` ranks, more than one) it runs."""
    tensor_parallel: bool = True
    defaults: tuple[tuple[str, Any], ...] = ()
    shared_experts: bool | None = None
    """Matches an MoE model with (true) or without (false) shared experts."""
    activations: tuple[str, ...] | None = None
    """Matches a model whose FFN activation (default swiglu) is one of these."""

    def matches(self, training: Any, model: Any) -> bool:
        """Whether the job (``training``, ``model``: its specs) meets every condition."""
        if self.moe is not None and model.is_moe != self.moe:
            return False
        if self.mla is not None and (model.mla is not None) != self.mla:
            return False
        if self.shared_experts is not None and (
            model.moe is None or (model.moe.num_shared_experts > 0) != self.shared_experts
        ):
            return False
        if self.activations is not None and (model.activation or "swiglu") not in self.activations:
            return False
        for knob, values in self.knobs:
            value = getattr(training, knob)
            if (value is None) if values == SET else (value not in values):
                return False
        return True

    def involves(self, knobs: frozenset[str]) -> bool:
        """Whether any of the rule's knob conditions is on one of ``knobs``."""
        return any(knob in knobs for knob, _ in self.knobs)

    @property
    def narrows(self) -> bool:
        """Whether the rule changes what the framework runs (rather than excluding it or setting
        defaults)."""
        return (
            self.zero_stages_without_pp is not None
            or self.zero_stages_with_pp is not None
            or bool(self.ep_layouts_drop_recompute)
            or self.ep_layouts_pp_needs_vpp
            or self.ep_layouts_zero_stages is not None
            or self.ep_group_sizes is not None
            or not self.tensor_parallel
        )


def _tuple(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def parse_when(fid: str, raw: dict[str, Any]) -> When:
    """One rule from its TOML table (checked: it says what it does and where that was read)."""
    knobs = tuple((k, v if v == SET else tuple(v)) for k, v in raw.get("knobs", {}).items())
    rule = When(
        moe=raw.get("moe"),
        mla=raw.get("mla"),
        knobs=knobs,
        source=raw["source"],
        excluded=raw.get("excluded"),
        zero_stages_without_pp=_tuple(raw.get("zero_stages_without_pp")),
        zero_stages_with_pp=_tuple(raw.get("zero_stages_with_pp")),
        ep_layouts_drop_recompute=tuple(raw.get("ep_layouts_drop_recompute", ())),
        ep_layouts_pp_needs_vpp=bool(raw.get("ep_layouts_pp_needs_vpp", False)),
        ep_layouts_zero_stages=_tuple(raw.get("ep_layouts_zero_stages")),
        ep_group_sizes=_tuple(raw.get("ep_group_sizes")),
        tensor_parallel=bool(raw.get("tensor_parallel", True)),
        defaults=tuple(raw.get("defaults", {}).items()),
        shared_experts=raw.get("shared_experts"),
        activations=_tuple(raw.get("activations")),
    )
    if not (rule.excluded or rule.narrows or rule.defaults):
        raise ValueError(f"frameworks.toml {fid}.when: a rule must exclude, narrow or set defaults ({raw})")
    if rule.defaults and any(knob != "precision" for knob, _ in rule.knobs):
        raise ValueError(
            f"frameworks.toml {fid}.when: a rule with defaults matches on the model and precision only ({raw})"
        )
    return rule


def condition_text(rule: When) -> str:
    """The rule's conditions in words (for reasons and notes)."""
    parts = []
    if rule.moe is not None:
        parts.append("an MoE model" if rule.moe else "a dense model")
    if rule.mla is not None:
        parts.append("an MLA model" if rule.mla else "no MLA")
    if rule.shared_experts is not None:
        parts.append("shared experts" if rule.shared_experts else "no shared experts")
    if rule.activations is not None:
        parts.append("a " + " or ".join(rule.activations) + " FFN")
    for knob, values in rule.knobs:
        shown = "set" if values == SET else " or ".join(repr(v) for v in values)
        parts.append(f"training.{knob} {shown}")
    return ", ".join(parts)
