"""What ``benchmarks/validation.py`` returns: per-row results, error statistics, the rankings
within comparison groups, and the report that holds them (:class:`ValidationReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.calibration_rows import Skipped

MEDIAN_TARGET_PCT = 8.0
P90_TARGET_PCT = 20.0


@dataclass(frozen=True)
class RowResult:
    id: str
    model: str
    gpu_class: str
    kind: str
    num_gpus: int
    comparison_group: str | None
    layout: dict[str, Any]
    searched: tuple[str, ...]
    """Knobs the source did not state (chosen by the cost model)."""
    measured: float
    measurement: str
    predicted: float
    error_pct: float
    """(predicted - measured) / measured, percent."""
    fits: bool
    bottleneck: str
    mfu: float
    memory_gib: float
    step_time_s: float
    breakdown_s: dict[str, float]
    candidates: int
    notes: tuple[str, ...] = ()

    @property
    def layout_str(self) -> str:
        lay, s = self.layout, set(self.searched)

        def mark(k: str) -> str:
            return "*" if k in s else ""

        parts = [f"tp{lay['tp']}", f"pp{lay['pp']}", f"dp{lay['dp']}"]
        if lay["cp"] > 1:
            parts.append(f"cp{lay['cp']}")
        if lay["ep"] > 1:
            parts.append(f"ep{lay['ep']}")
        if lay["pp"] > 1:
            parts.append(f"vpp{lay['vpp']}{mark('vpp')}")
        parts.append(f"mbs{lay['micro_batch_size']}{mark('micro_batch_size')}")
        parts.append(f"z{lay['zero_stage']}{mark('zero_stage')}")
        parts.append(f"rc:{lay['recompute']}{mark('recompute')}")
        if lay["sequence_parallel"]:
            parts.append("sp")
        return " ".join(parts)


@dataclass(frozen=True)
class ErrorStats:
    n: int
    median_abs_pct: float
    p90_abs_pct: float
    mean_signed_pct: float
    """Mean of (predicted - measured) / measured: > 0 over-predicts throughput."""


@dataclass(frozen=True)
class GroupRanking:
    group: str
    n: int
    spearman: float | None
    pairwise_agreement: float | None
    """Fraction of non-tied measured pairs whose predicted order matches."""
    ids: tuple[str, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def order_matches(self) -> bool | None:
        return None if self.pairwise_agreement is None else self.pairwise_agreement == 1.0


@dataclass(frozen=True)
class Summary:
    rows_used: int
    rows_skipped: int
    overall: ErrorStats
    oom_ids: tuple[str, ...]
    by_gpu: dict[str, ErrorStats]
    by_kind: dict[str, ErrorStats]
    by_measurement: dict[str, ErrorStats]
    by_source: dict[str, ErrorStats]
    groups: tuple[GroupRanking, ...]

    @property
    def median_abs_pct(self) -> float:
        return self.overall.median_abs_pct

    @property
    def p90_abs_pct(self) -> float:
        return self.overall.p90_abs_pct

    @property
    def oom_count(self) -> int:
        return len(self.oom_ids)

    @property
    def mean_pairwise_agreement(self) -> float | None:
        vals = [g.pairwise_agreement for g in self.groups if g.pairwise_agreement is not None]
        return float(np.mean(vals)) if vals else None

    def passes(self) -> bool:
        return self.median_abs_pct <= MEDIAN_TARGET_PCT and self.p90_abs_pct <= P90_TARGET_PCT and self.oom_count == 0


@dataclass(frozen=True)
class ValidationReport:
    rows: tuple[RowResult, ...]
    skipped: tuple[Skipped, ...]
    summary: Summary
    flop_checks: tuple[tuple[str, str, float], ...] = field(default=())
    """(row id, FLOP definition, measured tokens/s x FLOPs per token / reported TFLOP/s - 1) for
    rows that report both: checks the definitions used to convert TFLOP/s-only rows."""
