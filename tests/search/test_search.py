"""The planner search (``optimizer.search.search``) against an exhaustive oracle on generated jobs.

On generated small jobs the planner's ranked answers equal those of ``optimizer.search.brute_force``
(every layout, every rank order, every layer split); ``check_against_oracle`` is the comparison the
other search test modules use too.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from optimizer.cost import build_context, estimate
from optimizer.cost.topology import every_order
from optimizer.results import PlanResponse
from optimizer.search.brute_force import best_per_layout, brute_force, enumerates_all_splits, splits_of
from optimizer.search.ranking import pick
from optimizer.search.space import enumerate_layouts
from optimizer.service import search_plans
from optimizer.specs import JobSpec
from optimizer.units import GIB
from tests.search.search_helpers import JOB_ONLY_NON_UNIFORM_FITS, _request, describe

REL = 1e-6
"""Relative tolerance between planner and oracle step times."""


CLUSTER_GPUS = {"dgx-a100": [8, 16, 32, 64], "dgx-h100": [8, 16, 32, 64], "gb200-nvl72": [8, 16, 36, 72, 108, 144, 148]}
CLUSTER_BATCHES = {
    "dgx-a100": [8, 16, 32, 64],
    "dgx-h100": [8, 16, 32, 64],
    "gb200-nvl72": [8, 16, 36, 72, 144, 148, 296],
}
ORACLE_BUDGET = 2500
"""Most (layout, split) pairs the oracle may cost for one generated job (keeps the test fast)."""


def oracle_work(job: dict[str, Any]) -> int:
    req = _request(job)
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    layers = req.model.num_layers or 0
    return sum(len(splits_of(lay, layers)) for lay in enumerate_layouts(spec, req.search))


def tighten_headroom(job: dict[str, Any], frac: float) -> None:
    """Set ``memory_headroom_gib`` so that usable memory sits near the most frugal layout's peak.

    ``frac`` places it between the smallest and the median peak of the uniform-split layouts;
    a negative ``frac`` leaves only non-uniform splits (or nothing) that can fit.
    """
    req = _request(job)
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(spec)
    peaks = sorted(
        estimate(ctx, lay, every_order(lay.sizes())[0]).peak_memory_bytes  # memory ignores the rank order
        for lay in enumerate_layouts(spec, req.search)
    )
    if not peaks:
        return
    target = peaks[0] + frac * (peaks[len(peaks) // 2] - peaks[0])
    headroom = math.floor((ctx.gpu.memory_usable_bytes.value - target) / GIB * 1000) / 1000
    job["search"]["memory_headroom_gib"] = min(64.0, max(0.0, headroom))


def job_from_seed(seed: int) -> dict[str, Any]:
    """A small job: 2-12 layers, hidden 256-2048, optional GQA / MoE / MLA, 8-144 GPUs.

    The job is built from one drawn integer so that 30 derandomised examples spread over the
    whole space (hypothesis' own draws stay close to the simplest values for many examples).
    About 40% of the jobs are memory-tight: wide, long-sequence, little sharding allowed, and
    headroom chosen so that only some layouts (sometimes only non-uniform splits, sometimes
    none) fit.
    """
    rng = random.Random(seed)
    hidden = rng.choice([256, 512, 768, 1024, 1536, 2048])
    heads = rng.choice([h for h in (2, 4, 6, 8, 12, 16, 24, 32) if hidden % h == 0 and 32 <= hidden // h <= 256])
    model: dict[str, Any] = {
        "name": "generated",
        "num_layers": rng.randint(2, 12),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0]) if rng.random() < 0.5 else heads,
        "vocab_size": rng.choice([8192, 32000]),
    }
    kind = rng.choice(["dense", "dense", "moe", "mla"])
    if kind != "dense":
        model["moe"] = {
            "num_experts": rng.choice([4, 8, 16]),
            "top_k": rng.randint(1, 2),
            "expert_ffn_hidden_size": rng.choice([hidden, 2 * hidden]),
        }
    if kind == "mla":
        model["mla"] = {
            "kv_lora_rank": 128,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "q_lora_rank": rng.choice([None, 256]),
        }
    preset = rng.choice(sorted(CLUSTER_GPUS))
    num_gpus = rng.choice(CLUSTER_GPUS[preset])
    gbs = rng.choice(CLUSTER_BATCHES[preset])
    seq = rng.choice([1024, 2048, 4096, 8192])
    search_spec: dict[str, Any] = {
        "top_k": rng.randint(1, 4),
        "time_limit_s": 10.0,
        "allow": {
            "zero_stage": rng.sample([0, 1, 2, 3], rng.randint(1, 2)),
            "recompute": rng.sample(["none", "selective", "moe", "full"], rng.randint(1, 2)),
        },
    }
    if "moe" not in model and search_spec["allow"]["recompute"] == ["moe"]:  # a 422 on a dense model
        search_spec["allow"]["recompute"] = ["none"]
    headroom = rng.choice([None, None, 40, 60, 64])
    if headroom is not None:
        search_spec["memory_headroom_gib"] = headroom
    tight = None
    if rng.random() < 0.4:
        preset = rng.choice(["dgx-h100", "dgx-a100"])
        num_gpus = rng.choice([8, 16])
        gbs = rng.choice([8, 16, 32])
        hidden = rng.choice([1536, 2048])
        model.update(
            hidden_size=hidden,
            num_layers=rng.randint(5, 12),
            vocab_size=rng.choice([32000, 128256]),
            num_attention_heads=16,
            num_kv_heads=rng.choice([16, 4]),
        )
        if "moe" in model:
            model["moe"]["expert_ffn_hidden_size"] = 2 * hidden
        seq = rng.choice([8192, 16384, 32768])
        search_spec["allow"].update(zero_stage=rng.choice([[0], [0, 1], [1]]), tp=rng.choice([[1], [1, 2]]), cp=[1])
        tight = rng.choice([-0.03, 0.0, 0.01, 0.05, 0.2])
    job = {
        "model": model,
        "training": {"seq_len": seq, "global_batch_size": gbs},
        "cluster": {"preset": preset, "num_gpus": num_gpus},
        "search": search_spec,
    }
    if random.Random(seed ^ 0x5EED).random() < 0.3:  # name uneven interleaving depths (own draw: the rest unchanged)
        search_spec["allow"]["vpp"] = [1, 2, 3]
    if random.Random(seed ^ 0xF1A7).random() < 0.3:  # flat data-parallel rings (own draw: the rest unchanged)
        job["training"]["dp_collectives"] = "flat"
    if random.Random(seed ^ 0xB10C).random() < 0.3:  # blocking data-parallel collectives (own draw)
        job["training"]["dp_comm_overlap"] = False
    if random.Random(seed ^ 0x6AD5).random() < 0.3:  # fp32 gradients (own draw)
        job["training"]["grad_reduce_in_fp32"] = True
    if random.Random(seed ^ 0xCE).random() < 0.3:  # PyTorch's fp32 cross-entropy (own draw)
        job["training"]["cross_entropy"] = "unfused"
    own = random.Random(seed ^ 0xDE45)
    if "moe" in model and own.random() < 0.4:  # dense first layers (own draw: the rest unchanged)
        model["moe"]["first_dense_layers"] = own.randint(1, model["num_layers"] - 1)
    # Bound the oracle's work: no interleaving, then at most two stages, then fewer GPUs.
    for step in ("vpp", "pp", "gpus", "gpus", "gpus", "gpus"):
        if oracle_work(job) <= ORACLE_BUDGET:
            break
        if step == "vpp":
            search_spec["allow"]["vpp"] = [1]
        elif step == "pp":
            search_spec["allow"]["pp"] = [1, 2]
        elif job["cluster"]["num_gpus"] > 8:
            job["cluster"]["num_gpus"] //= 2
    if tight is not None:
        tighten_headroom(job, tight)
    return job


small_jobs = st.integers(min_value=0, max_value=2**32 - 1).map(job_from_seed)


# Nothing fits in memory (every layout, every split): the planner must say infeasible.
JOB_NOTHING_FITS = {
    "model": {
        "name": "generated",
        "num_layers": 7,
        "hidden_size": 1536,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "vocab_size": 128256,
    },
    "training": {"seq_len": 32768, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "search": {
        "top_k": 3,
        "time_limit_s": 10.0,
        "allow": {"zero_stage": [1], "recompute": ["selective", "none"], "tp": [1, 2], "cp": [1]},
        "memory_headroom_gib": 63.073,
    },
}


def check_against_oracle(job: dict[str, Any]) -> PlanResponse:
    """Assert the planner's answer matches the brute force's; returns the planner's response."""
    req = _request(job)
    response = search_plans(req)
    oracle = pick(best_per_layout(brute_force(req)), 10**9, req.search.diverse)  # one per family when diverse
    context = (
        f"\njob: {json.dumps(job)}\nplanner ({response.status}): "
        + "; ".join(describe(p) for p in response.plans)
        + "\noracle: "
        + "; ".join(
            f"{e.step_time_s:.6g}s tp={e.layout.tp} pp={e.layout.pp} vpp={e.layout.vpp} ep={e.layout.ep} "
            f"mbs={e.layout.micro_batch_size} zero={e.layout.zero_stage} {e.layout.recompute} "
            f"split={list(e.layout.stage_layers)} placement={e.placement}"
            for e in oracle[: req.search.top_k + 1]
        )
    )
    assert response.status in {"optimal", "infeasible"}, context
    if not oracle:
        assert response.status == "infeasible", context
        assert not response.plans, context
        return response
    assert response.status == "optimal", context
    assert all(p.fits_memory for p in response.plans), context
    assert response.plans[0].step_time_s <= oracle[0].step_time_s * (1 + REL), context
    if enumerates_all_splits(req):
        assert len(response.plans) == min(req.search.top_k, len(oracle)), context
        for k, plan in enumerate(response.plans):
            assert plan.step_time_s == pytest.approx(oracle[k].step_time_s, rel=REL), f"rank {k}" + context
    return response


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # shrinking a seed means nothing; report the job itself
    suppress_health_check=[HealthCheck.too_slow],
)
@given(job=small_jobs)
@example(job=JOB_NOTHING_FITS)
@example(job=JOB_ONLY_NON_UNIFORM_FITS)
def test_planner_agrees_with_brute_force(job: dict[str, Any]) -> None:
    check_against_oracle(job)
