"""Validate the cost model against published training runs (``benchmarks/data/published_runs.json``).

For every mappable row (``benchmarks/calibration_rows.py`` documents the mapping) the cost model
scores the stated layout; knobs the source did not state are searched over a small grid and the
fastest layout that fits in memory is kept. Predicted tokens/s/GPU is compared with the measured
value, and within each ``comparison_group`` the predicted order of layouts with the measured order.

    .venv/bin/python benchmarks/validation.py            # table + summary, writes docs/validation.md
    .venv/bin/python benchmarks/validation.py --check    # exit 1 if median > 8%, p90 > 20% or any OOM

``run_validation(cal)`` returns the same as a :class:`ValidationReport`, for a calibration fit that
scores an alternative :class:`optimizer.calibration.Calibration`.

The work is split over ``validation_run`` (scoring the rows), ``validation_stats`` (error
statistics and rankings), ``validation_results`` (the result types) and ``validation_report``
(the text and markdown output); this module is the command and re-exports what callers use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.validation_report import md_table, render_markdown, render_text, text_table
from benchmarks.validation_results import ValidationReport
from benchmarks.validation_run import evaluate_row, run_validation, source_key
from benchmarks.validation_stats import pairwise_agreement, spearman

DOC_PATH = ROOT / "docs" / "validation.md"

__all__ = [
    "DOC_PATH",
    "ValidationReport",
    "evaluate_row",
    "main",
    "md_table",
    "pairwise_agreement",
    "render_markdown",
    "render_text",
    "run_validation",
    "source_key",
    "spearman",
    "text_table",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if median > 8%%, p90 > 20%% or any predicted OOM")
    ap.add_argument("--no-write", action="store_true", help=f"do not write {DOC_PATH.relative_to(ROOT)}")
    ap.add_argument("--markdown", type=Path, default=DOC_PATH, help="where to write the markdown report")
    ap.add_argument(
        "--fp32-gradients", action="store_true",
        help="what-if: cost every bf16 row with fp32 gradients (training.grad_reduce_in_fp32); implies --no-write",
    )  # fmt: skip
    args = ap.parse_args(argv)
    rep = run_validation(fp32_gradients=args.fp32_gradients)
    print(render_text(rep))
    if not args.no_write and not args.fp32_gradients:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(render_markdown(rep), encoding="utf-8")
        print(f"\nwrote {args.markdown}")
    if args.check and not rep.summary.passes():
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
