"""Exhaustive reference for the planner: cost everything, prune nothing.

Every layout of ``space.enumerate_layouts`` (``Reach.ALL``: the planner's whole space) is costed with ``best_estimate`` (every rank order its frameworks lay out,
no lower bounds, no pool). Pipelined layouts (``pp > 1``) are also costed with every contiguous
layer split over their ``pp * vpp`` chunks when there are at most ``max_splits`` such splits
(compositions of ``num_layers`` into ``pp * vpp`` positive parts); otherwise only with the
uniform split. What fits in memory is returned, fastest first.

Slow by design; meant for tests on small jobs and for spot checks:

    python -m optimizer.search.brute_force request.json [--verify]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import replace
from itertools import combinations

from optimizer.cost import Estimate, best_estimate, build_context
from optimizer.cost.rules import ResolvedLayout
from optimizer.search import search
from optimizer.search.framework_space import space_frameworks
from optimizer.search.ranking import pick
from optimizer.search.space import Reach, enumerate_layouts
from optimizer.specs import PlanRequest
from optimizer.units import GIB

MAX_SPLITS = 2000
"""Enumerate every layer split of a pipelined layout when there are at most this many."""


def split_count(num_layers: int, chunks: int) -> int:
    """Number of ways to cut ``num_layers`` layers into ``chunks`` non-empty contiguous chunks."""
    if chunks < 1 or chunks > num_layers:
        return 0
    return math.comb(num_layers - 1, chunks - 1)


def all_splits(num_layers: int, chunks: int) -> Iterator[tuple[int, ...]]:
    """Every composition of ``num_layers`` into ``chunks`` positive parts (cut points between layers)."""
    for cuts in combinations(range(1, num_layers), chunks - 1):
        bounds = (0, *cuts, num_layers)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(chunks))


def splits_of(lay: ResolvedLayout, num_layers: int, max_splits: int = MAX_SPLITS) -> list[tuple[int, ...]]:
    """The layer splits the oracle costs for ``lay``: all of them when few enough, else the uniform one."""
    chunks = len(lay.stage_layers)
    if lay.pp > 1 and split_count(num_layers, chunks) <= max_splits:
        return list(all_splits(num_layers, chunks))
    return [lay.stage_layers]


def enumerates_all_splits(request: PlanRequest, max_splits: int = MAX_SPLITS) -> bool:
    """Whether the oracle tries every layer split of every pipelined layout of ``request``."""
    job = request.job_spec()
    layers = request.model.num_layers or 0
    return all(
        split_count(layers, len(lay.stage_layers)) <= max_splits
        for lay in enumerate_layouts(job, request.search, Reach.ALL)
        if lay.pp > 1
    )


def brute_force(request: PlanRequest, max_splits: int = MAX_SPLITS) -> list[Estimate]:
    """Every (layout, layer split) of ``request`` that fits in memory, sorted by step time."""
    job = request.job_spec()
    ctx = build_context(job)
    gib = request.search.memory_headroom_gib
    headroom = gib * GIB if gib is not None else None
    layers = request.model.num_layers or 0
    fitting: list[Estimate] = []
    uneven = space_frameworks(job, request.search).take_stage_counts
    for lay in enumerate_layouts(job, request.search, Reach.ALL):
        for split in splits_of(lay, layers, max_splits) if uneven else [lay.stage_layers]:
            candidate = lay if split == lay.stage_layers else replace(lay, stage_layers=split)
            est = best_estimate(ctx, candidate, headroom_bytes=headroom)
            if est.fits_memory:
                fitting.append(est)
    fitting.sort(key=lambda e: e.step_time_s)
    return fitting


def layout_key(lay: ResolvedLayout) -> ResolvedLayout:
    """A layout without its layer split (what the planner returns at most once)."""
    return replace(lay, stage_layers=())


def best_per_layout(estimates: list[Estimate]) -> list[Estimate]:
    """Each distinct layout once, with its fastest split; sorted by step time."""
    best: dict[ResolvedLayout, Estimate] = {}
    for est in estimates:
        key = layout_key(est.layout)
        if key not in best or est.step_time_s < best[key].step_time_s:
            best[key] = est
    return sorted(best.values(), key=lambda e: e.step_time_s)


def verify(request: PlanRequest, rel_tol: float = 1e-6) -> list[str]:
    """Compare the planner with the oracle; return the disagreements (empty: they agree)."""
    result = search(request)
    oracle = best_per_layout(brute_force(request))
    if request.search.diverse:  # the top-k is one layout per family
        oracle = pick(oracle, len(oracle), True)
    problems: list[str] = []
    if not oracle:
        if result.status != "infeasible":
            problems.append(f"oracle: nothing fits; planner status {result.status}")
        return problems
    if not result.estimates:
        problems.append(f"oracle best {oracle[0].step_time_s:.9g} s; planner returned no plan ({result.status})")
        return problems
    for k, plan in enumerate(result.estimates):
        if k >= len(oracle):
            problems.append(f"plan {k}: planner returned more distinct layouts than fit ({len(oracle)})")
            break
        want = oracle[k].step_time_s
        if abs(plan.step_time_s - want) > rel_tol * want:
            problems.append(f"plan {k}: planner {plan.step_time_s:.9g} s, oracle {want:.9g} s")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help="PlanRequest JSON file ('-' for stdin)")
    parser.add_argument("--verify", action="store_true", help="compare with the planner's answer")
    parser.add_argument("--top", type=int, default=5, help="distinct layouts to print")
    args = parser.parse_args(argv)
    if args.request == "-":
        text = sys.stdin.read()
    else:
        with open(args.request, encoding="utf-8") as fh:
            text = fh.read()
    request = PlanRequest.model_validate(json.loads(text))
    ranked = best_per_layout(brute_force(request))
    if not ranked:
        print("nothing fits in memory")
    for est in ranked[: args.top]:
        lay = est.layout
        print(
            f"{est.step_time_s:.6f} s  MFU {est.mfu:.4f}  tp={lay.tp} pp={lay.pp} dp={lay.dp} cp={lay.cp} "
            f"ep={lay.ep} vpp={lay.vpp} mbs={lay.micro_batch_size} zero={lay.zero_stage} {lay.recompute} "
            f"split={list(lay.stage_layers)} placement={est.placement}"
        )
    if args.verify:
        problems = verify(request)
        print("planner agrees with the oracle" if not problems else "\n".join(problems))
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
