"""The best published MFU per GPU and training precision in the calibration set
(``benchmarks/data/published_runs.json``): the numbers of the ``[[best]]`` tables of
``optimizer/data/job_checks.toml``, which a plan predicted above gets a warning.

A row's MFU here is the planner's definition: model FLOP/s a GPU over the catalog's dense peak
at the row's training precision (16-bit: bf16/fp16; fp8, mxfp8 and float8: the FP8 peak). It is
the published model TFLOP/s a GPU over that peak, or the published MFU when the source prints no
TFLOP/s (its sources state it against the same peak). Rows that count hardware FLOPs (recompute
included), or publish neither number, are left out. GPUs as ``calibration_rows.map_gpu`` maps
them; the H800 (same die and clocks as the H100) and the A100 40 GB share their sibling's row.

The same for MoE models, per model shape (``optimizer.model_mfu.ModelShape``: the row's model as
the calibration maps it), GPU, precision and sequence length, is ``optimizer/data/model_mfu.toml``;
there every mapped MoE row counts, its measured tokens/s turned into MFU with the planner's own FLOP
count (``planner_mfu``), so that a plan's predicted MFU compares with it like for like.

    .venv/bin/python benchmarks/job_checks.py          # tables
    .venv/bin/python benchmarks/job_checks.py --write  # (re)write model_mfu.toml
    .venv/bin/python benchmarks/job_checks.py --check  # exit 1 unless both data files hold them
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.calibration_rows import MappedRow, Unmappable, load_rows, map_all, map_gpu, map_precision  # noqa: E402
from hardware_catalog.loader import load_catalog  # noqa: E402
from optimizer.cost import build_context  # noqa: E402
from optimizer.job_warnings import load_job_checks  # noqa: E402
from optimizer.model_mfu import DATA_PATH as MODEL_MFU_PATH  # noqa: E402
from optimizer.model_mfu import ModelBest, load_model_bests, model_shape, precision_key  # noqa: E402

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


def planner_mfu(mr: MappedRow) -> float:
    """A mapped row's measured throughput as MFU in the planner's own definition (its model FLOPs
    per token over its dense peak at the row's precision), so that a plan's ``mfu`` compares with
    it directly (sources count attention FLOPs their own ways)."""
    ctx = build_context(mr.job)
    return mr.measured_tokens_per_s_per_gpu * ctx.flops.model_per_token / ctx.mfu_peak_flops


def model_bests() -> list[ModelBest]:
    """The best mapped MoE row per (model shape, GPUs, precision, sequence length), ordered by
    model, GPUs, precision and sequence length; MFU in the planner's definition (``planner_mfu``)."""
    top: dict[tuple, tuple[float, str, MappedRow]] = {}
    for mr in (m for m in map_all()[0] if m.job.model.moe is not None):
        gpu, precision = mr.job.cluster.gpu or "", mr.job.training.precision
        gpus, key_precision = SHARED_GPUS.get(gpu, (gpu,)), precision_key(precision)
        key = (model_shape(mr.job.model), gpus, key_precision, mr.job.training.seq_len)
        mfu = planner_mfu(mr)
        # the highest unrounded MFU; an exact tie goes to the smaller id, whatever the rows' order
        if key not in top or (mfu, top[key][1]) > (top[key][0], mr.id):
            top[key] = (mfu, mr.id, mr)
    best = [
        ModelBest(
            str(mr.row["model"]["name"]),
            shape,
            gpus,
            key_precision,
            round(mfu, 4),
            mr.id,
            mr.job.cluster.resolved_num_gpus,
            seq,
            str(mr.row["source"]["locator"]),
        )  # fmt: skip
        for (shape, gpus, key_precision, seq), (mfu, _, mr) in top.items()
    ]
    return sorted(best, key=lambda b: (b.model, b.gpus, b.precision, b.seq_len))


def model_mfu_toml(bests: list[ModelBest]) -> str:
    """``optimizer/data/model_mfu.toml``'s text for ``bests``."""
    lines = [
        "# The best MFU published per MoE model shape, GPU, training precision and sequence length",
        "# (optimizer/model_mfu.py).",
        "# Written by `.venv/bin/python benchmarks/job_checks.py --write` from the calibration set",
        "# (benchmarks/data/published_runs.json); do not edit by hand. MFU: the measured tokens/s a GPU",
        "# times the planner's model FLOPs per token, over the catalog's dense peak at the row's",
        "# precision: the planner's own definition, so that a plan's predicted MFU compares with it.",
    ]
    for b in bests:
        shape = ", ".join(f"{k} = {v}" for k, v in b.shape._asdict().items())
        lines += [
            "",
            "[[best]]",
            f"model = {json.dumps(b.model)}",
            f"shape = {{ {shape} }}",
            f"gpus = {json.dumps(list(b.gpus))}",
            f'precision = "{b.precision}"',
            f"mfu = {b.mfu}",
            f'run = "{b.run}"',
            f"num_gpus = {b.num_gpus}",
            f"seq_len = {b.seq_len}",
            f"source = {json.dumps(b.source)}",
        ]
    return "\n".join(lines) + "\n"


def model_mismatches() -> list[str]:
    """How ``model_mfu.toml`` differs from ``model_bests``."""
    shipped = {(b.shape, b.gpus, b.precision, b.seq_len): b for b in load_model_bests()}
    wanted = {(b.shape, b.gpus, b.precision, b.seq_len): b for b in model_bests()}
    problems = [f"model_mfu.toml {k[0]}: no published row" for k in shipped.keys() - wanted.keys()]
    for key, want in wanted.items():
        have = shipped.get(key)
        if have is None or have.run != want.run or abs(have.mfu - want.mfu) > TOLERANCE:
            problems.append(f"model_mfu.toml {want.model} {key[1:]}: best published {want.mfu:.4f} ({want.run})")
    return problems


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
    parser.add_argument("--check", action="store_true", help="exit 1 unless the data files hold the tables")
    parser.add_argument("--write", action="store_true", help="write optimizer/data/model_mfu.toml")
    args = parser.parse_args()
    print(f"{'GPUs':<32} {'precision':<9} {'MFU':>7}  run")
    for b in best_published():
        print(f"{', '.join(b.gpus):<32} {b.precision:<9} {b.mfu:>7.4f}  {b.run}")
    print(f"\n{'model':<48} {'GPUs':<28} {'precision':<9} {'seq':>7} {'MFU':>7}  run")
    for m in model_bests():
        print(f"{m.model[:48]:<48} {', '.join(m.gpus):<28} {m.precision:<9} {m.seq_len:>7} {m.mfu:>7.4f}  {m.run}")
    if args.write:
        MODEL_MFU_PATH.write_text(model_mfu_toml(model_bests()), encoding="utf-8")
        load_model_bests.cache_clear()
        print(f"wrote {MODEL_MFU_PATH.relative_to(Path(__file__).resolve().parent.parent)}")
    problems = mismatches() + model_mismatches()
    for problem in problems:
        print("job_checks.toml:", problem)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
