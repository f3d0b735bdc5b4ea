"""How a /plan request searches: the objective, plans wanted, time limit, pinned and allowed values."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from optimizer.specs.layout import LayoutAllow, LayoutFix
from optimizer.strict_model import Strict

Objective = Literal["throughput", "time_to_train", "cost", "energy", "goodput_throughput"]
"""What ranks the plans: step time (``throughput``), wall-clock days to the token budget
(``time_to_train``), dollars (``cost``), megawatt-hours (``energy``), or tokens per second after
checkpoints, failures and restarts (``goodput_throughput``)."""

MAX_MEMORY_HEADROOM_GIB = 64
"""The most memory a request may keep free per GPU (``search.memory_headroom_gib``, and
/evaluate's and /compare's ``memory_headroom_gib``)."""


class SearchSpec(Strict):
    top_k: int = Field(default=5, ge=1, le=50, description="Plans to return (best first).")
    objective: Objective = Field(
        default="throughput",
        description=(
            "What ranks the plans. throughput: step time. time_to_train and goodput_throughput: seconds per "
            "delivered token (tokens/s times goodput.fraction); cost: dollars per delivered token (without a price "
            "the answer warns and cost_usd is null); energy: joules per delivered token. None needs a token budget. "
            "The search finds the fastest layouts; the others re-rank them (at one GPU count they differ only "
            "through power and goodput)."
        ),
    )
    suggest: bool = Field(
        default=True,
        description="Also plan a few nearby GPU counts when cheap, and list the clearly better ones in suggestions.",
    )
    time_limit_s: float = Field(
        default=10.0,
        gt=0,
        description="Search time budget (s); values above the server's max_time_limit_s are clamped to it.",
    )
    fix: LayoutFix = Field(default_factory=LayoutFix, description="Layout fields pinned to one value.")
    allow: LayoutAllow = Field(default_factory=LayoutAllow, description="Candidate values per layout field.")
    memory_headroom_gib: float | None = Field(
        default=None,
        ge=0,
        le=MAX_MEMORY_HEADROOM_GIB,
        description="Memory kept free per GPU (GiB); default: the cost model's documented value.",
    )
    diverse: bool = Field(
        default=True,
        description=(
            "true: the top-k are the best plan of each of k layout families (tp, pp, dp, cp, ep, etp); false: the raw "
            "top-k layouts, which may differ only in micro-batch, depth, ZeRO stage or recompute."
        ),
    )
