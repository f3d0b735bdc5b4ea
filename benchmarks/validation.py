"""Validate the cost model against published training runs (``benchmarks/data/published_runs.json``).

For every mappable row (``benchmarks/calibration_rows.py`` documents the mapping) the cost model
scores the stated layout; knobs the source did not state are searched over a small grid and the
fastest layout that fits in memory is kept. Predicted tokens/s/GPU is compared with the measured
value, and within each ``comparison_group`` the predicted order of layouts with the measured order.

    .venv/bin/python benchmarks/validation.py            # table + summary, writes docs/validation.md
    .venv/bin/python benchmarks/validation.py --check    # exit 1 if median > 8%, p90 > 20% or any OOM

``run_validation(cal)`` returns the same as a :class:`ValidationReport`, for a calibration fit that
scores an alternative :class:`optimizer.calibration.Calibration`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost import Estimate, best_estimate, build_context, resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.specs import JobSpec

DOC_PATH = ROOT / "docs" / "validation.md"
COMMAND = ".venv/bin/python benchmarks/validation.py"
MEDIAN_TARGET_PCT = 8.0
P90_TARGET_PCT = 20.0
SUBSET_TARGETS_PCT: dict[str, tuple[float, float]] = {"all": (6.0, 15.0), "moe": (10.0, 20.0)}
"""Accuracy targets (median, p90 |error| %) per subset, reported in the headline; ``--check``
gates on ``MEDIAN_TARGET_PCT`` / ``P90_TARGET_PCT`` only."""
BLACKWELL = ("B200", "GB200")
TIE_REL = 0.005
"""Measured values closer than this (relative) count as a tie in the ranking comparison."""


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


# ---------------------------------------------------------------------------------------- scoring


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


def _split(results: list[RowResult], key: Callable[[RowResult], str]) -> dict[str, ErrorStats]:
    return {k: _stats([r for r in results if key(r) == k]) for k in sorted({key(r) for r in results})}


def source_key(row_id: str) -> str:
    """Short name of the publication a row comes from (its id prefix)."""
    for prefix in ("nemo-longseq", "torchtitan-asynctp"):
        if row_id.startswith(prefix):
            return prefix
    return row_id.split("-")[0]


def worst_rows(rep: ValidationReport, n: int = 10) -> list[RowResult]:
    return sorted(rep.rows, key=lambda r: -abs(r.error_pct))[:n]


def _measurement_kind(label: str) -> str:
    if label.startswith(("TFLOP/s", "MFU")):
        return "converted from TFLOP/s"
    return "tokens/s or step time"


# ---------------------------------------------------------------------------------------- output


def _fmt(x: float | None, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _stats_rows(title: str, stats: dict[str, ErrorStats]) -> list[list[str]]:
    return [[f"{title}: {k}", *_stats_cells(s)] for k, s in stats.items()]


def _stats_cells(s: ErrorStats) -> list[str]:
    return [str(s.n), _fmt(s.median_abs_pct, ".1f"), _fmt(s.p90_abs_pct, ".1f"), _fmt(s.mean_signed_pct, "+.1f")]


def _summary_table(rep: ValidationReport) -> tuple[list[str], list[list[str]]]:
    s = rep.summary
    head = ["subset", "rows", "median |err| %", "p90 |err| %", "mean err %"]
    body = [["all", *_stats_cells(s.overall)]]
    body += _stats_rows("GPU", s.by_gpu) + _stats_rows("model", s.by_kind)
    body += _stats_rows("measurement", s.by_measurement) + _stats_rows("source", s.by_source)
    return head, body


def _group_table(rep: ValidationReport) -> tuple[list[str], list[list[str]]]:
    head = ["comparison group", "rows", "Spearman", "pairwise agreement", "order matches"]
    body = []
    for g in rep.summary.groups:
        om = g.order_matches
        matches = "-" if om is None else ("yes" if om else "no")
        body.append([g.group, str(g.n), _fmt(g.spearman), _fmt(g.pairwise_agreement), matches])
    return head, body


def _row_table(rep: ValidationReport) -> tuple[list[str], list[list[str]]]:
    head = [
        "id",
        "model",
        "GPUs",
        "layout (* = chosen by the model)",
        "measured tok/s/GPU",
        "measurement",
        "predicted",
        "error %",
        "fits",
        "bottleneck",
    ]
    body = []
    for r in rep.rows:
        body.append(
            [
                r.id,
                r.model,
                str(r.num_gpus),
                r.layout_str,
                _fmt(r.measured, ".1f"),
                r.measurement,
                _fmt(r.predicted, ".1f"),
                _fmt(r.error_pct, "+.1f"),
                "yes" if r.fits else "NO",
                r.bottleneck,
            ]
        )
    return head, body


def _worst_table(rep: ValidationReport) -> tuple[list[str], list[list[str]]]:
    head = ["id", "layout", "measured", "predicted", "error %", "fits", "bottleneck", "largest time terms (s)"]
    body = []
    for r in worst_rows(rep):
        terms = sorted(r.breakdown_s.items(), key=lambda kv: -kv[1])[:3]
        body.append(
            [
                r.id,
                r.layout_str,
                _fmt(r.measured, ".1f"),
                _fmt(r.predicted, ".1f"),
                _fmt(r.error_pct, "+.1f"),
                "yes" if r.fits else "NO",
                r.bottleneck,
                ", ".join(f"{k} {v:.2f}" for k, v in terms),
            ]
        )
    return head, body


def text_table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) for row in body]
    return "\n".join(lines)


def md_table(head: list[str], body: list[list[str]]) -> str:
    def esc(c: str) -> str:
        return c.replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _headline(rep: ValidationReport) -> list[str]:
    s = rep.summary
    verdict = "PASS" if s.passes() else "FAIL"
    pa = s.mean_pairwise_agreement
    return [
        f"rows used: {s.rows_used}, skipped: {s.rows_skipped}",
        f"median |error|: {s.median_abs_pct:.1f}%  (target <= {MEDIAN_TARGET_PCT:g}%)",
        f"p90 |error|: {s.p90_abs_pct:.1f}%  (target <= {P90_TARGET_PCT:g}%)",
        f"mean signed error: {s.overall.mean_signed_pct:+.1f}% (> 0: throughput over-predicted)",
        f"predicted OOM for layouts that ran: {s.oom_count}" + (f" ({', '.join(s.oom_ids)})" if s.oom_ids else ""),
        f"ranking: mean pairwise agreement over {len(s.groups)} comparison groups: {_fmt(pa)}",
        *_subset_lines(rep),
        f"--check verdict: {verdict}",
    ]


def _subset_lines(rep: ValidationReport) -> list[str]:
    """The per-subset targets (all rows, MoE rows) and the Blackwell rows on their own."""
    subsets = {"all": list(rep.rows), "moe": [r for r in rep.rows if r.kind == "moe"]}
    out = []
    for name, rows in subsets.items():
        st = _stats(rows)
        med_t, p90_t = SUBSET_TARGETS_PCT[name]
        ok = "met" if st.median_abs_pct <= med_t and st.p90_abs_pct <= p90_t else "not met"
        out.append(f"target for {name} rows ({st.n}): median <= {med_t:g}%, p90 <= {p90_t:g}%: "
                   f"{st.median_abs_pct:.1f}% / {st.p90_abs_pct:.1f}% ({ok})")  # fmt: skip
    bw = [r for r in rep.rows if r.gpu_class in BLACKWELL]
    if bw:
        errs = ", ".join(f"{r.id} {r.error_pct:+.1f}%" for r in bw)
        out.append(f"Blackwell rows ({len(bw)}, reported apart, no target): {errs}")
    return out


def render_text(rep: ValidationReport) -> str:
    out = [text_table(*_row_table(rep)), "", "Summary", *("  " + x for x in _headline(rep)), ""]
    out += [text_table(*_summary_table(rep)), "", text_table(*_group_table(rep)), ""]
    out += ["Worst rows", text_table(*_worst_table(rep)), ""]
    if rep.flop_checks:
        out.append("FLOP-definition check (TFLOP/s implied by measured tokens/s / reported TFLOP/s - 1)")
        out += [f"  {i}: {x:+.1%}  [{d}]" for i, d, x in rep.flop_checks]
        out.append("")
    if rep.skipped:
        out.append("Skipped rows")
        out += [f"  {s.id}: {s.reason}" for s in rep.skipped]
    return "\n".join(out)


def render_markdown(rep: ValidationReport) -> str:
    md = [
        "# Cost-model validation against published runs",
        "",
        f"Generated by `{COMMAND}` (do not edit by hand; rerun it after changing",
        "the cost model or `optimizer/calibration.py`). Data: `benchmarks/data/published_runs.json`",
        "(see its README for provenance and caveats); row mapping: `benchmarks/calibration_rows.py`.",
        "",
        "For each row the cost model scores the layout the source stated. Knobs the source did not",
        "state (marked `*`) are searched over a small grid (micro-batch 1/2/4, recompute",
        "none/selective/full, VPP = divisors of layers/pp up to 8; ZeRO-1 and sequence parallel with",
        "TP > 1 by default) and the fastest layout that fits in memory is kept. Error is",
        "(predicted - measured) / measured tokens/s/GPU; positive means the model is optimistic.",
        "The attention kernel class follows the source's stack and date: `unfused` (scores",
        "materialised) up to 2022, `flash3` for non-torchtitan stacks from 2025, `flash2` otherwise.",
        "DeepSpeed's ZeRO-3 rows (SC'21 Table 2) run flat data-parallel rings (`training.dp_collectives`:",
        "at a fixed batch their measured step does not fall as GPUs are added) whose weight gathers",
        "block compute (`training.dp_comm_overlap` false: a prefetch of 5e7 elements cannot gather a",
        "layer ahead; the gradient reduce-scatters still overlap backward, DeepSpeed's stage-3 default);",
        "every other row runs NCCL's hierarchical collectives, overlapped. torchtitan's FSDP under its",
        "pipeline schedule is costed as ZeRO-1 (weights gathered and gradients unsharded all step), and",
        "torchtitan rows keep and reduce gradients in fp32 and compute the loss with PyTorch's fp32",
        "cross-entropy (`training.grad_reduce_in_fp32`, `training.cross_entropy: unfused`); every other",
        "row has 16-bit gradients (`--fp32-gradients` prints the summary with fp32 gradients in every",
        "bf16 row instead) and a fused loss. FP8 rows keep their GEMM inputs for backward in fp8",
        "(Transformer Engine), torchtitan's float8 rows in bf16 (`training.fp8_saved_inputs`).",
        "MoE rows use the token dispatcher the row or its source's",
        "recipe names (`training.moe_dispatcher`: DeepEP for the ModelZoo runs but its PP32 layout and",
        "Megatron-Bridge's DeepSeek-V3; the all-to-all dispatcher otherwise), the Megatron-Bridge",
        "recipes' all-to-all overlap, token dropping and activation recompute as each release ran them",
        "(GPT-OSS's recompute stays searched: its printed micro-batch is not its recipe's)",
        "(`benchmarks/mbridge_recipes.py`), and",
        "the expert tensor parallelism the row or its recipe states: 1 in the Megatron-Bridge",
        "performance configs and the MoE model zoo, Megatron-Core's default (`etp = tp`) for a recipe",
        "that names none (DGX Cloud's Grok-1). Peak",
        "memory is checked against the memory torchtitan published for its runs in",
        "docs/memory_check.md.",
        "",
        "## Summary",
        "",
        *("- " + x for x in _headline(rep)),
        "",
        md_table(*_summary_table(rep)),
        "",
        "## Worst rows",
        "",
        md_table(*_worst_table(rep)),
        "",
        "## Ranking within comparison groups",
        "",
        "Same model (and usually GPU count), different layout or technique. Pairwise agreement is the",
        f"fraction of pairs whose measured throughputs differ by more than {TIE_REL:.1%} that the model",
        "orders the same way. A group whose rows have the same inputs would have no predicted order",
        "(`-`); the Megatron-Bridge release pairs (one layout, two releases) ran different recipes.",
        "",
        md_table(*_group_table(rep)),
        "",
        "## Error bands",
        "",
        "Every plan carries 80% ranges of its throughput and step time, from these rows' errors:",
        "the 10th and 90th percentiles of log(measured / predicted) among comparable runs (dense / MoE,",
        "GPU generation, 16-bit / FP8-class precision; classes with too few rows merged into their",
        "parent). Their leave-one-source-out coverage, overall and per class, is in",
        "[error_bands.md](error_bands.md) (`make bands`, also run by `make validate`).",
        "",
        "## Rows",
        "",
        "Measurement: which measured quantity was compared. Rows that report only TFLOP/s are",
        "converted with the source's own FLOP count (`source_flops_per_token`): SC'21 / MT-NLG / BLOOM",
        "hardware FLOPs `96 L h^2 (1 + s/6h + V/16Lh)` per token (full recompute counted), Megatron-LM",
        "2024 and NeMo model FLOPs `72 L h^2 (1 + s/6h + V/12Lh)` per token (generalised for GQA,",
        "gated MLPs and MoE; non-causal attention), Megatron-Core 2025 (MoE ModelZoo) the same with",
        "causal attention halved.",
        "",
        md_table(*_row_table(rep)),
        "",
    ]
    if rep.flop_checks:
        md += [
            "## FLOP-definition check",
            "",
            "Rows that report both TFLOP/s and tokens/s (or a step time): TFLOP/s implied by the",
            "measured tokens/s and the definition above, relative to the reported TFLOP/s.",
            "",
            md_table(
                ["id", "definition", "implied / reported - 1"], [[i, d, f"{x:+.1%}"] for i, d, x in rep.flop_checks]
            ),
            "",
        ]
    notes = [(r.id, "; ".join(r.notes)) for r in rep.rows if r.notes]
    if notes:
        md += ["## Mapping notes", "", md_table(["id", "notes"], [[i, n] for i, n in notes]), ""]
    md += ["## Skipped rows", ""]
    md += [f"- `{x.id}`: {x.reason}" for x in rep.skipped] or ["None."]
    md.append("")
    return "\n".join(md)


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
