"""What every interleaving depth costs and gains on DeepSeek-V3-like models.

Models whose MoE layers follow a few dense ones (DeepSeek-V3: 3 dense, then 58 MoE) get every
interleaving depth in the default space, uneven chunks included; models whose dense and MoE layers
alternate leave the uneven depths out above ``space.UNEVEN_DEPTHS_DEFAULT_MAX`` layouts. This
script plans a fixed set of DeepSeek-V3-like jobs both ways: with the default space, and with the
rule that used to apply to them too (uneven depths left out above the same count), and prints
the planner's time and best step time for each.

    python benchmarks/depth_sweep.py > docs/depth_sweep.md   # about 5 minutes on a 2-core machine
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.cost.context import clear_context_cache
from optimizer.service import search_plans
from optimizer.specs import ModelSpec, PlanRequest

H800 = {"preset": "dgx-h100", "gpu": "h800-sxm-80gb"}
CLUSTERS: list[tuple[dict[str, Any], tuple[int, ...]]] = [
    (H800, (128, 512, 1024, 4096)),
    ({"preset": "dgx-h100"}, (256, 2048, 8192)),
    ({"preset": "gb200-nvl72"}, (576, 1152, 2304)),
    ({"preset": "dgx-b200"}, (256, 1024)),
]
MODELS: list[tuple[str, dict[str, Any]]] = [
    ("61L", {"preset": "deepseek-v3"}),
    # a smaller relative: 30 layers, one dense, 64 experts
    ("30L", {"preset": "deepseek-v3", "num_layers": 30,
             "moe": {"num_experts": 64, "top_k": 6, "expert_ffn_hidden_size": 2048, "first_dense_layers": 1,
                     "num_shared_experts": 2}}),
]  # fmt: skip
SEQUENCES_PER_GPU = (2, 8)


def jobs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for label, model in MODELS:
        for cluster, sizes in CLUSTERS:
            for n in sizes:
                for per_gpu in SEQUENCES_PER_GPU:
                    name = f"{label} {cluster.get('gpu', cluster['preset'])} {n}, batch {per_gpu * n}"
                    out.append((name, {
                        "model": model,
                        "training": {"seq_len": 4096, "global_batch_size": per_gpu * n},
                        "cluster": {**cluster, "num_gpus": n},
                        "search": {"time_limit_s": 60},
                    }))  # fmt: skip
    return out


def plan(body: dict[str, Any], old_rule: bool) -> tuple[float, str, float | None]:
    """(wall time, status, best step time) of one request, with or without the old rule."""
    saved = ModelSpec.alternates_layer_kinds
    if old_rule:  # uneven depths left out above the count for every model that mixes kinds
        ModelSpec.alternates_layer_kinds = property(lambda self: self.mixes_layer_kinds)  # type: ignore[method-assign]
    try:
        clear_context_cache()
        t0 = time.perf_counter()
        response = search_plans(PlanRequest.model_validate(body))
        elapsed = time.perf_counter() - t0
    finally:
        ModelSpec.alternates_layer_kinds = saved  # type: ignore[method-assign]
    return elapsed, response.status, response.plans[0].step_time_s if response.plans else None


HEADER = """# Every interleaving depth on DeepSeek-V3-like models

`python benchmarks/depth_sweep.py > docs/depth_sweep.md` on a 2-core machine. "Old rule": uneven
depths left out above 40,000 layouts (what every model mixing dense and MoE layers had); "every
depth": the default space now. Times are wall seconds of one run each (they move 10-40% between
runs); step times are the best plan's.
"""


def fmt(v: float | None) -> str:
    return f"{v:.4f}" if v is not None else "-"


def main() -> None:
    print(HEADER)
    print("| job | old rule (s) | every depth (s) | status | old rule step (s) | every depth step (s) | gain |")
    print("|---|---:|---:|---|---:|---:|---:|")
    worst_default = worst_old = 0.0
    faster = gains = 0
    best_gain = 0.0
    rows = jobs()
    for name, body in rows:
        old_s, _, old_step = plan(body, old_rule=True)
        new_s, status, step = plan(body, old_rule=False)
        worst_default, worst_old = max(worst_default, new_s), max(worst_old, old_s)
        gain = 0.0
        if step is not None and old_step is not None:
            gains += 1
            gain = 1.0 - step / old_step
            if gain > 1e-9:
                faster += 1
                best_gain = max(best_gain, gain)
        print(f"| {name} | {old_s:.2f} | {new_s:.2f} | {status} | {fmt(old_step)} | {fmt(step)} | {gain:.1%} |",
              flush=True)  # fmt: skip
    print()
    print(
        f"{len(rows)} jobs: every depth took at most {worst_default:.2f} s (old rule: {worst_old:.2f} s) and gave "
        f"a faster plan on {faster} of the {gains} with a plan, by up to {best_gain:.1%}."
    )


if __name__ == "__main__":
    main()
