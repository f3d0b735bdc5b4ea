"""Fit the cost model's few physical constants to the calibration set (coordinate descent).

Usage: ``python benchmarks/fit_calibration.py``. Prints the objective (median + 0.5 * p90 of the
absolute % error of tokens/s/GPU over ``benchmarks/data/published_runs.json``) for each trial
and the best constants; copy them into ``optimizer/calibration.py`` by hand (reviewed change).
Only shared, physically meaningful constants are fitted; nothing per model or per row.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.validation import run_validation
from optimizer.calibration import DEFAULT, Calibration

GRID: dict[str, list[float]] = {
    "gemm_training_fraction": [0.7, 0.75, 0.8, 0.825, 0.85, 0.875, 0.9],
    "attention_efficiency": [0.25, 0.28, 0.3, 0.32, 0.35, 0.4, 0.45, 0.55],
    "attention_efficiency_flash3": [0.45, 0.5, 0.55, 0.6, 0.65],
    "attention_seq_half": [0.0, 1024.0, 2048.0, 4096.0, 8192.0],
    "gemm_dim_half": [64.0, 96.0, 160.0, 256.0, 384.0],
    "tp_comm_overlap": [0.0, 0.25, 0.5, 0.75, 1.0],
    "dp_overlap": [0.5, 0.7, 0.9],
    "pp_comm_exposed": [0.25, 0.5, 1.0],
    "cp_overlap": [0.0, 0.5, 1.0],
    "expert_gemm_host_s": [0.0, 50e-6, 60e-6, 70e-6, 80e-6, 100e-6],
    "scale_out_all_to_all_efficiency": [0.5, 0.6, 0.63, 0.7, 0.77, 0.85, 1.0],
    "ep_load_imbalance": [1.0, 1.1, 1.25, 1.5],
    "ep_comm_overlap_batched": [0.3, 0.4, 0.5, 0.6, 0.75],
    "overlap_contention": [0.0, 0.05, 0.08, 0.12, 0.15, 0.2],
    "hbm_efficiency": [0.5, 0.75, 0.9],
    "fp8_cast_bytes": [0.0, 0.5, 1.0, 1.5],
    "unfused_elementwise_factor": [1.5, 2.0, 2.5, 2.75, 3.0],
    "power_clock_exponent": [0.33, 0.5, 0.75],
}


def objective(cal: Calibration) -> tuple[float, float, float]:
    s = run_validation(cal).summary
    med, p90 = s.overall.median_abs_pct, s.overall.p90_abs_pct
    return med + 0.5 * p90, med, p90


def main() -> None:
    best = DEFAULT
    best_obj = objective(best)
    print(f"start {best_obj}")
    for _ in range(2):
        for name, values in GRID.items():
            for v in values:
                trial = dataclasses.replace(best, **{name: v})
                obj = objective(trial)
                print(f"{name}={v}: obj={obj[0]:.2f} median={obj[1]:.2f} p90={obj[2]:.2f}", flush=True)
                if obj[0] < best_obj[0] - 1e-9:
                    best, best_obj = trial, obj
    print("best:", {f.name: getattr(best, f.name) for f in dataclasses.fields(best)})
    print("objective:", best_obj)


if __name__ == "__main__":
    main()
