"""``split_mixes.sums_of_runs``: the layer-kind mixes ``vpp`` runs of consecutive layers add up
to. Past ``SHIFT_WORK_MAX`` it builds them by doubling with FFT convolutions; both ways give the
same sets, and a long model of two layer kinds is bounded by the request's time limit again."""

from __future__ import annotations

import random
import time

import pytest

from optimizer.search import split_mixes
from optimizer.service import plan
from optimizer.specs import PlanRequest


@pytest.mark.parametrize(("kinds", "most", "seed"), [(1, 40, 0), (2, 30, 1), (2, 60, 2), (3, 10, 3), (2, 45, 4)])
def test_convolved_sums_equal_shifted_sums(kinds: int, most: int, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    runs = {tuple(rng.randint(0, most // 3) for _ in range(kinds)) for _ in range(rng.randint(1, 80))}
    vpp = rng.randint(1, 9)
    shifted = split_mixes.sums_of_runs(runs, vpp, most, kinds)
    monkeypatch.setattr(split_mixes, "SHIFT_WORK_MAX", 0)  # force the convolutions
    assert split_mixes.sums_of_runs(runs, vpp, most, kinds) == shifted
    assert shifted  # the all-zero run or short sums are always reachable


def test_a_long_two_kind_model_keeps_to_its_time_limit() -> None:
    """512 layers (300 dense, then 212 MoE): ~130,000 distinct runs; the shifted-grid pass took
    30 s before the split models' time limit applied, the doubling takes about 1 s."""
    job = {"model": {"num_layers": 512, "hidden_size": 1024, "num_attention_heads": 32, "vocab_size": 32000,
                     "moe": {"num_experts": 64, "top_k": 2, "expert_ffn_hidden_size": 1024, "first_dense_layers": 300}},
           "training": {"seq_len": 4096, "global_batch_size": 256},
           "cluster": {"preset": "dgx-h100", "num_gpus": 64}, "search": {"top_k": 1, "time_limit_s": 3}}  # fmt: skip
    start = time.perf_counter()
    answer = plan(PlanRequest.model_validate(job))
    assert answer.plans
    assert time.perf_counter() - start < 3 + 2 + 5  # the limit, the grace, and slack for a loaded machine
