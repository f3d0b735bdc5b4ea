"""Time of the planner's bounding phase: every family of the layout space bounded and ordered.

Two ways over the same space and the same cost-model functions, each from an empty per-job
context cache (so both include computing the per-layer bound terms):

- per family: ``layout_families`` builds every family's first layout, ``lower_bound_terms`` and
  ``bound_at_vpp`` / ``family_bound`` bound it, and a heap orders the entries (what the planner did
  before ``search.bounds``);
- arrays: ``layout_blocks`` and ``space_bounds`` (what the planner does;
  ``search_latency.vectorised_bounds_s``).

Both give the same bounds (``tests/search/test_search_bounds.py``).

    python benchmarks/bound_phase.py
"""

from __future__ import annotations

import heapq
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.search_latency import JOBS, vectorised_bounds_s
from optimizer.cost import build_context
from optimizer.cost.context import clear_context_cache
from optimizer.search.lower_bounds import bound_at_vpp, family_bound, lower_bound_terms
from optimizer.search.space import layout_families
from optimizer.specs import JobSpec, PlanRequest


def _job(body: dict) -> tuple[JobSpec, PlanRequest]:
    req = PlanRequest.model_validate(body)
    return req.job_spec(), req


def per_family(body: dict) -> tuple[float, int]:
    clear_context_cache()
    t0 = time.perf_counter()
    job, req = _job(body)
    ctx = build_context(job)
    families = list(layout_families(job, req.search))
    queue = []
    for i, (fam, terms) in enumerate(zip(families, lower_bound_terms(ctx, [f.first for f in families]), strict=True)):
        lay = fam.first
        queue.append((bound_at_vpp(ctx, terms, lay.pp, lay.vpp, lay.num_micro_batches), 2 * i))
        if fam.more_vpps:
            queue.append((family_bound(ctx, terms, lay.pp, fam.more_vpps, lay.num_micro_batches), 2 * i + 1))
    heapq.heapify(queue)
    return time.perf_counter() - t0, len(families)


def arrays(body: dict) -> float:
    return vectorised_bounds_s(PlanRequest.model_validate(body))


def main() -> int:
    print("| job | families | per family (s) | arrays (s) |")
    print("|---|---:|---:|---:|")
    for name, body in JOBS:
        slow, n = per_family(body)
        fast = arrays(body)
        print(f"| {name} | {n:,} | {slow:.2f} | {fast:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
