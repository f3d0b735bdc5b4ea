"""Domain errors: invalid input (a 4xx for clients) versus an infeasible job (an answer)."""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every error the planner raises on purpose."""


class InvalidLayout(PlannerError):
    """A layout breaks a hard rule (sizes that do not divide, product != num_gpus, ...).

    ``field`` names the offending layout field (``config.tp``), ``reason`` says why.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Picklable with its own arguments (sweep points raise it in worker processes)."""
        return (type(self), (self.field, self.reason))


class UnknownCatalogId(PlannerError):
    """A catalog id that does not exist; carries the valid ids for the message."""

    def __init__(self, kind: str, requested: str, valid: list[str]) -> None:
        shown = requested if len(requested) <= 80 else f"{requested[:80]}... ({len(requested):,} characters)"
        super().__init__(f"unknown {kind} id {shown!r}; valid ids: {', '.join(sorted(valid))}")
        self.kind = kind
        self.requested = requested
        self.valid = sorted(valid)

    def __reduce__(self) -> tuple[type, tuple[str, str, list[str]]]:
        return (type(self), (self.kind, self.requested, self.valid))
