"""Planner latency on a fixed set of jobs from 8 to 131,072 GPUs, against exhaustive costing.

For each job: the planner's wall time (``optimizer.search.search``, default search settings
unless ``--time-limit`` is given), its status, how many layouts it enumerated / found fitting
among those it costed / sent to CP-SAT, the best layout and its MFU; then the time to cost the
same space exhaustively (every layout of ``enumerate_layouts`` through ``best_estimate``, every
rank order, no bounds), stopped after ``--exhaustive-cap`` seconds.

    python benchmarks/search_latency.py            # full run, writes docs/search_latency.md
    python benchmarks/search_latency.py --quick    # exhaustive costing capped at 10 s

Each measurement starts from an empty per-job context cache, so both include building the
job's context (layer kinds, FLOPs, topology).
"""

from __future__ import annotations

import argparse
import gc
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

from optimizer.cost import best_estimate, build_context
from optimizer.cost.context import _build_context_cached
from optimizer.search import cyclic_gc_paused, search
from optimizer.search.bounds import space_bounds
from optimizer.search.space import enumerate_layouts, layout_blocks
from optimizer.specs import JobSpec, PlanRequest
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
    ("llama3-8b, 8 H100", {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    }),
    ("llama3-8b, 64 H100", {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 256},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    }),
    ("gpt3-175b, 1,024 H100", {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1536},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    }),
    ("gpt3-175b, 8,192 H100", {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8192},
    }),
    ("llama3.1-405b, 16,384 H100", {
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 2048},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16384},
    }),
    ("mixtral-8x22b, 2,048 H100", {
        "model": {"preset": "mixtral-8x22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 2048},
    }),
    ("deepseek-v3, 2,048 H800", {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {**H800, "num_gpus": 2048},
    }),
    ("deepseek-v3, 9,216 GB200 NVL72", {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 4608},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 9216},
    }),
    ("qwen3-235b-a22b, 256 H100", {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    }),
    ("dense 1T, 98,304 H100", {
        "model": DENSE_1T,
        "training": {"seq_len": 8192, "global_batch_tokens": 16 * 2**20},
        "cluster": {"preset": "dgx-h100", "num_gpus": 98304},
    }),
    ("dense 1T, 131,072 H100", {
        "model": DENSE_1T,
        "training": {"seq_len": 8192, "global_batch_tokens": 16 * 2**20},
        "cluster": {"preset": "dgx-h100", "num_gpus": 131072},
    }),
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
    exhaustive_s: float | None
    """None: stopped at the cap."""
    exhaustive_costed: int
    exhaustive_fitting: int
    bounds_s: float
    """Enumerating and bounding every layout as arrays (``space_bounds``), no exact costing."""


def _fresh_context() -> None:
    """Empty per-job caches, and collect the previous measurement's garbage so that its cycles are
    not collected on the next one's clock."""
    _build_context_cached.cache_clear()
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
    split = "" if len(set(c.stage_layers or [])) <= 1 else " non-uniform split"
    return f"{' '.join(parts)}, mbs {c.micro_batch_size}, ZeRO-{c.zero_stage}, {c.recompute} recompute{split}"


def exhaustive(request: PlanRequest, cap_s: float) -> tuple[float | None, int, int]:
    """Cost every layout with every rank order; (seconds or None if capped, costed, fitting)."""
    _fresh_context()
    t0 = time.perf_counter()
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    ctx = build_context(job)
    gib = request.search.memory_headroom_gib
    headroom = gib * GIB if gib is not None else None
    costed = fitting = 0
    with cyclic_gc_paused():  # as the planner runs
        for lay in enumerate_layouts(job, request.search):
            if time.perf_counter() - t0 > cap_s:
                return None, costed, fitting
            est = best_estimate(ctx, lay, headroom_bytes=headroom)
            costed += 1
            fitting += est.fits_memory
    return time.perf_counter() - t0, costed, fitting


def vectorised_bounds_s(request: PlanRequest) -> float:
    """Seconds to enumerate the space and bound every layout (every rank order and layer split) as
    numpy arrays, as the planner's first phase does: ``layout_blocks``, ``space_bounds`` and the
    sorted queue. Lower bounds, not exact costs."""
    _fresh_context()
    t0 = time.perf_counter()
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    ctx = build_context(job)
    space_bounds(ctx, list(layout_blocks(job, request.search))).queue_order()
    return time.perf_counter() - t0


def run_job(name: str, job: dict[str, Any], cap_s: float, time_limit_s: float | None) -> Row:
    body = dict(job)
    if time_limit_s is not None:
        body["search"] = {"time_limit_s": time_limit_s}
    request = PlanRequest.model_validate(body)
    _fresh_context()
    t0 = time.perf_counter()
    response = search(request)
    planner_s = time.perf_counter() - t0
    best = response.plans[0] if response.plans else None
    ex_s, ex_costed, ex_fit = exhaustive(request, cap_s)
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
        exhaustive_s=ex_s,
        exhaustive_costed=ex_costed,
        exhaustive_fitting=ex_fit,
        bounds_s=bounds_s,
    )


def table(rows: list[Row], cap_s: float) -> str:
    head = (
        "| job | planner (s) | status | layouts enumerated | fitting (of those costed) | to CP-SAT "
        "| best layout | MFU | exhaustive costing (s) | exhaustive: fitting / layouts | vectorised bounds (s) |\n"
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        ex = f"{r.exhaustive_s:.1f}" if r.exhaustive_s is not None else f">{cap_s:.0f} s"
        ex_count = (
            f"{r.exhaustive_fitting:,} / {r.exhaustive_costed:,}"
            if r.exhaustive_s is not None
            else f"{r.exhaustive_fitting:,} / {r.exhaustive_costed:,} costed of {r.enumerated:,}"
        )
        mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
        lines.append(
            f"| {r.name} | {r.planner_s:.2f} | {r.status} | {r.enumerated:,} | {r.fitting:,} | {r.to_solver:,} "
            f"| {r.best} | {mfu} | {ex} | {ex_count} | {r.bounds_s:.2f} |"
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
    parser.add_argument("--quick", action="store_true", help="cap exhaustive costing at 10 s per job")
    parser.add_argument("--exhaustive-cap", type=float, default=None, help="seconds (default 300, 10 with --quick)")
    parser.add_argument("--time-limit", type=float, default=None, help="search.time_limit_s (default: the service's)")
    parser.add_argument(
        "--out", default=str(ROOT / "docs" / "search_latency.md"), help="markdown file to write ('' = none)"
    )
    args = parser.parse_args(argv)
    cap_s = args.exhaustive_cap if args.exhaustive_cap is not None else (10.0 if args.quick else 300.0)
    load_start = os.getloadavg()[0]
    rows = []
    for name, job in JOBS:
        row = run_job(name, job, cap_s, args.time_limit)
        rows.append(row)
        ex = f"{row.exhaustive_s:.1f} s" if row.exhaustive_s is not None else f">{cap_s:.0f} s"
        print(f"{name}: planner {row.planner_s:.2f} s ({row.status}), exhaustive {ex}", file=sys.stderr, flush=True)
    md_table = table(rows, cap_s)
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
            f"time limit {limit}). Exhaustive costing: every layout of `enumerate_layouts` through "
            f"`best_estimate` (every rank order, uniform layer split, no bounds), stopped after {cap_s:.0f} s: "
            "the cost model's own functions, one layout at a time (docs/search.md says why there is no "
            "vectorised copy of them). Vectorised bounds: enumerating the same space and bounding every "
            "layout as numpy arrays (`search.bounds.space_bounds`, the planner's first phase): lower bounds "
            "over every rank order and layer split, not exact costs. Every timing starts from an empty "
            "per-job context cache.\n\n"
            "\"fitting (of those costed)\" counts only the layouts the planner costed before its lower bound "
            "proved the rest could not enter the top-k; \"status\" is `optimal` when that proof and CP-SAT's "
            "both completed within the time limit, `feasible` when the time limit cut them short.\n\n"
            f"Machine: {machine}.\n\n" + md_table + "\n" + md_summary
        )
        Path(args.out).write_text(doc, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
