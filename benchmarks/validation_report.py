"""Render a :class:`ValidationReport` as the text ``benchmarks/validation.py`` prints and the
markdown it writes to ``docs/validation.md``."""

from __future__ import annotations

import math

from benchmarks.validation_results import (
    MEDIAN_TARGET_PCT,
    P90_TARGET_PCT,
    ErrorStats,
    RowResult,
    ValidationReport,
)
from benchmarks.validation_stats import TIE_REL, _stats

COMMAND = ".venv/bin/python benchmarks/validation.py"
SUBSET_TARGETS_PCT: dict[str, tuple[float, float]] = {"all": (6.0, 15.0), "moe": (10.0, 20.0)}
"""Accuracy targets (median, p90 |error| %) per subset, reported in the headline; ``--check``
gates on ``MEDIAN_TARGET_PCT`` / ``P90_TARGET_PCT`` only."""
BLACKWELL = ("B200", "GB200")


def worst_rows(rep: ValidationReport, n: int = 10) -> list[RowResult]:
    return sorted(rep.rows, key=lambda r: -abs(r.error_pct))[:n]


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
        "(Transformer Engine), torchtitan's float8 rows in bf16 (`training.fp8_saved_inputs`);",
        "torchtitan's attention takes key/value heads expanded to the query heads (`training.kv_expanded`).",
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
