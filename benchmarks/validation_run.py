"""Score the calibration rows with the cost model (``benchmarks/validation.py``): every candidate
layout of a row, the fastest that fits kept, then the summary over all rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.calibration_rows import (
    MappedRow,
    Skipped,
    Unmappable,
    flop_definition,
    load_rows,
    map_all,
    map_row,
    source_flops_per_token,
)
from benchmarks.validation_results import RowResult, Summary, ValidationReport
from benchmarks.validation_stats import _split, _stats, rank_groups
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost import Estimate, best_estimate, build_context, resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.specs import JobSpec


def evaluate_row(mapped: MappedRow, cal: Calibration) -> RowResult:
    """Score every candidate layout of a row; keep the fastest that fits (else the fastest)."""
    ctx = build_context(mapped.job, cal)
    n = mapped.num_gpus
    best_fit: Estimate | None = None
    best_any: Estimate | None = None
    first_error: str | None = None
    count = 0
    for layout in mapped.layouts():
        try:
            lay = resolve_layout(mapped.job, layout)
        except InvalidLayout as exc:
            first_error = first_error or str(exc)
            continue
        est = best_estimate(ctx, lay)
        count += 1
        if best_any is None or est.step_time_s < best_any.step_time_s:
            best_any = est
        if est.fits_memory and (best_fit is None or est.step_time_s < best_fit.step_time_s):
            best_fit = est
    if best_any is None:
        raise InvalidLayout("config", f"no valid layout: {first_error}")
    est = best_fit or best_any
    lay = est.layout
    predicted = est.tokens_per_step / est.step_time_s / n
    measured = mapped.measured_tokens_per_s_per_gpu
    layout = {
        "tp": lay.tp,
        "pp": lay.pp,
        "dp": lay.dp,
        "cp": lay.cp,
        "ep": lay.ep,
        "vpp": lay.vpp,
        "micro_batch_size": lay.micro_batch_size,
        "zero_stage": lay.zero_stage,
        "recompute": lay.recompute,
        "sequence_parallel": lay.sequence_parallel,
    }
    return RowResult(
        id=mapped.id,
        model=str(mapped.job.model.name),
        gpu_class=mapped.gpu_class,
        kind=mapped.kind,
        num_gpus=n,
        comparison_group=mapped.comparison_group,
        layout=layout,
        searched=tuple(mapped.grid),
        measured=measured,
        measurement=mapped.measurement,
        predicted=predicted,
        error_pct=(predicted - measured) / measured * 100.0,
        fits=est.fits_memory,
        bottleneck=est.bottleneck,
        mfu=est.mfu,
        memory_gib=est.peak_memory_bytes / 2**30,
        step_time_s=est.step_time_s,
        breakdown_s=dict(est.breakdown_s),
        candidates=count,
        notes=mapped.notes,
    )


def flop_definition_checks(raw_rows: list[dict[str, Any]]) -> tuple[tuple[str, str, float], ...]:
    """For rows reporting both TFLOP/s and tokens/s (or a step time): does the FLOP definition
    used for TFLOP/s-only rows of the same source reproduce the reported TFLOP/s?"""
    out = []
    for row in raw_rows:
        me = row["measured"]
        if not me.get("tflops_per_gpu"):
            continue
        direct = ("tokens_per_sec_per_gpu", "tokens_per_sec_total", "step_time_s")
        if not any(me.get(k) for k in direct):
            continue
        try:
            mapped = map_row(row)
        except Exception:  # noqa: BLE001, S112 - a check, not a gate: unmappable rows are listed elsewhere
            continue
        causal, factor, label = flop_definition(row)
        try:
            per_token = source_flops_per_token(
                mapped.job.model, mapped.job.training.seq_len, causal=causal, recompute_factor=factor
            )
        except Unmappable:  # e.g. MLA models: no source FLOP definition to check
            continue
        implied = mapped.measured_tokens_per_s_per_gpu * per_token / 1e12
        out.append((row["id"], label, implied / float(me["tflops_per_gpu"]) - 1.0))
    return tuple(out)


def run_validation(
    cal: Calibration | None = None, rows: list[dict[str, Any]] | None = None, fp32_gradients: bool = False
) -> ValidationReport:
    """Score every mappable calibration row with ``cal`` (default: the shipped calibration);
    ``fp32_gradients`` costs every bf16 row with ``training.grad_reduce_in_fp32`` (a what-if: the
    mapping costs 16-bit gradients)."""
    cal = DEFAULT if cal is None else cal
    raw = load_rows() if rows is None else rows
    mapped, skipped = map_all(raw)
    if fp32_gradients:
        mapped = [replace(m, job=_with_fp32_gradients(m.job)) for m in mapped]
    results: list[RowResult] = []
    skipped = list(skipped)
    for m in mapped:
        try:
            results.append(evaluate_row(m, cal))
        except (InvalidLayout, ValueError) as exc:
            skipped.append(Skipped(m.id, f"cost model rejects the stated layout: {exc}"))
    by_gpu = _split(results, lambda r: r.gpu_class)
    by_kind = _split(results, lambda r: r.kind)
    by_meas = _split(results, lambda r: _measurement_kind(r.measurement))
    summary = Summary(
        rows_used=len(results),
        rows_skipped=len(skipped),
        overall=_stats(results),
        oom_ids=tuple(r.id for r in results if not r.fits),
        by_gpu=by_gpu,
        by_kind=by_kind,
        by_measurement=by_meas,
        by_source=_split(results, lambda r: source_key(r.id)),
        groups=rank_groups(results),
    )
    return ValidationReport(tuple(results), tuple(skipped), summary, flop_definition_checks(raw))


def _with_fp32_gradients(job: JobSpec) -> JobSpec:
    """``job`` with fp32 gradients when it trains in bf16 (Megatron-LM's default with ``--bf16``);
    fp16 runs keep fp16 gradients, fp16's default."""
    if job.training.precision == "fp16":
        return job
    return job.model_copy(update={"training": job.training.model_copy(update={"grad_reduce_in_fp32": True})})


def source_key(row_id: str) -> str:
    """Short name of the publication a row comes from (its id prefix)."""
    for prefix in ("nemo-longseq", "torchtitan-asynctp"):
        if row_id.startswith(prefix):
            return prefix
    return row_id.split("-")[0]


def _measurement_kind(label: str) -> str:
    if label.startswith(("TFLOP/s", "MFU")):
        return "converted from TFLOP/s"
    return "tokens/s or step time"
