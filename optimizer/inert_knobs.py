"""Stack knobs that do nothing for a job or for a layout: a framework runs the job (or the layout)
whatever they say, so they never decide which frameworks run it.

The plan's numbers are the same with or without such a knob; a framework that does not run its
value would still run the plan as costed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimizer.modes import LOW_BIT_PRECISIONS

PRECISION_KNOBS: dict[str, tuple[str, ...]] = {"fp8_saved_inputs": tuple(sorted(LOW_BIT_PRECISIONS))}
"""Stack knobs that act only at some ``training.precision`` values: at any other, a framework
runs the job whatever the knob says."""
MOE_KNOBS: tuple[str, ...] = ("ep_comm_overlap", "expert_gemm_host_splits")
"""Stack knobs that act only on MoE layers: a framework runs a dense job whatever they say."""
TP_KNOBS: tuple[str, ...] = ("tp_comm_overlap", "tp_dgrad_overlap")
"""Stack knobs that act only with tensor parallelism (a ``tp = 1`` layout runs whatever they say)."""
PP_KNOBS: tuple[str, ...] = ("pp_comm_overlap",)
"""Stack knobs that act only with pipeline parallelism (a ``pp = 1`` layout runs whatever they say)."""
EP_KNOBS: tuple[str, ...] = ("moe_dispatcher",)
"""Knobs of the expert dispatch, which a layout without expert parallelism (``ep x etp = 1``)
does not run (its launch names the all-to-all dispatcher)."""
EP_OVERLAP_KNOBS: tuple[str, ...] = ("ep_comm_overlap",)
"""The expert all-to-all overlap: it runs (and is costed) only with ``ep > 1``."""
SHARDED_KNOBS: tuple[str, ...] = ("fsdp_buffers",)
"""Knobs of ZeRO-2/3's buffers: nothing below ZeRO-2."""
DP_KNOBS: tuple[str, ...] = ("dp_comm_overlap",)
"""Knobs of the data-parallel collectives: nothing when no parameter is replicated over ranks."""


@dataclass(frozen=True)
class LayoutFacts:
    """What a layout says about the knobs' effect (None: any layout, the knob may act)."""

    tp: int | None = None
    pp: int | None = None
    zero_stage: int | None = None
    dp_ranks: int | None = None
    """The largest data-parallel group of its parameters: dense ``dp x cp``, expert
    ``tp x dp x cp / (ep x etp)``."""
    ep_etp: int | None = None
    tp_overlap_off: bool = False
    """The cost model applies no TP overlap to it (no sequence parallelism, or its TP group beyond
    one NVLink domain): ``tp_comm_overlap`` does nothing."""
    ep: int | None = None


ANY_LAYOUT = LayoutFacts()
"""No layout given: only the knobs inert for the job itself."""
SOME_LAYOUT = LayoutFacts(tp=1, pp=1, zero_stage=0, dp_ranks=1, ep_etp=1, tp_overlap_off=True, ep=1)
"""A layout on which every layout-dependent knob is inert: the frameworks whose stack runs the
job on some layout are those whose stack runs it there."""


def inert_knobs(training: Any, model: Any, facts: LayoutFacts) -> frozenset[str]:
    """The ``training`` knobs that do nothing for this job (``model``) on a layout of ``facts``."""
    inert: set[str] = {k for k, at in PRECISION_KNOBS.items() if getattr(training, "precision", None) not in at}
    if not model.is_moe:
        inert.update(MOE_KNOBS)
    if model.mla is not None or model.num_kv_heads in (None, model.num_attention_heads):
        inert.add("kv_expanded")  # no grouped-query attention: nothing to expand
    rules = (
        (facts.tp == 1, TP_KNOBS),
        (facts.pp == 1, PP_KNOBS),
        (facts.ep_etp == 1, EP_KNOBS),
        (facts.ep == 1, EP_OVERLAP_KNOBS),
        (facts.zero_stage is not None and facts.zero_stage < 2, SHARDED_KNOBS),
        (facts.dp_ranks == 1, DP_KNOBS),
        (facts.tp_overlap_off, ("tp_comm_overlap",)),
    )
    for applies, knobs in rules:
        if applies:
            inert.update(knobs)
    return frozenset(inert)


def layout_facts(lay: Any, is_moe: bool, tp_tier: str | None = None) -> LayoutFacts:
    """``LayoutFacts`` of a resolved layout whose TP groups span ``tp_tier`` (None: not placed)."""
    dense = lay.dp * lay.cp
    expert = lay.tp * lay.dp * lay.cp // (lay.ep * lay.etp) if is_moe else 1
    off = lay.tp > 1 and (not lay.sequence_parallel or tp_tier not in (None, "nvlink"))
    return LayoutFacts(lay.tp, lay.pp, lay.zero_stage, max(dense, expert), lay.ep * lay.etp, off, lay.ep)
