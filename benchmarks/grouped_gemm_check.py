"""The grouped expert GEMM term against the calibration set: the measured tokens-per-expert curve
(``optimizer/cost/grouped_gemm.py``) against the dense GEMM curve it replaces, and the fitted
host time per expert GEMM around its value.

Usage: ``python benchmarks/grouped_gemm_check.py``. Prints the two curves by tokens per expert,
then the validation errors (all rows, MoE rows, dense rows) and the Qwen3-235B 256-GPU group's
pairwise order agreement for each variant; docs/cost-model.md quotes them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.validation import run_validation
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost import grouped_gemm

GROUP = "modelzoo-qwen3-235b-256gpu"


def dense_curve(m: float) -> float:
    """The dense GEMM curve's factor for ``m`` rows (``layer_base.gemm_time_s``)."""
    return m / (m + DEFAULT.gemm_dim_half)


def summary_line(label: str, cal: Calibration, curve: Callable[[float], float]) -> str:
    with mock.patch.object(grouped_gemm, "m_efficiency", lambda m, _dim_half: curve(m)):
        s = run_validation(cal).summary
    moe, dense = s.by_kind["moe"], s.by_kind["dense"]
    group = next(g for g in s.groups if g.group == GROUP)
    return (
        f"{label:<34} {s.overall.median_abs_pct:6.2f} {s.overall.p90_abs_pct:6.2f}  "
        f"{moe.median_abs_pct:6.2f} {moe.p90_abs_pct:6.2f}  {dense.median_abs_pct:6.2f} {dense.p90_abs_pct:6.2f}  "
        f"{group.pairwise_agreement or 0.0:.2f}"
    )


def main() -> None:
    print("tokens per expert   measured e(m)   dense g(m)")
    for m in (128, 256, 512, 1024, 2048, 4096, 8192):
        print(f"{m:>17}   {grouped_gemm.m_efficiency(m):13.3f}   {dense_curve(m):10.3f}")
    print()
    print(f"{'variant':<34} {'all: median':>11} {'p90':>6}  {'moe':>6} {'p90':>6}  {'dense':>6} {'p90':>6}  {GROUP}")
    measured = grouped_gemm.m_efficiency
    print(summary_line(f"dense curve, host {DEFAULT.expert_gemm_host_s * 1e6:.0f} us", DEFAULT, dense_curve))
    for host_us in (0.0, 60.0, 65.0, 70.0, 75.0, 80.0):
        cal = dataclasses.replace(DEFAULT, expert_gemm_host_s=host_us * 1e-6)
        print(summary_line(f"measured curve, host {host_us:.0f} us", cal, measured))


if __name__ == "__main__":
    main()
