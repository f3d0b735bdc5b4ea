"""The best published MFU per GPU and training precision in the calibration set
(``benchmarks/data/published_runs.json``): the numbers of the ``[[best]]`` tables of
``optimizer/data/job_checks.toml``, which a plan predicted above gets a warning.

A row's MFU here is the planner's definition: model FLOP/s a GPU over the catalog's dense peak
at the row's training precision (16-bit: bf16/fp16; fp8, mxfp8 and float8: the FP8 peak). It is
the published model TFLOP/s a GPU over that peak, or the published MFU when the source prints no
TFLOP/s (its sources state it against the same peak). Rows that count hardware FLOPs (recompute
included), or publish neither number, are left out. GPUs as ``calibration_rows.map_gpu`` maps
them; the H800 (same die and clocks as the H100) and the A100 40 GB share their sibling's row.

    .venv/bin/python benchmarks/job_checks.py          # table
    .venv/bin/python benchmarks/job_checks.py --check  # exit 1 unless job_checks.toml holds it
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.calibration_rows import Unmappable, load_rows, map_gpu, map_precision  # noqa: E402
from hardware_catalog.loader import load_catalog  # noqa: E402
from optimizer.job_warnings import load_job_checks  # noqa: E402

SHARED_GPUS = {
    "h100-sxm-80gb": ("h100-sxm-80gb", "h800-sxm-80gb"),
    "a100-sxm-80gb": ("a100-sxm-80gb", "a100-sxm-40gb"),
    "a100-sxm-40gb": ("a100-sxm-80gb", "a100-sxm-40gb"),
}
"""The catalog GPUs a row's GPU stands for."""
TOLERANCE = 5e-5
"""The data file's MFUs are printed to four decimals."""


@dataclass(frozen=True)
class BestRun:
    gpus: tuple[str, ...]
    precision: str
    """"16-bit" or "fp8" (``JobChecks.best_for``'s keys)."""
    mfu: float
    run: str


def row_mfu(row: dict[str, Any]) -> tuple[tuple[str, ...], str, float] | None:
    """(GPUs, precision key, MFU) of a row in the planner's definition, or None (see the module)."""
    measured = row["measured"]
    if not (measured.get("tflops_kind") or "").startswith("model"):
        return None
    try:
        gpu, _, _ = map_gpu(row)
    except Unmappable:
        return None
    precision, _ = map_precision(row["config"].get("precision"))
    entry = load_catalog().gpus[gpu]
    peak = entry.fp8_dense_flops if precision == "fp8" else entry.bf16_dense_flops
    if peak is None:
        return None
    if measured.get("tflops_per_gpu"):
        mfu = float(measured["tflops_per_gpu"]) * 1e12 / peak.value
    elif measured.get("mfu"):
        mfu = float(measured["mfu"])
    else:
        return None
    return SHARED_GPUS.get(gpu, (gpu,)), "fp8" if precision == "fp8" else "16-bit", mfu


def best_published(rows: list[dict[str, Any]] | None = None) -> list[BestRun]:
    """The best row per (GPUs, precision), ordered by GPUs then precision."""
    best: dict[tuple[tuple[str, ...], str], BestRun] = {}
    for row in load_rows() if rows is None else rows:
        found = row_mfu(row)
        if found is None:
            continue
        gpus, precision, mfu = found
        if (gpus, precision) not in best or mfu > best[gpus, precision].mfu:
            best[gpus, precision] = BestRun(gpus, precision, round(mfu, 4), row["id"])
    return sorted(best.values(), key=lambda b: (b.gpus, b.precision))


def mismatches() -> list[str]:
    """How ``job_checks.toml``'s [[best]] tables differ from ``best_published``."""
    shipped = {(b.gpus, b.precision): b for b in load_job_checks().best_mfu}
    wanted = {(b.gpus, b.precision): b for b in best_published()}
    problems = [f"{key}: in job_checks.toml, no published row" for key in shipped.keys() - wanted.keys()]
    for key, want in wanted.items():
        have = shipped.get(key)
        if have is None:
            problems.append(f"{key}: missing, best published {want.mfu:.4f} ({want.run})")
        elif have.run != want.run or abs(have.mfu - want.mfu) > TOLERANCE:
            problems.append(f"{key}: {have.mfu:.4f} ({have.run}), best published {want.mfu:.4f} ({want.run})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 unless job_checks.toml holds the table")
    args = parser.parse_args()
    print(f"{'GPUs':<32} {'precision':<9} {'MFU':>7}  run")
    for b in best_published():
        print(f"{', '.join(b.gpus):<32} {b.precision:<9} {b.mfu:>7.4f}  {b.run}")
    problems = mismatches()
    for problem in problems:
        print("job_checks.toml:", problem)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
