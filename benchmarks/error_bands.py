"""Fit the plans' 80% error bands from the validation residuals, and check their coverage.

Every calibration row ``benchmarks/validation.py`` scores gives one residual,
``log(measured / predicted)`` tokens/s/GPU, in the class of its job (``optimizer.error_bands``:
dense / MoE, GPU generation, 16-bit / FP8-class precision). Each class, and each parent class
(precision merged, then generation, then kind), with at least ``MIN_ROWS`` rows gets the 10% and
90% split-conformal quantiles of its residuals (``quantile_pair``); the root class (all rows) always does. Plans of a class
without its own band use the nearest parent's.

Coverage is checked leave-one-source-out: for each source (a row's publication,
``validation.source_key``), the bands are fitted again without that source's rows, and each of
its rows counts as covered when its measured throughput lies in the range its class gets.

    .venv/bin/python benchmarks/error_bands.py            # table; writes the data file and docs
    .venv/bin/python benchmarks/error_bands.py --check    # exit 1 unless coverage is 70-90%
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.calibration_rows import DATA_PATH, load_rows, map_all
from benchmarks.validation import ValidationReport, run_validation, source_key
from optimizer.error_bands import ROOT_CLASS, BandClass, ErrorBand, band_class, lookup_band

DATA_OUT = ROOT / "optimizer" / "data" / "error_bands.toml"
DOC_OUT = ROOT / "docs" / "error_bands.md"
COMMAND = "make bands"
QUANTILE_LOW = 0.10
QUANTILE_HIGH = 0.90
MIN_ROWS = 10
"""Rows a class needs for its own band: with fewer, a 10th percentile rests on one run."""
COVERAGE_TARGET = (0.70, 0.90)


@dataclass(frozen=True)
class Residual:
    id: str
    source: str
    cls: BandClass
    log_ratio: float
    """log(measured / predicted) tokens/s/GPU: < 0 when the model is optimistic."""


@dataclass(frozen=True)
class HeldOut:
    """One row scored against bands fitted without its source."""

    residual: Residual
    band: ErrorBand
    covered: bool


@dataclass(frozen=True)
class Coverage:
    n: int
    covered: int

    @property
    def fraction(self) -> float:
        return self.covered / self.n if self.n else math.nan


# ---------------------------------------------------------------------------------------- fit


def residuals_from(rep: ValidationReport, raw_rows: list[dict[str, Any]]) -> list[Residual]:
    """One residual per scored row, classed by its mapped job."""
    jobs = {m.id: m.job for m in map_all(raw_rows)[0]}
    return [
        Residual(r.id, source_key(r.id), band_class(jobs[r.id]), math.log(r.measured / r.predicted)) for r in rep.rows
    ]


def quantile_pair(
    values: Iterable[float], q_low: float = QUANTILE_LOW, q_high: float = QUANTILE_HIGH
) -> tuple[float, float]:
    """Split-conformal order statistics of ``n`` values: the ``floor((n + 1) q_low)``-th and the
    ``ceil((n + 1) q_high)``-th smallest (clamped to 1 and ``n``). When a new run's residual is
    exchangeable with the class's, each tail holds it with probability at most ``q_low`` (resp.
    ``1 - q_high``): a finite-sample guarantee that plain percentiles (numpy's interpolation)
    lack, and slightly wider than them at the class sizes here."""
    arr = np.sort(np.asarray(list(values), dtype=float))
    n = arr.size
    low = max(1, math.floor((n + 1) * q_low))
    high = min(n, math.ceil((n + 1) * q_high))
    return float(arr[low - 1]), float(arr[high - 1])


def fit_bands(residuals: list[Residual], min_rows: int = MIN_ROWS) -> dict[BandClass, ErrorBand]:
    """A band for every class (leaf or parent) with ``min_rows`` rows or more, and for the root."""
    members: dict[BandClass, list[float]] = {}
    for r in residuals:
        for c in r.cls.lineage():
            members.setdefault(c, []).append(r.log_ratio)
    out = {}
    for c, vals in sorted(members.items()):
        if len(vals) >= min_rows or c == ROOT_CLASS:
            lo, hi = quantile_pair(vals)
            out[c] = ErrorBand(c, len(vals), lo, hi)
    return out


def leave_one_source_out(residuals: list[Residual], min_rows: int = MIN_ROWS) -> list[HeldOut]:
    """Each row against the bands of every other source's rows."""
    out = []
    for source in sorted({r.source for r in residuals}):
        train = [r for r in residuals if r.source != source]
        if not train:
            continue
        bands = fit_bands(train, min_rows)
        for r in residuals:
            if r.source == source:
                band = lookup_band(bands, r.cls)
                out.append(HeldOut(r, band, band.covers(r.log_ratio)))
    return out


def coverage_by(held: list[HeldOut], key: Callable[[HeldOut], str]) -> dict[str, Coverage]:
    groups: dict[str, list[HeldOut]] = {}
    for h in held:
        groups.setdefault(key(h), []).append(h)
    return {k: _coverage(v) for k, v in sorted(groups.items())}


def _coverage(held: list[HeldOut]) -> Coverage:
    return Coverage(len(held), sum(h.covered for h in held))


# ---------------------------------------------------------------------------------------- output


def render_toml(bands: dict[BandClass, ErrorBand], residuals: list[Residual], overall: Coverage, data: Path) -> str:
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    generations = sorted({r.cls.generation for r in residuals})
    lines = [
        f"# 80% error bands of the cost model's tokens/s/GPU, by class of run. Generated by `{COMMAND}`",
        "# (benchmarks/error_bands.py) from the residuals of benchmarks/validation.py; do not edit by hand.",
        "# log_low / log_high: quantiles of log(measured / predicted) over the class's calibration rows",
        "# (measured values from the rows named by [meta] data; kind: measured). A class without a",
        "# table here uses its nearest parent's (precision merged, then generation, then kind; '*' = any).",
        "",
        "[meta]",
        f'data = "{data.relative_to(ROOT) if data.is_relative_to(ROOT) else data.name}"',
        f'data_sha256 = "{digest}"',
        f"rows = {len(residuals)}",
        f"quantile_low = {QUANTILE_LOW}",
        f"quantile_high = {QUANTILE_HIGH}",
        f"min_rows = {MIN_ROWS}",
        "generations = [" + ", ".join(f'"{g}"' for g in generations) + "]",
        f"loso_coverage = {overall.fraction:.4f}",
        f'loso_coverage_rows = "{overall.covered} of {overall.n}"',
    ]
    for c, b in bands.items():
        lines += [
            "",
            "[[band]]",
            f'kind = "{c.kind}"',
            f'generation = "{c.generation}"',
            f'precision = "{c.precision}"',
            f"rows = {b.rows}",
            f"log_low = {b.log_low:.6f}",
            f"log_high = {b.log_high:.6f}",
        ]
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


def _band_rows(bands: dict[BandClass, ErrorBand]) -> list[list[str]]:
    out = []
    for c, b in bands.items():
        lo, hi = b.throughput_factors
        out.append([c.label, str(b.rows), f"{b.log_low:+.3f}", f"{b.log_high:+.3f}", f"{lo:.3f} - {hi:.3f}"])
    return out


def _class_rows(residuals: list[Residual], bands: dict[BandClass, ErrorBand], held: list[HeldOut]) -> list[list[str]]:
    cov = coverage_by(held, lambda h: h.residual.cls.label)
    out = []
    for cls in sorted({r.cls for r in residuals}):
        c = cov.get(cls.label, Coverage(0, 0))
        out.append([cls.label, str(c.n), lookup_band(bands, cls).cls.label, f"{c.covered} of {c.n}", _pct(c.fraction)])
    return out


def md_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def render_markdown(residuals: list[Residual], bands: dict[BandClass, ErrorBand], held: list[HeldOut]) -> str:
    overall = _coverage(held)
    lo_t, hi_t = COVERAGE_TARGET
    by_source = coverage_by(held, lambda h: h.residual.source)
    by_kind = coverage_by(held, lambda h: h.residual.cls.kind)
    misses = sorted((h for h in held if not h.covered), key=lambda h: h.residual.log_ratio)
    return "\n".join([
        "# Error bands on plans",
        "",
        f"Generated by `{COMMAND}` (`benchmarks/error_bands.py`; do not edit by hand). Every plan from",
        "`/plan`, `/evaluate` and `pplan` carries `tokens_per_s_per_gpu_range` and `step_time_s_range`:",
        "80% intervals around the prediction, from how far the cost model missed comparable published",
        "runs (docs/validation.md).",
        "",
        "## How the band is derived",
        "",
        "1. Each calibration row the validation scores gives a residual `log(measured / predicted)`",
        "   tokens/s/GPU (negative: the model was optimistic).",
        "2. Rows are classed by model kind (dense / MoE), GPU generation (Ampere / Hopper / Blackwell;",
        "   Blackwell Ultra counts as Blackwell) and precision (16-bit: bf16, fp16; FP8-class: fp8, fp4).",
        f"3. A class with at least {MIN_ROWS} rows gets the {QUANTILE_LOW:.0%} and {QUANTILE_HIGH:.0%} split-conformal quantiles",
        "   of its n residuals: the floor((n + 1) x 0.1)-th and ceil((n + 1) x 0.9)-th smallest, so a",
        "   new run like the class's lands in each tail at most 10% of the time. A class with fewer rows is merged",
        "   into its parent: precision is dropped first, then GPU generation, then model kind, down to",
        "   all rows. A job's band is its own class's, else the nearest parent's.",
        "4. A plan's range is `predicted x [exp(min(q10, 0)), exp(max(q90, 0))]` tokens/s/GPU; the step",
        "   time range is the step time divided by the same factors, high end first, so",
        "   `step_time_s = tokens per step / (throughput x GPUs)` holds at both ends. Clamping at 0 keeps",
        "   the prediction inside its range when every run of a class was on one side of it.",
        "5. A job on a GPU generation without calibration rows gets the band of its model kind (or of",
        "   all runs) and a plan note saying so.",
        "",
        "Coverage is checked leave-one-source-out, so no interval is fitted to the row it covers: for",
        "each source (the publication a row comes from, its id prefix: SC'21's two tables together, every",
        "Megatron-Bridge release together) the bands are fitted again without its rows,",
        "and each of its rows counts as covered when the measured throughput lies in its range.",
        "",
        "## Bands",
        "",
        f"Fitted on {len(residuals)} rows.",
        "",
        md_table(["class", "rows", "q10 log(meas/pred)", "q90 log(meas/pred)", "throughput factors"],
                  _band_rows(bands)),
        "",
        "## Coverage (leave one source out)",
        "",
        f"- overall: {overall.covered} of {overall.n} rows, {_pct(overall.fraction)} "
        f"(target {lo_t:.0%} - {hi_t:.0%})",
        *(f"- {k}: {c.covered} of {c.n} rows, {_pct(c.fraction)}" for k, c in by_kind.items()),
        "",
        "By class (band used: the band that class gets from all rows):",
        "",
        md_table(["class", "rows", "band used", "covered", "coverage"], _class_rows(residuals, bands, held)),
        "",
        "By held-out source:",
        "",
        md_table(["source", "rows", "covered", "coverage"],
                  [[k, str(c.n), str(c.covered), _pct(c.fraction)] for k, c in by_source.items()]),
        "",
        "Rows outside their held-out range:",
        "",
        md_table(["id", "class", "log(meas/pred)", "held-out band"],
                  [[h.residual.id, h.residual.cls.label, f"{h.residual.log_ratio:+.3f}",
                    f"{h.band.cls.label} [{min(h.band.log_low, 0):+.3f}, {max(h.band.log_high, 0):+.3f}]"]
                   for h in misses]),
        "",
    ])  # fmt: skip


def render_text(bands: dict[BandClass, ErrorBand], held: list[HeldOut]) -> str:
    out = ["class                          rows   q10      q90"]
    out += [f"{c.label:30s} {b.rows:4d}  {b.log_low:+.3f}  {b.log_high:+.3f}" for c, b in bands.items()]
    overall = _coverage(held)
    out.append(f"\nleave-one-source-out coverage: {overall.covered} of {overall.n} ({_pct(overall.fraction)})")
    for k, c in coverage_by(held, lambda h: h.residual.cls.label).items():
        out.append(f"  {k:30s} {c.covered:3d} of {c.n:3d} ({_pct(c.fraction)})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the coverage is within 70-90%%")
    ap.add_argument("--no-write", action="store_true", help="print only; write neither the data file nor the docs")
    ap.add_argument("--rows", type=Path, default=DATA_PATH, help="calibration rows (JSON list)")
    args = ap.parse_args(argv)
    raw = load_rows(args.rows)
    residuals = residuals_from(run_validation(rows=raw), raw)
    bands = fit_bands(residuals)
    held = leave_one_source_out(residuals)
    overall = _coverage(held)
    print(render_text(bands, held))
    if not args.no_write:
        DATA_OUT.write_text(render_toml(bands, residuals, overall, args.rows.resolve()), encoding="utf-8")
        DOC_OUT.write_text(render_markdown(residuals, bands, held), encoding="utf-8")
        print(f"\nwrote {DATA_OUT.relative_to(ROOT)} and {DOC_OUT.relative_to(ROOT)}")
    lo, hi = COVERAGE_TARGET
    if args.check and not lo <= overall.fraction <= hi:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
