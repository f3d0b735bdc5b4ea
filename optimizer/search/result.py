"""What a search answers, before it becomes a response: the ranked estimates and the solver's
account (``optimizer.service`` turns it into a ``PlanResponse`` with plans)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from optimizer.cost import Estimate
from optimizer.results import SolverInfo
from optimizer.specs import JobSpec

SearchStatus = Literal["optimal", "feasible", "infeasible"]


@dataclass(frozen=True)
class SearchResult:
    """The top-k of a search, best first (empty for a no-plan answer, which ``explanation``
    explains), with the solver's statistics and the warnings the search raised."""

    status: SearchStatus
    estimates: tuple[Estimate, ...]
    solver: SolverInfo
    job: JobSpec
    warnings: tuple[str, ...] = ()
    explanation: str | None = None
