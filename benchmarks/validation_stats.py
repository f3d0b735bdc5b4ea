"""Error statistics of validation rows and how well the predicted order of layouts matches the
measured one within a comparison group (Spearman, pairwise agreement)."""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations

import numpy as np

from benchmarks.validation_results import ErrorStats, GroupRanking, RowResult

TIE_REL = 0.005
"""Measured values closer than this (relative) count as a tie in the ranking comparison."""


def _stats(rows: list[RowResult]) -> ErrorStats:
    if not rows:
        return ErrorStats(0, math.nan, math.nan, math.nan)
    err = np.array([r.error_pct for r in rows])
    return ErrorStats(
        n=len(rows),
        median_abs_pct=float(np.median(np.abs(err))),
        p90_abs_pct=float(np.percentile(np.abs(err), 90)),
        mean_signed_pct=float(np.mean(err)),
    )


def _ranks(values: list[float]) -> np.ndarray:
    """Average ranks (ties share the mean rank)."""
    arr = np.asarray(values, dtype=float)
    order = np.argsort(arr, kind="mergesort")
    ranks = np.empty(len(arr))
    i = 0
    while i < len(arr):
        j = i
        while j + 1 < len(arr) and arr[order[j + 1]] == arr[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if np.std(ra) == 0 or np.std(rb) == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def pairwise_agreement(measured: list[float], predicted: list[float]) -> float | None:
    """Fraction of non-tied measured pairs ordered the same way; a predicted tie counts 1/2.
    None when every prediction is the same: the rows have the same inputs (the same layout
    measured on different software releases), which a layout model cannot order."""
    if len(predicted) > 1 and max(predicted) - min(predicted) <= 1e-9 * max(abs(x) for x in predicted):
        return None
    agree = 0.0
    total = 0
    for i, j in combinations(range(len(measured)), 2):
        dm = measured[i] - measured[j]
        if abs(dm) <= TIE_REL * max(measured[i], measured[j]):
            continue
        total += 1
        dp = predicted[i] - predicted[j]
        if abs(dp) <= 1e-9 * max(abs(predicted[i]), abs(predicted[j])):
            agree += 0.5
        else:
            agree += float((dm > 0) == (dp > 0))
    return agree / total if total else None


def rank_groups(rows: list[RowResult]) -> tuple[GroupRanking, ...]:
    groups: dict[str, list[RowResult]] = {}
    for r in rows:
        if r.comparison_group:
            groups.setdefault(r.comparison_group, []).append(r)
    out = []
    for name, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        m = [r.measured for r in members]
        p = [r.predicted for r in members]
        out.append(
            GroupRanking(
                group=name,
                n=len(members),
                spearman=spearman(m, p),
                pairwise_agreement=pairwise_agreement(m, p),
                ids=tuple(r.id for r in members),
                measured=tuple(m),
                predicted=tuple(p),
            )
        )
    return tuple(out)


def _split(results: list[RowResult], key: Callable[[RowResult], str]) -> dict[str, ErrorStats]:
    return {k: _stats([r for r in results if key(r) == k]) for k in sorted({key(r) for r in results})}
