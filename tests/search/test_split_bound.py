"""``stage_split_reaches`` against brute force, and what it saves the search.

- Exact for its relaxation: it says yes at the smallest slowest-stage time any split with kinds
  placed anywhere reaches, and no just below it (every such split enumerated).
- Sound for real splits: every split in model order (contiguous stages, each within its memory
  limit) reaches its own slowest-stage time.
- On DeepSeek-V3 (3 dense + 58 MoE layers) the search builds far fewer split models with it, and
  plans the same.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.search.split_bound import stage_split_reaches
from optimizer.service import search_plans
from optimizer.specs import PlanRequest


def _compositions(total: int, parts: int, lo: int, his: list[int]):
    """Every way to write ``total`` as ``parts`` ordered counts, part ``i`` in ``[lo, his[i]]``."""
    if parts == 1:
        if lo <= total <= his[0]:
            yield (total,)
        return
    for first in range(lo, min(his[0], total) + 1):
        for rest in _compositions(total - first, parts - 1, lo, his[1:]):
            yield (first, *rest)


def _relaxed_optimum(times, counts, head, lo, his) -> float:
    """Smallest slowest-stage time over every split with layer kinds on any stage."""
    stages = len(his)
    best = float("inf")
    few = 0 if len(counts) == 1 else min(range(2), key=lambda k: counts[k])
    for sizes in _compositions(sum(counts), stages, lo, his):
        if len(counts) == 1:
            placements = [[0] * stages]
        else:
            placements = [p for p in _compositions(counts[few], stages, 0, list(sizes))]
        for cheap in placements:
            worst = 0.0
            for s, (n, c) in enumerate(zip(sizes, cheap, strict=True)):
                t = n * times[0] if len(counts) == 1 else c * times[few] + (n - c) * times[1 - few]
                worst = max(worst, t + (head if s == stages - 1 else 0.0))
            best = min(best, worst)
    return best


@st.composite
def _cases(draw):
    kinds = draw(st.integers(1, 2))
    times = [draw(st.floats(0.1, 3.0)) for _ in range(kinds)]
    counts = [draw(st.integers(1, 6)) for _ in range(kinds)]
    layers = sum(counts)
    stages = draw(st.integers(1, min(4, layers)))
    lo = draw(st.integers(1, max(1, layers // stages)))
    his = [draw(st.integers(lo, layers)) for _ in range(stages)]
    head = draw(st.sampled_from([0.0, 0.5, 2.5]))
    return times, counts, head, lo, his


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_exact_for_the_relaxation(case) -> None:
    times, counts, head, lo, his = case
    optimum = _relaxed_optimum(times, counts, head, lo, his)
    if optimum == float("inf"):  # the limits hold fewer layers than the model has
        assert not stage_split_reaches(1e9, times, counts, head, lo, his)
        return
    assert stage_split_reaches(optimum, times, counts, head, lo, his)
    assert not stage_split_reaches(optimum * (1 - 1e-6), times, counts, head, lo, his)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2, max_size=9), st.integers(1, 4), st.data())
def test_every_split_in_model_order_reaches_its_own_time(kinds, stages, data) -> None:
    stages = min(stages, len(kinds))
    times = (data.draw(st.floats(0.1, 3.0)), data.draw(st.floats(0.1, 3.0)))
    head = data.draw(st.sampled_from([0.0, 1.0]))
    his = [data.draw(st.integers(1, len(kinds))) for _ in range(stages)]
    present = sorted(set(kinds))
    counts = [kinds.count(k) for k in present]
    kind_times = [times[k] for k in present]
    for sizes in _compositions(len(kinds), stages, 1, his):
        start, worst = 0, 0.0
        for s, n in enumerate(sizes):
            t = sum(times[k] for k in kinds[start : start + n]) + (head if s == stages - 1 else 0.0)
            worst, start = max(worst, t), start + n
        assert stage_split_reaches(worst, kind_times, counts, head, 1, his)


def test_deepseek_v3_stages_hold_whole_moe_layers() -> None:
    # 3 dense layers (0.6) and 58 MoE layers (1.0) on 8 stages: the average stage is 7.475, but
    # seven stages without a dense layer can hold 7 MoE layers each below 8.0, and the stage with
    # all three dense layers needs 12 layers (3 * 0.6 + 9 * 1.0 = 10.8) for the rest.
    times, counts = (0.6, 1.0), (3, 58)
    assert not stage_split_reaches(7.99, times, counts, 0.0, 1, [61] * 8)
    assert stage_split_reaches(8.0, times, counts, 0.0, 1, [61] * 8)
    # a memory limit of 2 layers on the first stage leaves 59 for the other seven: at 8.6 three
    # of them hold one dense and 8 MoE layers, the other four 8 MoE layers (2 + 27 + 32 = 61)
    assert not stage_split_reaches(8.59, times, counts, 0.0, 1, [2] + [61] * 7)
    assert stage_split_reaches(8.6, times, counts, 0.0, 1, [2] + [61] * 7)


def test_more_kinds_or_too_much_work_rule_nothing_out() -> None:
    assert stage_split_reaches(0.0, (1.0, 2.0, 3.0), (1, 1, 1), 0.0, 1, [3, 3])
    assert stage_split_reaches(0.0, (1.0, 2.0), (500, 500), 0.0, 1, [1000] * 64)
    assert stage_split_reaches(float("inf"), (1.0, 2.0), (3, 58), 0.0, 1, [61] * 8)  # no k-th best time yet


def _deepseek(extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
        "search": {"time_limit_s": 60, **extra},
    }


def test_deepseek_v3_builds_few_split_models() -> None:
    # Without the test the split phase built 203 models on this job (every depth, uneven ones
    # included), nearly all of which found no split below the k-th best time.
    default = search_plans(PlanRequest.model_validate(_deepseek({})))
    assert default.status == "optimal"
    assert default.solver.candidates_to_solver <= 90
    # no ZeRO-2/3 with pp > 1, and none for an MoE model with bf16 gradients (Megatron-FSDP's
    # scaling at the Megatron-LM pin; fp32 gradients would bring TP1 CP2 EP8 ZeRO-3 back): TP2
    # PP32 CP2 EP8 ZeRO-1 (28.386 s, its sends blocking as Megatron runs a non-interleaved
    # pipeline) ahead of TP1 PP32 CP2 (29.469 s)
    best = default.plans[0].config
    assert (best.tp, best.pp, best.cp, best.ep, best.zero_stage, best.recompute) == (2, 32, 2, 8, 1, "core_attn")
    assert abs(default.plans[0].step_time_s - 28.3859) < 1e-3
    runner_up = default.plans[1]
    assert abs(runner_up.step_time_s - 29.4686) < 1e-3
    assert (runner_up.config.tp, runner_up.config.pp, runner_up.config.zero_stage) == (1, 32, 1)
    # MoE layers after three dense ones: every depth is in the default space, nothing left out
    assert default.solver.left_out_depths_bound_s is None
    assert not any("unequal chunks" in w for w in default.warnings)
