"""Planner latency on a fixed set of jobs from 8 to 131,072 GPUs, against exhaustive vectorised costing.

For each job: the planner's wall time (``optimizer.search.search``, default search settings
unless ``--time-limit`` is given), its status, how many layouts it enumerated / found fitting
among those it costed / sent to CP-SAT, the best layout and its MFU; then the time to cost the
same space exhaustively and exactly as numpy arrays (``optimizer.search.exhaustive``: every
layout of the regular space under every rank order, uniform layer split, no bounds), its
optimum against the planner's, and the time of the planner's first phase alone (bounding the
space as arrays).

    python benchmarks/search_latency.py            # full run, writes docs/search_latency.md
    python benchmarks/search_latency.py --quick    # the planner only, no exhaustive costing, prints only

Each measurement starts from an empty per-job context cache, so both include building the
job's context (layer kinds, FLOPs, topology).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from optimizer.cost import build_context
from optimizer.cost.context import clear_context_cache
from optimizer.search import bound_space, cyclic_gc_paused
from optimizer.search.exhaustive import exhaustive_best
from optimizer.search.space import Reach, layout_blocks
from optimizer.service import search_plans
from optimizer.specs import PlanRequest
from optimizer.units import GIB

DENSE_1T = {
    "name": "dense-1t",
    "num_layers": 128,
    "hidden_size": 25600,
    "num_attention_heads": 160,
    "num_kv_heads": 16,
    "ffn_hidden_size": 81920,
    "vocab_size": 128256,
}
"""About 1.0e12 parameters: 128 layers x 7.73e9 (GQA attention + SwiGLU MLP) + 6.6e9 embedding and LM head."""

H800 = {"preset": "dgx-h100", "gpu": "h800-sxm-80gb"}

JOBS: list[tuple[str, dict[str, Any]]] = [
    (
        "llama3-8b, 8 H100",
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 8192, "global_batch_size": 64},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        },
    ),
    (
        "llama3-8b, 64 H100",
        {
            "model": {"preset": "llama3-8b"},
            "training": {"seq_len": 8192, "global_batch_size": 256},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64},
        },
    ),
    (
        "gpt3-175b, 1,024 H100",
        {
            "model": {"preset": "gpt3-175b"},
            "training": {"seq_len": 2048, "global_batch_size": 1536},
            "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
        },
    ),
    (
        "gpt3-175b, 8,192 H100",
        {
            "model": {"preset": "gpt3-175b"},
            "training": {"seq_len": 2048, "global_batch_size": 1024},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8192},
        },
    ),
    (
        "llama3.1-405b, 16,384 H100",
        {
            "model": {"preset": "llama3.1-405b"},
            "training": {"seq_len": 8192, "global_batch_size": 2048},
            "cluster": {"preset": "dgx-h100", "num_gpus": 16384},
        },
    ),
    (
        "mixtral-8x22b, 2,048 H100",
        {
            "model": {"preset": "mixtral-8x22b"},
            "training": {"seq_len": 4096, "global_batch_size": 1024},
            "cluster": {"preset": "dgx-h100", "num_gpus": 2048},
        },
    ),
    (
        "deepseek-v3, 2,048 H800",
        {
            "model": {"preset": "deepseek-v3"},
            "training": {"seq_len": 4096, "global_batch_size": 15360},
            "cluster": {**H800, "num_gpus": 2048},
        },
    ),
    (
        "deepseek-v3, 9,216 GB200 NVL72",
        {
            "model": {"preset": "deepseek-v3"},
            "training": {"seq_len": 4096, "global_batch_size": 4608},
            "cluster": {"preset": "gb200-nvl72", "num_gpus": 9216},
        },
    ),
    (
        "qwen3-235b-a22b, 256 H100",
        {
            "model": {"preset": "qwen3-235b-a22b"},
            "training": {"seq_len": 4096, "global_batch_size": 1024},
            "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        },
    ),
    (
        "dense 1T, 98,304 H100",
        {
            "model": DENSE_1T,
            "training": {"seq_len": 8192, "global_batch_tokens": 16 * 2**20},
            "cluster": {"preset": "dgx-h100", "num_gpus": 98304},
        },
    ),
    (
        "dense 1T, 131,072 H100",
        {
            "model": DENSE_1T,
            "training": {"seq_len": 8192, "global_batch_tokens": 16 * 2**20},
            "cluster": {"preset": "dgx-h100", "num_gpus": 131072},
        },
    ),
]


@dataclass
class Row:
    name: str
    num_gpus: int
    planner_s: float
    status: str
    enumerated: int
    fitting: int
    to_solver: int
    best: str
    mfu: float | None
    planner_step_s: float | None
    exhaustive_s: float | None
    """None: not run (``--quick``)."""
    exhaustive_layouts: int
    exhaustive_costed: int
    """(layout, rank order) pairs costed."""
    exhaustive_fitting: int
    exhaustive_step_s: float
    """The exhaustive optimum's step time (uniform split; ``inf`` when nothing fits)."""
    bounds_s: float
    """Enumerating and bounding every layout as arrays (``space_bounds``), no exact costing."""


def _fresh_context() -> None:
    """Empty per-job caches, and collect the previous measurement's garbage so that its cycles are
    not collected on the next one's clock."""
    clear_context_cache()
    gc.collect()


def describe(plan) -> str:
    c = plan.config
    parts = [f"TP{c.tp}", f"PP{c.pp}"]
    if c.vpp > 1:
        parts.append(f"v{c.vpp}")
    parts.append(f"DP{c.dp}")
    if c.cp > 1:
        parts.append(f"CP{c.cp}")
    if c.ep > 1:
        parts.append(f"EP{c.ep}")
    if c.etp > 1:
        parts.append(f"ETP{c.etp}")
    split = "" if len(set(c.stage_layers or [])) <= 1 else " non-uniform split"
    return f"{' '.join(parts)}, mbs {c.micro_batch_size}, ZeRO-{c.zero_stage}, {c.recompute} recompute{split}"


def exhaustive(request: PlanRequest) -> tuple[float, int, int, int, float]:
    """Cost every layout under every rank order exactly, as arrays: (seconds, layouts, (layout,
    order) pairs, layouts that fit, the fastest fitting step time)."""
    _fresh_context()
    t0 = time.perf_counter()
    job = request.job_spec()
    ctx = build_context(job)
    gib = request.search.memory_headroom_gib
    with cyclic_gc_paused():  # as the planner runs
        result = exhaustive_best(ctx, job, request.search, gib * GIB if gib is not None else None)
    return time.perf_counter() - t0, result.layouts, result.costed, result.fitting, result.step_time_s


def vectorised_bounds_s(request: PlanRequest) -> float:
    """Seconds to enumerate the space and bound every layout (every rank order and layer split) as
    numpy arrays, as the planner's first phase does: ``layout_blocks`` (the whole space,
    ``Reach.ALL``), ``bound_space`` and the sorted queue. Lower bounds, not exact costs."""
    _fresh_context()
    t0 = time.perf_counter()
    job = request.job_spec()
    ctx = build_context(job)
    bounds, _ = bound_space(ctx, list(layout_blocks(job, request.search, Reach.ALL)), ctx.usable_bytes(None), math.inf)
    assert bounds is not None
    bounds.queue_order()
    return time.perf_counter() - t0


def run_job(name: str, job: dict[str, Any], quick: bool, time_limit_s: float | None) -> Row:
    body = dict(job)
    if time_limit_s is not None:
        body["search"] = {"time_limit_s": time_limit_s}
    request = PlanRequest.model_validate(body)
    _fresh_context()
    t0 = time.perf_counter()
    response = search_plans(request)
    planner_s = time.perf_counter() - t0
    best = response.plans[0] if response.plans else None
    ex_s, ex_layouts, ex_costed, ex_fit, ex_step = (None, 0, 0, 0, math.inf) if quick else exhaustive(request)
    bounds_s = vectorised_bounds_s(request)
    info = response.solver
    return Row(
        name=name,
        num_gpus=request.cluster.num_gpus,
        planner_s=planner_s,
        status=response.status,
        enumerated=info.candidates_enumerated,
        fitting=info.candidates_fitting_memory,
        to_solver=info.candidates_to_solver,
        best=describe(best) if best else "-",
        mfu=best.mfu if best else None,
        planner_step_s=best.step_time_s if best else None,
        exhaustive_s=ex_s,
        exhaustive_layouts=ex_layouts,
        exhaustive_costed=ex_costed,
        exhaustive_fitting=ex_fit,
        exhaustive_step_s=ex_step,
        bounds_s=bounds_s,
    )


def table(rows: list[Row]) -> str:
    head = (
        "| job | planner (s) | status | layouts enumerated | fitting (of those costed) | to CP-SAT "
        "| best layout | MFU | exhaustive vectorised (s) | exhaustive: fitting / layouts / (layout, order) pairs "
        "| planner's step vs exhaustive optimum | vectorised bounds (s) |\n"
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        ex = f"{r.exhaustive_s:.1f}" if r.exhaustive_s is not None else "-"
        ex_count = (
            f"{r.exhaustive_fitting:,} / {r.exhaustive_layouts:,} / {r.exhaustive_costed:,}"
            if r.exhaustive_s is not None
            else "-"
        )
        if r.planner_step_s is not None and math.isfinite(r.exhaustive_step_s):
            ratio = r.planner_step_s / r.exhaustive_step_s - 1
            versus = "equal" if abs(ratio) <= 1e-12 else f"{100 * ratio:+.3f}%"
        else:
            versus = "-"
        mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
        lines.append(
            f"| {r.name} | {r.planner_s:.2f} | {r.status} | {r.enumerated:,} | {r.fitting:,} | {r.to_solver:,} "
            f"| {r.best} | {mfu} | {ex} | {ex_count} | {versus} | {r.bounds_s:.2f} |"
        )
    return head + "\n".join(lines) + "\n"


def summary(rows: list[Row]) -> str:
    upto = [r.planner_s for r in rows if r.num_gpus <= 16384]
    largest = [r for r in rows if r.num_gpus == 131072]
    text = (
        f"Planner wall time for jobs up to 16,384 GPUs: median {statistics.median(upto):.2f} s, "
        f"max {max(upto):.2f} s ({len(upto)} jobs)."
    )
    if largest:
        text += f" At 131,072 GPUs: {largest[0].planner_s:.2f} s ({largest[0].status})."
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="time the planner only (no exhaustive costing)")
    parser.add_argument("--time-limit", type=float, default=None, help="search.time_limit_s (default: the service's)")
    parser.add_argument(
        "--out",
        default=None,
        help="markdown file to write ('' = none; default docs/search_latency.md, none with --quick)",
    )
    args = parser.parse_args(argv)
    if args.out is None:  # a --quick table has no exhaustive columns: do not overwrite the full one
        args.out = "" if args.quick else str(ROOT / "docs" / "search_latency.md")
    load_start = os.getloadavg()[0]
    rows = []
    for name, job in JOBS:
        row = run_job(name, job, args.quick, args.time_limit)
        rows.append(row)
        ex = f"{row.exhaustive_s:.1f} s" if row.exhaustive_s is not None else "not run"
        print(f"{name}: planner {row.planner_s:.2f} s ({row.status}), exhaustive {ex}", file=sys.stderr, flush=True)
    md_table = table(rows)
    md_summary = summary(rows)
    print(md_table)
    print(md_summary)
    if args.out:
        machine = (
            f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPU cores; "
            f"1-minute load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
            "(other work on the machine inflates both columns)"
        )
        limit = f"{args.time_limit:g} s" if args.time_limit is not None else "10 s, the default"
        doc = (
            "# Search latency\n\n"
            "Generated by `python benchmarks/search_latency.py"
            + (" --quick" if args.quick else "")
            + "`. Planner: `optimizer.search.search` with default search settings (top_k 5, "
            f"time limit {limit}). Exhaustive vectorised costing (`search.exhaustive.exhaustive_best`): "
            "every layout of the regular space (what `enumerate_layouts` yields, uniform layer split) under "
            "every distinct rank order, costed exactly as numpy arrays by `cost.columns.cost_columns` "
            "(the cost model's own stage arithmetic on arrays; a test holds it to `estimate`'s floats), no "
            "bounds, no pruning. \"planner's step vs exhaustive optimum\" compares the planner's best "
            'plan with the fastest layout that fits in that space ("equal": within 1e-12 relative): at '
            "most 0, as the planner also searches non-uniform layer splits. Vectorised bounds: "
            "enumerating the same space and bounding every layout as numpy arrays (`search.bound_space`, the planner's first phase): lower bounds "
            "over every rank order and layer split, not exact costs. Every timing starts from an empty "
            "per-job context cache.\n\n"
            '"fitting (of those costed)" counts only the layouts the planner costed before its lower bound '
            'proved the rest could not enter the top-k; "status" is `optimal` when that proof and CP-SAT\'s '
            "both completed within the time limit, `feasible` when the time limit cut them short.\n\n"
            f"Machine: {machine}.\n\n" + md_table + "\n" + md_summary
        )
        Path(args.out).write_text(doc, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
