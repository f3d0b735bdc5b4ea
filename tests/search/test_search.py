"""The planner search (``optimizer.search.search``) against an exhaustive oracle and on named jobs.

- Agreement: on generated small jobs the planner's ranked answers equal those of
  ``optimizer.search.brute_force`` (every layout, every rank order, every layer split).
- Every returned plan re-evaluates to the same numbers through ``/evaluate``.
- Determinism, placement that emerges from the cost model, non-uniform splits under memory
  pressure, infeasible jobs, ``search.fix`` / ``search.allow``, and the seed scenario.
"""

from __future__ import annotations

import json
import math
import random
from functools import lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from jobs import GPT3_175B_ON_1024_H100, job_copy
from optimizer.cost import build_context, estimate, resolve_layout
from optimizer.cost.topology import candidate_orders
from optimizer.errors import InvalidLayout
from optimizer.results import PlanResponse
from optimizer.search.brute_force import (
    best_per_layout,
    brute_force,
    enumerates_all_splits,
    splits_of,
)
from optimizer.search.cpsat import Candidate, SplitModel
from optimizer.search.fit_limits import stage_fit_limits
from optimizer.search.ranking import pick
from optimizer.search.space import enumerate_layouts
from optimizer.search.split_tables import certified_split_range, split_tables
from optimizer.service import evaluate, search_plans
from optimizer.specs import EvaluateRequest, JobSpec, Layout, PlacementSpec, PlanRequest, SearchSpec
from optimizer.units import GIB

REL = 1e-6
"""Relative tolerance between planner and oracle step times."""
REEVAL_REL = 1e-9


@pytest.fixture
def without_expert_host_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cost every job of the test with ``expert_gemm_host_s`` = 0 (search, brute force and
    re-scoring alike): for planner-mechanics scenarios found before the host floor on small
    expert GEMMs, whose plans it moves (docs/cost-model.md)."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    monkeypatch.setattr(build_context, "__defaults__", (dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0),))


def _request(job: dict[str, Any]) -> PlanRequest:
    return PlanRequest.model_validate(job)


@lru_cache(maxsize=32)
def _planned(job_json: str):
    """One planner answer per distinct request (shared by the tests that only read it)."""
    return search_plans(_request(json.loads(job_json)))


def planned(job: dict[str, Any]):
    return _planned(json.dumps(job, sort_keys=True))


def describe(plan) -> str:
    c = plan.config
    return (
        f"tp={c.tp} pp={c.pp} dp={c.dp} cp={c.cp} ep={c.ep} vpp={c.vpp} mbs={c.micro_batch_size} "
        f"zero={c.zero_stage} {c.recompute} split={c.stage_layers} placement={plan.placement} "
        f"step={plan.step_time_s:.6g}s mfu={plan.mfu:.4f}"
    )


# ---- generated small jobs --------------------------------------------------------------------

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
        estimate(ctx, lay, candidate_orders(lay.sizes())[0]).peak_memory_bytes  # memory ignores the rank order
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
# No uniform split fits; some non-uniform splits of pipelined layouts do.
JOB_ONLY_NON_UNIFORM_FITS = {
    "model": {
        "name": "generated",
        "num_layers": 11,
        "hidden_size": 1536,
        "num_attention_heads": 16,
        "num_kv_heads": 16,
        "vocab_size": 32000,
    },
    "training": {"seq_len": 32768, "global_batch_size": 32},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 3,
        "time_limit_s": 10.0,
        "allow": {"zero_stage": [0], "recompute": ["selective", "none"], "tp": [1], "cp": [1]},
        "memory_headroom_gib": 63.008,
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


# Small jobs that exposed planner/oracle disagreements, kept as regression cases.
# 1. A pipelined layout whose uniform split does not fit is costed with the canonical rank order
#    only (best_estimate stops at the first order when memory does not fit); the plan for the
#    split CP-SAT finds must use the best rank order for that split (here pp on NVLink, dp
#    across nodes), not the canonical one (1.4% slower).
JOB_RESCUED_ORDER = {
    "model": {
        "name": "generated",
        "num_layers": 6,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "vocab_size": 128256,
    },
    "training": {"seq_len": 8192, "global_batch_size": 32},
    "cluster": {"preset": "dgx-a100", "num_gpus": 16},
    "search": {
        "top_k": 1,
        "memory_headroom_gib": 64.0,
        "fix": {"tp": 1, "pp": 2, "cp": 1, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none"},
    },
}
# 2. The CP-SAT objective holds the data-parallel and optimizer-step terms at their uniform-split
#    values, but the cost model takes both from the heaviest stage (stage 0 also holds the
#    embedding). Splits with the same slowest stage tie in CP-SAT and it returns [4, 4, 1, 1]
#    (optimizer step 2.49 ms) where [1, 4, 4, 1] (1.67 ms) is 0.4% faster overall.
JOB_SPLIT_OBJECTIVE = {
    "model": {
        "name": "generated",
        "num_layers": 10,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "vocab_size": 128256,
    },
    "training": {"seq_len": 4096, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 1,
        "fix": {"tp": 1, "pp": 4, "cp": 1, "vpp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"},
    },
}


# 3. Mostly dense MoE model, ZeRO-3, latency-bound: a stage that holds only dense layers must pay
#    the same expert-data-parallel latency per layer as the average stage the split floor is built
#    from. A rule that skipped zero-byte collectives per message made the floor of TP1 PP4 EP2 exceed
#    its true best split, and the planner answered "optimal" 10.8% above the oracle.
JOB_DENSE_ONLY_STAGES = {
    "model": {
        "name": "g",
        "num_layers": 6,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "ffn_hidden_size": 512,
        "vocab_size": 1024,
        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256, "first_dense_layers": 4},
    },
    "training": {"seq_len": 512, "global_batch_size": 256},
    "cluster": {"preset": "dgx-a100", "num_gpus": 128},
    "search": {
        "top_k": 1,
        "allow": {"zero_stage": [3], "vpp": [1], "recompute": ["none"], "tp": [1], "ep": [1, 2], "pp": [1, 2, 4]},
    },
}


@pytest.mark.parametrize(
    "job",
    [
        JOB_RESCUED_ORDER,
        JOB_SPLIT_OBJECTIVE,
        JOB_DENSE_ONLY_STAGES,
        {**JOB_DENSE_ONLY_STAGES, "training": {**JOB_DENSE_ONLY_STAGES["training"], "dp_collectives": "flat"}},
        {**JOB_SPLIT_OBJECTIVE, "training": {**JOB_SPLIT_OBJECTIVE["training"], "dp_comm_overlap": False}},
    ],
    ids=[
        "rescued-order",
        "split-objective",
        "dense-only-stages",
        "dense-only-stages-flat",
        "split-objective-blocking-dp",
    ],
)
def test_planner_agrees_with_brute_force_on_known_cases(job: dict[str, Any]) -> None:
    check_against_oracle(job)


# 4. The split tables' per-layer memory leaves out the allocator-fragmentation share of the
#    gradients (the cost model adds ``fragmentation * (activations + gradients)`` to each stage),
#    so a split that moves layers off a stage is predicted 8% of those layers' gradient bytes
#    heavier there than it is. With usable memory just above the most frugal split's peak
#    ([8, 1], ~18.06 GiB; CP-SAT predicts ~18.10 GiB) the planner answers infeasible.
JOB_SPLIT_MEMORY = {
    "model": {
        "name": "generated",
        "num_layers": 9,
        "hidden_size": 1536,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "vocab_size": 32000,
    },
    "training": {"seq_len": 65536, "global_batch_size": 8},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 1,
        "fix": {"tp": 1, "pp": 2, "cp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"},
    },
}


def test_planner_agrees_with_brute_force_when_only_the_most_frugal_split_fits() -> None:
    every_split = brute_force(_request(JOB_SPLIT_MEMORY))  # all 8 splits fit with the default headroom
    frugal = min(every_split, key=lambda e: e.peak_memory_bytes)
    headroom_gib = (frugal.capacity_bytes - frugal.peak_memory_bytes) / GIB - 0.02
    assert 0 < headroom_gib <= 64
    job = {**JOB_SPLIT_MEMORY, "search": {**JOB_SPLIT_MEMORY["search"], "memory_headroom_gib": headroom_gib}}
    check_against_oracle(job)


# 5. Models with several layer kinds (dense-first layers, MoE every other layer): a stage's mix
#    depends on where it starts. With one chunk per stage the split model reads exact per-start
#    tables; the positional approximation it used before put an MoE layer where the last stage
#    really holds a dense one, ruled the layout out of memory and answered 1.481 s as optimal where
#    [2, 3, 3, 1] gives 1.392 s.
JOB_SEVERAL_KINDS = {
    "model": {
        "name": "generated",
        "num_layers": 9,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 16,
        "vocab_size": 128256,
        "moe": {
            "num_experts": 8,
            "top_k": 2,
            "expert_ffn_hidden_size": 4096,
            "first_dense_layers": 1,
            "layer_frequency": 2,
        },
        "mla": {
            "kv_lora_rank": 128,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
            "q_lora_rank": None,
        },
    },
    "training": {"seq_len": 16384, "global_batch_size": 8},
    "cluster": {"preset": "dgx-a100", "num_gpus": 8},
    "search": {
        "top_k": 1,
        "time_limit_s": 10.0,
        "allow": {"zero_stage": [0], "recompute": ["selective", "moe"], "tp": [1], "cp": [1]},
        "memory_headroom_gib": 57.491,
    },
}
# 6. The same with interleaved stages (two chunks per stage): a stage's mix depends on how each of
#    its chunks is cut; the split model follows every chunk (the even split's mixes gave
#    [2, 1, 3, 2] at 2.224 s where [3, 1, 2, 2] gives 2.168 s).
JOB_SEVERAL_KINDS_INTERLEAVED = {
    "model": {
        "name": "generated",
        "num_layers": 8,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 16,
        "vocab_size": 128256,
        "moe": {
            "num_experts": 4,
            "top_k": 2,
            "expert_ffn_hidden_size": 4096,
            "first_dense_layers": 3,
            "layer_frequency": 1,
        },
    },
    "training": {"seq_len": 32768, "global_batch_size": 32},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "search": {
        "top_k": 3,
        "time_limit_s": 10.0,
        "allow": {"zero_stage": [0], "recompute": ["moe", "none"], "tp": [1], "cp": [1]},
        "memory_headroom_gib": 37.073,
    },
}


def test_planner_agrees_with_brute_force_on_a_model_with_several_layer_kinds() -> None:
    check_against_oracle(JOB_SEVERAL_KINDS)


def test_planner_agrees_with_brute_force_on_interleaved_stages_of_several_layer_kinds() -> None:
    check_against_oracle(JOB_SEVERAL_KINDS_INTERLEAVED)


def test_splits_without_exact_tables_are_not_claimed_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the per-mix tables would be too large the split model falls back to the even split's
    mixes: the answer is then `feasible`, with a valid bound."""
    import importlib

    monkeypatch.setattr(importlib.import_module("optimizer.search.split_tables"), "SPLIT_MIX_TABLE_MAX", 0)
    req = _request(JOB_SEVERAL_KINDS_INTERLEAVED)
    response = search_plans(req)
    oracle = best_per_layout(brute_force(req))
    assert response.status == "feasible", response.solver
    assert not response.solver.proved_optimal
    assert any("several layer kinds" in w for w in response.warnings), response.warnings
    assert response.solver.objective_bound is not None
    assert response.solver.objective_bound <= oracle[0].step_time_s <= response.plans[0].step_time_s


def _best_pair_times_out(monkeypatch: pytest.MonkeyPatch, req: PlanRequest, retries_too: bool) -> list[str]:
    """Make the split models of the best plan's layout end UNKNOWN (their limit): its first solve,
    or every one when ``retries_too``; returns the statuses those solves returned."""
    from optimizer.search import cpsat
    from optimizer.search.cpsat import SolveResult

    best = search_plans(req).plans[0].config
    solve = cpsat.SplitModel.solve
    seen: list[str] = []

    def times_out(self, *args, **kwargs):
        lay = self.candidates[0].estimate.layout
        mine = (lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, lay.micro_batch_size, lay.zero_stage) == (
            best.tp,
            best.pp,
            best.cp,
            best.ep,
            best.vpp,
            best.micro_batch_size,
            best.zero_stage,
        ) and str(lay.recompute) == best.recompute
        if mine and (retries_too or not seen):
            seen.append("UNKNOWN")
            return SolveResult(None, "UNKNOWN", None)
        result = solve(self, *args, **kwargs)
        if mine:
            seen.append(result.status)
        return result

    monkeypatch.setattr(cpsat.SplitModel, "solve", times_out)
    return seen


def test_a_split_model_stopped_at_its_limit_is_not_claimed_optimal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A split model that ends UNKNOWN (its time limit), again when solved against the final
    k-th best time, proves nothing: the answer is `feasible`, with a warning and a bound no
    higher than the true optimum."""
    req = _request(JOB_SEVERAL_KINDS_INTERLEAVED)
    seen = _best_pair_times_out(monkeypatch, req, retries_too=True)
    response = search_plans(req)
    oracle = best_per_layout(brute_force(req))
    assert seen and set(seen) == {"UNKNOWN"}
    assert response.status == "feasible", response.solver
    assert any("stopped at its" in w for w in response.warnings), response.warnings
    assert response.solver.objective_bound is not None
    assert response.solver.objective_bound <= oracle[0].step_time_s


def test_a_split_model_stopped_early_is_solved_again_against_the_final_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The best plan's split model, stopped once: solved again at the end against the final k-th
    best time (or its layout's best), it proves, and the answer is the brute-force optimum."""
    req = _request(JOB_SEVERAL_KINDS_INTERLEAVED)
    seen = _best_pair_times_out(monkeypatch, req, retries_too=False)
    response = search_plans(req)
    oracle = best_per_layout(brute_force(req))
    assert seen[0] == "UNKNOWN" and "OPTIMAL" in seen[1:], seen
    assert response.status == "optimal", response.solver
    assert response.plans[0].step_time_s == pytest.approx(oracle[0].step_time_s, rel=1e-9)


# ---- named jobs --------------------------------------------------------------------------------

LLAMA70B_64 = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 4096, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
}
MOE_NVL72 = {
    "model": {"preset": "qwen3-30b-a3b"},
    "training": {"seq_len": 4096, "global_batch_size": 288},
    "cluster": {"preset": "gb200-nvl72", "num_gpus": 144},
}
# 30 layers over 4 stages: the uniform split (7, 8, 8, 7) overflows stage 0 (most in-flight
# micro-batches plus the embedding); moving layers to the later stages fits.
DENSE30_NON_UNIFORM = {
    "model": {
        "name": "dense-30l",
        "num_layers": 30,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "vocab_size": 128256,
    },
    "training": {"seq_len": 22528, "global_batch_size": 32},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 3,
        "fix": {"pp": 4, "tp": 1, "cp": 1},
        "allow": {"vpp": [1], "micro_batch_size": [1, 2], "zero_stage": [0, 1], "recompute": ["none", "selective"]},
    },
}
SMALL_DENSE = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "search": {"top_k": 5},
}


def _evaluate_request(job: dict[str, Any], plan) -> EvaluateRequest:
    config = plan.config.model_copy(update={"placement": PlacementSpec(**plan.placement)})
    return EvaluateRequest(model=job["model"], training=job["training"], cluster=job["cluster"], config=config)


@pytest.mark.parametrize(
    "job",
    [LLAMA70B_64, MOE_NVL72, DENSE30_NON_UNIFORM, SMALL_DENSE, JOB_ONLY_NON_UNIFORM_FITS, JOB_RESCUED_ORDER],
    ids=["llama3-70b-64", "qwen3-30b-a3b-144", "dense30-non-uniform", "llama3-8b-16", "only-non-uniform", "rescued"],
)
def test_every_plan_re_evaluates_identically(job: dict[str, Any]) -> None:
    response = planned(job)
    assert response.plans
    for plan in response.plans:
        again = evaluate(_evaluate_request(job, plan))
        assert again.step_time_s == pytest.approx(plan.step_time_s, rel=REEVAL_REL), describe(plan)
        assert again.mfu == pytest.approx(plan.mfu, rel=REEVAL_REL), describe(plan)
        assert again.memory_gib.total == pytest.approx(plan.memory_gib.total, rel=REEVAL_REL), describe(plan)
        assert again.placement == plan.placement


def test_same_request_gives_identical_plans() -> None:
    first = search_plans(_request(LLAMA70B_64))
    second = search_plans(_request(LLAMA70B_64))
    assert [p.model_dump_json() for p in first.plans] == [p.model_dump_json() for p in second.plans]
    assert first.status == second.status


def test_tensor_parallel_lands_on_nvlink() -> None:
    best = planned(LLAMA70B_64).plans[0]
    assert best.config.tp > 1, describe(best)
    assert best.placement["tp"] == "nvlink", describe(best)


def test_expert_parallel_lands_on_nvlink_in_a_72_gpu_domain() -> None:
    # qwen3-30b-a3b (128 experts, top-8) on 144 GB200, seq 4096, 288 sequences: best is ep=2 on
    # NVLink, dp=144 across the leaf, ZeRO-2, 31.6% MFU (on 72 GB200 also ep=2, 31.5%).
    # mixtral-8x7b (8 experts, top-2) on 72 / 144 GB200: ep=8 on NVLink, ZeRO-3, ~49% MFU.
    response = planned(MOE_NVL72)
    best = response.plans[0]
    assert best.config.ep > 1, describe(best)
    assert best.placement["ep"] == "nvlink", describe(best)


def test_non_uniform_split_when_the_uniform_one_does_not_fit() -> None:
    response = planned(DENSE30_NON_UNIFORM)
    assert response.status in {"optimal", "feasible"}
    best = response.plans[0]
    assert best.fits_memory, describe(best)
    assert best.config.pp == 4 and len(set(best.config.stage_layers or [])) > 1, describe(best)
    uniform = evaluate(
        EvaluateRequest(
            model=DENSE30_NON_UNIFORM["model"],
            training=DENSE30_NON_UNIFORM["training"],
            cluster=DENSE30_NON_UNIFORM["cluster"],
            config=best.config.model_copy(update={"stage_layers": None, "placement": None}),
        )
    )
    assert uniform.config.stage_layers == [7, 8, 8, 7]
    assert not uniform.fits_memory, uniform.memory_gib


def test_dense_1t_on_8_h100_is_infeasible() -> None:
    job = {
        "model": {
            "name": "dense-1t",
            "num_layers": 128,
            "hidden_size": 25600,
            "num_attention_heads": 160,
            "vocab_size": 128256,
        },
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    }
    response = search_plans(_request(job))
    assert response.status == "infeasible"
    assert not response.plans
    assert response.explanation is not None
    assert "GiB" in response.explanation and "capacity" in response.explanation
    assert response.solver.status == "INFEASIBLE" and not response.solver.proved_optimal


def test_fix_is_honoured() -> None:
    job = {**SMALL_DENSE, "search": {"top_k": 5, "fix": {"tp": 2}}}
    response = planned(job)
    assert response.plans
    assert all(p.config.tp == 2 for p in response.plans), [describe(p) for p in response.plans]


def test_allow_is_honoured() -> None:
    job = {**SMALL_DENSE, "search": {"top_k": 5, "allow": {"recompute": ["full"]}}}
    response = planned(job)
    assert response.plans
    assert all(p.config.recompute == "full" for p in response.plans), [describe(p) for p in response.plans]


def test_seed_scenario_gpt3_175b_on_8192_h100() -> None:
    """GPT-3 175B, 8,192 H100, seq 2048, 1,024 sequences (2M tokens) per step.

    The seed text's layout is TP=8, PP=8, DP=128 at 25.9% MFU. The planner's answer:
    TP=4, CP=2, PP=16 with 6 virtual chunks per stage (one layer each), DP=64, micro-batch 1,
    ZeRO-2, no recompute; TP and CP on NVLink, DP and PP across the spine; 0.764 s per step,
    35.9% MFU (status optimal, proved, in ~1 s).
    """
    job = {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8192},
        "search": {"time_limit_s": 60.0},
    }
    response = search_plans(_request(job))
    assert response.status == "optimal", (response.solver, response.warnings)
    best = response.plans[0]
    c = best.config
    assert (c.tp, c.cp, c.pp, c.vpp, c.dp, c.micro_batch_size) == (4, 2, 16, 6, 64, 1), describe(best)
    assert best.placement["tp"] == best.placement["cp"] == "nvlink", describe(best)
    assert best.mfu == pytest.approx(0.359, abs=0.002), describe(best)
    assert best.step_time_s == pytest.approx(0.764, abs=0.002), describe(best)


def test_split_of_a_layout_outside_the_pool_can_win(without_expert_host_floor: None) -> None:
    """Qwen3-235B-A22B on 256 H100 (seq 4096, 1,024 sequences), costed without the host floor on
    small expert GEMMs (which makes ZeRO-3 without pipelining best). With an even split PP=16 does
    not make the candidate pool (94 layers: stages of 6 and 5, the LM head on a full last stage),
    but [6 x 15, 4] (a light last stage for the head) is the best layout (TP1 CP2, 8.222 s), faster than
    the best pool layout (PP=8, [12 x 7, 10]), which the search once returned as `optimal`.
    Every costed pipelined layout whose split floor is below the k-th best time gets its split
    solved, in every rank-order geometry. Without interleaving: the default space's uneven
    interleaved layouts beat all of these (no pp x vpp > pp divides 94 layers)."""
    job = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024, "attention_kernel": "flash2"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"allow": {"vpp": [1]}},
    }
    response = search_plans(_request(job))
    assert response.status == "optimal", (response.solver, response.warnings)
    best = response.plans[0]
    assert best.step_time_s == pytest.approx(8.2223, rel=1e-3), describe(best)
    assert (best.config.tp, best.config.pp, best.config.ep) == (1, 16, 8), describe(best)
    assert best.config.stage_layers == [6] * 15 + [4], describe(best)
    assert all(p.config.pp == 1 or p.config.zero_stage <= 1 for p in response.plans), [
        describe(p) for p in response.plans
    ]


def test_moe_block_recompute_is_searched_only_for_moe_models():
    dense = PlanRequest(**SMALL_DENSE)
    spec = JobSpec(model=dense.model, training=dense.training, cluster=dense.cluster)
    assert {lay.recompute for lay in enumerate_layouts(spec, dense.search)} == {"none", "core_attn", "full"}
    moe_req = PlanRequest(
        model={"preset": "mixtral-8x7b"},
        training={"seq_len": 4096, "global_batch_size": 64},
        cluster={"preset": "dgx-h100", "num_gpus": 16},
    )
    moe_spec = JobSpec(model=moe_req.model, training=moe_req.training, cluster=moe_req.cluster)
    assert {lay.recompute for lay in enumerate_layouts(moe_spec, moe_req.search)} == {
        "none",
        "core_attn",
        "moe",
        "full",
    }


def test_moe_block_recompute_on_a_dense_model_names_the_field():
    req = PlanRequest(**SMALL_DENSE)
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    with pytest.raises(InvalidLayout) as err:
        resolve_layout(job, Layout(tp=1, pp=1, recompute="moe"))
    assert err.value.field == "config.recompute" and "MoE" in err.value.reason


def test_bound_holds_when_domains_do_not_divide_the_groups():
    """148 GPUs on NVL72 racks spread as 4 domains of 37: a 2-rank TP group at stride 1 crosses a
    domain boundary, at stride 2 it does not. The lower bound must not assume stride 1 is the
    most local placement, or the search prunes the best layout (TP2 PP2, 26.9 s here)."""
    from optimizer.cost import best_estimate
    from optimizer.search.lower_bounds import compute_lower_bound_s

    req = PlanRequest(
        model={"preset": "llama3-70b"},
        training={"seq_len": 8192, "global_batch_size": 1184, "attention_kernel": "flash2"},
        cluster={"preset": "gb200-nvl72", "num_gpus": 148},
        search={"top_k": 1, "allow": {"zero_stage": [1], "recompute": ["selective", "full"]}},
    )
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    uniform = [best_estimate(ctx, lay) for lay in enumerate_layouts(job, req.search)]
    for est in uniform:
        assert compute_lower_bound_s(ctx, est.layout) <= est.step_time_s * (1 + 1e-12), est.layout
    best_uniform = min(e.step_time_s for e in uniform if e.fits_memory)
    response = search_plans(req)
    assert response.status == "optimal"
    assert response.plans[0].step_time_s <= best_uniform * (1 + 1e-9)
    assert response.plans[0].step_time_s == pytest.approx(26.93, abs=0.01)


@pytest.mark.parametrize(
    ("model", "cluster", "training", "layout"),
    [
        # a partial xGMI mesh gives a TP2 group less bandwidth than the NIC
        (
            "llama3-8b",
            {"gpu": "mi300x", "num_gpus": 32, "network": "ib-xdr-800"},
            {"seq_len": 1024, "global_batch_size": 32},
            {"tp": 2, "micro_batch_size": 2, "recompute": "none"},
        ),
        # a flat NVLink ring pays more latency steps than a group split over two tiers
        (
            "llama2-7b",
            {"preset": "gb200-nvl72", "num_gpus": 96},
            {"seq_len": 1024, "global_batch_size": 192},
            {"tp": 16, "micro_batch_size": 1, "recompute": "none"},
        ),
        (
            "qwen3-30b-a3b",
            {"preset": "dgx-h100", "num_gpus": 16},
            {"seq_len": 2048, "global_batch_size": 16},
            {"tp": 8, "cp": 2, "ep": 16, "recompute": "full"},
        ),
    ],
)
def test_bound_holds_where_locality_is_not_cheapest(model, cluster, training, layout):
    from optimizer.cost import estimate
    from optimizer.search.lower_bounds import compute_lower_bound_s

    job = JobSpec(model={"preset": model}, training=training, cluster=cluster)
    ctx = build_context(job)
    lay = resolve_layout(job, Layout(pp=1, zero_stage=1, **layout))
    best = min(estimate(ctx, lay, order).step_time_s for order in candidate_orders(lay.sizes()))
    assert compute_lower_bound_s(ctx, lay) <= best * (1 + 1e-12)


def test_planner_finds_tp_on_the_nic_when_the_mesh_is_slower():
    req = PlanRequest(
        model={"preset": "llama3-8b"},
        training={"seq_len": 1024, "global_batch_size": 32},
        cluster={"gpu": "mi300x", "num_gpus": 32, "network": "ib-xdr-800"},
        search={"top_k": 1, "allow": {"zero_stage": [1], "recompute": ["none"]}},
    )
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    ctx = build_context(job)
    from optimizer.cost import best_estimate

    exhaustive = min(
        e.step_time_s for e in (best_estimate(ctx, lay) for lay in enumerate_layouts(job, req.search)) if e.fits_memory
    )
    response = search_plans(req)
    assert response.status == "optimal"
    assert response.plans[0].step_time_s <= exhaustive * (1 + 1e-9)


def test_small_jobs_consider_every_layer_split():
    """A 1M-token vocabulary makes the LM head worth many layers: the best split of 40 layers over
    two stages is [39, 1], far outside a split table around the even share."""
    req = PlanRequest(
        model={"num_layers": 40, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1_000_000},
        training={"seq_len": 2048, "global_batch_size": 16, "attention_kernel": "flash2"},
        cluster={"preset": "dgx-h100", "num_gpus": 8},
        search={
            "top_k": 1,
            "fix": {"pp": 2, "tp": 1, "zero_stage": 1, "recompute": "selective", "micro_batch_size": 1, "vpp": 1},
        },
    )
    response = search_plans(req)
    assert response.status == "optimal"
    assert response.plans[0].config.stage_layers == [39, 1]
    assert response.plans[0].step_time_s == pytest.approx(0.1154, abs=1e-4)


def test_unfused_attention_with_context_parallelism_pinned_is_invalid_and_says_why() -> None:
    job = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 16, "attention_kernel": "unfused"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "search": {"fix": {"cp": 2}},
    }
    with pytest.raises(InvalidLayout) as err:
        search_plans(_request(job))
    assert err.value.field == "search.fix.cp" and "training.attention_kernel is 'unfused'" in err.value.reason


def test_op_level_recompute_is_searched_only_when_named() -> None:
    base = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    }
    default = list(enumerate_layouts(JobSpec(**{k: base[k] for k in ("model", "training", "cluster")}), SearchSpec()))
    assert default and all(lay.recompute != "op" for lay in default)
    allowed = PlanRequest.model_validate({**base, "search": {"allow": {"recompute": ["op", "full"]}}})
    job = JobSpec(model=allowed.model, training=allowed.training, cluster=allowed.cluster)
    assert {lay.recompute for lay in enumerate_layouts(job, allowed.search)} == {"op", "full"}
    fixed = PlanRequest.model_validate({**base, "search": {"fix": {"recompute": "op"}}})
    response = search_plans(fixed)
    assert response.status == "optimal" and response.plans[0].config.recompute == "op"
    assert any("op-level selective checkpointing" in n for n in response.plans[0].notes)


# ---- uneven interleaving ---------------------------------------------------------------------

# 9 layers on 2 stages x 2, 3 or 4 chunks: no depth divides them evenly. For a model with one
# layer kind the default space interleaves anyway (uneven chunks); checked against the brute force.
JOB_UNEVEN_INTERLEAVING = {
    "model": {"name": "generated", "num_layers": 9, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000},
    "training": {"seq_len": 4096, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {
        "top_k": 2,
        "fix": {"tp": 1, "pp": 2, "cp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
    },
}

# The same with dense and MoE layers alternating: uneven depths when named, or when they add few
# layouts.
JOB_UNEVEN_INTERLEAVING_MIXED = {
    **JOB_UNEVEN_INTERLEAVING,
    "model": {
        **JOB_UNEVEN_INTERLEAVING["model"],
        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024, "layer_frequency": 2},
    },
    "search": {**JOB_UNEVEN_INTERLEAVING["search"], "allow": {"vpp": [1, 2, 4]}},
}
# MoE layers after a dense first one: every depth, however many layouts.
JOB_UNEVEN_INTERLEAVING_DENSE_FIRST = {
    **JOB_UNEVEN_INTERLEAVING,
    "model": {
        **JOB_UNEVEN_INTERLEAVING["model"],
        "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024, "first_dense_layers": 1},
    },
}


def _searched_vpps(job: dict[str, Any]) -> set[int]:
    req = _request(job)
    spec = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    return {lay.vpp for lay in enumerate_layouts(spec, req.search)}


def test_uneven_interleaving_is_searched_by_default_for_one_layer_kind() -> None:
    assert _searched_vpps(JOB_UNEVEN_INTERLEAVING) == {1, 2, 3, 4}
    response = check_against_oracle(JOB_UNEVEN_INTERLEAVING)
    assert response.plans[0].config.vpp > 1  # the uneven interleaving wins here


def test_uneven_interleaving_of_alternating_layer_kinds_is_searched_when_named_or_few(monkeypatch) -> None:
    mixed = JOB_UNEVEN_INTERLEAVING_MIXED
    assert _searched_vpps(mixed) == {1, 2, 4}
    unnamed = {**mixed, "search": {"fix": mixed["search"]["fix"]}}
    assert _searched_vpps(unnamed) == {1, 2, 3, 4}  # they add few layouts: in the default space
    monkeypatch.setattr("optimizer.search.space.UNEVEN_DEPTHS_DEFAULT_MAX", 0)
    assert _searched_vpps(unnamed) == {1}
    assert _searched_vpps(mixed) == {1, 2, 4}
    assert _searched_vpps(JOB_UNEVEN_INTERLEAVING_DENSE_FIRST) == {1, 2, 3, 4}  # not alternating: every depth
    check_against_oracle(mixed)
    check_against_oracle(JOB_UNEVEN_INTERLEAVING_DENSE_FIRST)


@pytest.mark.slow
def test_deepseek_v3_default_space_interleaves_unevenly() -> None:
    """61 layers, 3 of them dense: no pp x vpp divides them. The MoE layers follow the dense ones
    without alternating, so the default space has every depth, as when all are named."""
    job = {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    }
    default = _searched_vpps(job)  # 194,408 layouts: enumerated once
    assert default == _searched_vpps({**job, "search": {"allow": {"vpp": list(range(1, 9))}}})
    assert default == set(range(1, 9))
    named = {**job, "search": {"allow": {"vpp": [1, 2]}}}
    assert _searched_vpps(named) == {1, 2}


def test_uneven_interleaving_finds_a_faster_llama_405b_plan() -> None:
    """Llama 3.1 405B has 126 layers: with pp 16 no depth divides them. Without interleaving the
    planner answers TP4 PP64 (6.35 s); up to 8 chunks a stage it finds TP4 PP16 with 7 uneven
    chunks per stage (2 or 1 layers each), 17% faster. The whole space adds nothing faster: its
    best beyond the default bounds is TP8 PP8 with 15 chunks a stage (TP4 PP8 VPP15, 5.08 s as
    ZeRO-2, needs 121 GiB as ZeRO-1: no ZeRO-2/3 with pipelines)."""
    base = {
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 2048},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16384},
    }
    flat = search_plans(_request({**base, "search": {"allow": {"vpp": [1]}}}))
    default = search_plans(_request({**base, "search": {"allow": {"vpp": list(range(1, 9))}}}))
    whole = search_plans(_request(base))
    assert whole.status == default.status == flat.status == "optimal"
    f, d = flat.plans[0], default.plans[0]
    assert (f.config.tp, f.config.pp, f.config.vpp) == (4, 64, 1)
    assert f.step_time_s == pytest.approx(6.353, abs=1e-3)
    assert (d.config.tp, d.config.pp, d.config.vpp) == (4, 16, 7)
    assert d.step_time_s == pytest.approx(5.274, abs=1e-3)
    assert sorted(set(d.config.stage_layers)) == [1, 2] and sum(d.config.stage_layers) == 126
    assert whole.plans[0].config == d.config and whole.plans[0].step_time_s == d.step_time_s
    assert whole.solver.beyond_default_bounds_s is not None  # searched, bound below the best
    beyond = [p for p in whole.plans if p.config.vpp > 8]
    assert [(p.config.tp, p.config.pp, p.config.vpp) for p in beyond] == [(8, 8, 15)]
    assert beyond[0].step_time_s == pytest.approx(5.539, abs=1e-3)


def test_uneven_depths_find_a_faster_deepseek_v3_plan_on_nvl72(without_expert_host_floor: None) -> None:
    """DeepSeek-V3 (3 dense + 58 MoE layers) on 9,216 GB200 NVL72, costed without the host floor
    on small expert GEMMs (with it, 32 local experts at EP8 are host bound and EP256 without
    pipelining wins): TP1 CP2 PP8 with 7 uneven chunks per stage, 20% faster than the best plan
    without interleaving (TP4 CP2 PP32), proved optimal by default. Its interleaved split models are
    chunk-level CP-SAT models; without presolve some stopped at their 1 s limit and the answer
    was only `feasible`."""
    base = {
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 4608},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 9216},
    }
    default = search_plans(_request({**base, "search": {"time_limit_s": 60}}))
    assert default.status == "optimal"
    best = default.plans[0]
    assert (best.config.tp, best.config.pp, best.config.vpp, best.config.ep) == (1, 8, 7, 8)
    assert best.step_time_s == pytest.approx(0.7902, abs=1e-4)
    assert len(best.config.stage_layers) == 56 and sum(best.config.stage_layers) == 61
    assert not any("unequal chunks" in w for w in default.warnings)
    assert default.solver.left_out_depths_bound_s is None
    flat = search_plans(_request({**base, "search": {"time_limit_s": 60, "allow": {"vpp": [1]}}}))
    assert flat.status == "optimal"
    assert flat.plans[0].step_time_s == pytest.approx(0.9836, abs=1e-4)
    assert best.step_time_s < 0.82 * flat.plans[0].step_time_s


def test_uneven_depths_that_add_few_layouts_are_in_the_default_space() -> None:
    """Llama 4 Maverick (MoE on every second layer) on 256 H100: its uneven depths add 21,400
    layouts, under ``UNEVEN_DEPTHS_DEFAULT_MAX``, so the default space is the named one: same
    families, same plan (TP1 EP128 ZeRO-3 without pipelines, 1.798 s; with pipelines no ZeRO-2/3),
    nothing left out to report."""
    from optimizer.search.space import UNEVEN_DEPTHS_DEFAULT_MAX, blocks_with_uneven_depths_apart, layout_families

    base = {"model": {"preset": "llama4-maverick"}, "training": {"seq_len": 4096, "global_batch_size": 512},
            "cluster": {"preset": "dgx-h100", "num_gpus": 256}}  # fmt: skip
    default, named = _request(base), _request({**base, "search": {"allow": {"vpp": list(range(1, 9))}}})
    job = JobSpec(model=default.model, training=default.training, cluster=default.cluster)
    assert (
        sum(
            len(b.variants) * len(b.skipped_vpps)
            for b in blocks_with_uneven_depths_apart(job, default.search)
            if b.base.etp == 1
        )  # the count the default maximum takes: experts whole
        == 21_400
        < UNEVEN_DEPTHS_DEFAULT_MAX
    )
    assert list(layout_families(job, default.search)) == list(layout_families(job, named.search))
    planned = search_plans(default)
    assert planned.status == "optimal"
    assert planned.plans[0].step_time_s == pytest.approx(1.8665, abs=1e-4)
    assert (planned.plans[0].config.pp, planned.plans[0].config.ep, planned.plans[0].config.zero_stage) == (1, 128, 3)
    assert planned.solver.left_out_depths_bound_s is None
    assert not any("unequal chunks" in w for w in planned.warnings)


JOB_ALTERNATING_MOE = {
    "model": {"preset": "mixtral-8x22b", "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 16384,
                                                 "layer_frequency": 2, "first_dense_layers": 1}},
    "training": {"seq_len": 4096, "global_batch_size": 512},
    "cluster": {"preset": "dgx-h100", "num_gpus": 256},
}  # fmt: skip


def test_depths_left_out_by_default_are_the_uneven_ones_of_alternating_kind_models() -> None:
    """A family's depths the default space leaves out are exactly those the named space adds:
    uneven ones (``pp * vpp`` not dividing the layers) of a model whose layer kinds alternate
    (here 47,280 layouts, above ``UNEVEN_DEPTHS_DEFAULT_MAX``); none for one-kind models, for
    MoE layers after dense ones (DeepSeek-V3), or when the request names depths."""
    from optimizer.search.space import UNEVEN_DEPTHS_DEFAULT_MAX, layout_families

    # every recompute mode named: with Megatron-LM's four alone (no ZeRO-2/3 with pp > 1) the uneven
    # depths add 31,520 layouts, under the default maximum, so the default space holds them
    modes = ["none", "core_attn", "selective", "op", "moe", "full"]
    default = _request({**JOB_ALTERNATING_MOE, "search": {"allow": {"recompute": modes}}})
    named = _request({**JOB_ALTERNATING_MOE, "search": {"allow": {"recompute": modes, "vpp": list(range(1, 9))}}})
    job = JobSpec(model=default.model, training=default.training, cluster=default.cluster)
    layers = job.model.num_layers
    named_depths = {_key_without_vpp(f.first): (f.first.vpp, *f.more_vpps) for f in layout_families(job, named.search)}
    left_out = 0
    for fam in layout_families(job, default.search):
        depths = named_depths[_key_without_vpp(fam.first)]
        assert sorted((fam.first.vpp, *fam.more_vpps, *fam.skipped_vpps)) == sorted(depths)
        assert all(layers % (fam.first.pp * v) for v in fam.skipped_vpps)
        left_out += len(fam.skipped_vpps)
    assert left_out > 0
    blocks_left_out = sum(len(b.variants) * len(b.skipped_vpps) for b in _layout_blocks_of(default) if b.base.etp == 1)
    assert blocks_left_out == 47_280 > UNEVEN_DEPTHS_DEFAULT_MAX
    assert not any(f.skipped_vpps for f in layout_families(job, named.search))
    for preset in ("llama3-70b", "deepseek-v3"):
        other = _request({**JOB_ALTERNATING_MOE, "model": {"preset": preset}})
        other_job = JobSpec(model=other.model, training=other.training, cluster=other.cluster)
        assert not any(f.skipped_vpps for f in layout_families(other_job, other.search))


def _layout_blocks_of(req: PlanRequest) -> list:
    from optimizer.search.space import layout_blocks

    return list(layout_blocks(JobSpec(model=req.model, training=req.training, cluster=req.cluster), req.search))


def _key_without_vpp(lay) -> tuple:
    """A layout's identity without its interleaving depth and layer split."""
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.micro_batch_size, lay.zero_stage, lay.recompute, lay.sequence_parallel)


def test_chunk_split_of_alternating_layer_kinds_is_proved() -> None:
    """Mixtral-8x22B with MoE on every second layer (a dense first layer), 256 H100, TP1 PP2 EP8
    with 7 chunks per stage, no recompute: no layer split that fits in memory is below 3.07 s. A
    chunk's kind mix depends on where it starts. With a (first layer, count) table per chunk
    CP-SAT proved the bound in milliseconds only once the model stated that the stages' layer
    counts and MoE layers add up to the model's (without those two sums: no answer after 3 s, nor
    after 30 s on its siblings); the chunks now follow the kinds' repeat (``kind_period``)."""
    job = JobSpec.model_validate({
        "model": {"preset": "mixtral-8x22b", "moe": {"num_experts": 8, "top_k": 2,
                  "expert_ffn_hidden_size": 16384, "layer_frequency": 2, "first_dense_layers": 1}},
        "training": {"seq_len": 4096, "global_batch_size": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    })  # fmt: skip
    ctx = build_context(job)
    lay = resolve_layout(job, Layout(tp=1, pp=2, cp=1, ep=8, vpp=7, micro_batch_size=1, zero_stage=2, recompute="none"))
    cand = estimate(ctx, lay, ("tp", "cp", "dp", "pp"))
    assert not cand.fits_memory  # the even split (4 layers per chunk); uneven ones may fit
    limits = stage_fit_limits(ctx, cand)
    tables = split_tables(ctx, cand, certified_split_range(ctx, cand, 3.07, max(limits)))
    assert tables.by_mix is not None and tables.exact
    model = SplitModel([Candidate(cand, tables, cand.capacity_bytes, 56)], cand.step_time_s)
    assert model.solve([], 2.0, 3.07).status == "INFEASIBLE"


def test_split_models_stop_on_deterministic_work_not_wall_time(monkeypatch) -> None:
    """A split model that runs out of its work limit stops at the same point whatever the load:
    with the limit cut to nothing the four-stage split of JOB_SPLIT_OBJECTIVE is not proved, and
    the answer (``feasible``, a slower plan, the pair's floor as the bound) is the same on every
    run. With the real limit it is proved optimal."""
    from optimizer.search import splits

    proved = search_plans(_request(JOB_SPLIT_OBJECTIVE))
    assert proved.status == "optimal" and not proved.warnings
    monkeypatch.setattr(splits, "SOLVE_WORK_LIMIT", 1e-7)
    cut = [search_plans(_request(JOB_SPLIT_OBJECTIVE)) for _ in range(2)]
    assert [r.status for r in cut] == ["feasible", "feasible"]
    assert cut[0].plans == cut[1].plans and cut[0].solver.objective_bound == cut[1].solver.objective_bound
    assert cut[0].plans[0].step_time_s > proved.plans[0].step_time_s > cut[0].solver.objective_bound
    assert any("stopped at its work limit" in w for w in cut[0].warnings)


def test_time_limit_is_checked_while_the_space_is_bounded() -> None:
    """Bounding DeepSeek-V3's 2,083,992 layouts on 2,048 GPUs takes most of a second; a shorter time
    limit stops it there (between blocks) and says so, instead of bounding everything first."""
    req = PlanRequest.model_validate({
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
        "search": {"time_limit_s": 0.001},
    })  # fmt: skip
    response = search_plans(req)
    assert response.status == "feasible" and response.plans == []
    assert response.solver.status == "UNKNOWN" and not response.solver.proved_optimal
    # enumerating the space checks the deadline too, and at 1 ms it usually stops there
    enumerated = response.solver.candidates_enumerated
    assert enumerated <= 379_636  # what Megatron-LM runs (no ZeRO-2/3 with pp > 1)
    assert (
        f"time_limit_s = 0.001 s ran out while enumerating the layouts of the space ({enumerated:,} so far)"
        in response.explanation
        or "time_limit_s = 0.001 s ran out while bounding the 379,636 layouts" in response.explanation
    )


def test_search_gives_the_garbage_collector_back() -> None:
    """``search`` pauses the cyclic collector while it runs and restores it afterwards, also
    when the request fails and when it was off to begin with."""
    import gc

    from optimizer.search import cyclic_gc_paused

    assert gc.isenabled()
    search_plans(_request(JOB_SPLIT_OBJECTIVE))
    assert gc.isenabled()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():  # nested (a second concurrent search)
            pass
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("restriction", "knob"),
    [
        ({"allow": {"zero_stage": [1]}, "fix": {"zero_stage": 2}}, "zero_stage"),
        ({"allow": {"recompute": ["moe"]}}, "recompute"),
    ],
)
def test_restrictions_that_leave_a_knob_without_values_are_named(restriction: dict, knob: str) -> None:
    """search.fix / search.allow that leave no ZeRO stage or recompute mode: the answer is
    'infeasible' and names that knob, not the layout sizes."""
    planned = search_plans(_request({"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
                               "cluster": {"preset": "dgx-h100", "num_gpus": 8}, "search": restriction}))  # fmt: skip
    assert planned.status == "infeasible" and not planned.plans and planned.solver.status == "INFEASIBLE"
    assert f"leave no {knob}" in planned.explanation


def test_gpt3_175b_on_1024_h100_for_pipeline_frameworks():
    """Planned for frameworks that run ZeRO-1 at most with pipelines (search.allow.zero_stage
    [0, 1]), GPT-3 175B on 1,024 H100 is what the default space (Megatron-LM's) already plans:
    TP4 PP8 with 12 chunks a stage (beyond the old bound of 8), micro-batch 2, ZeRO-1, 6.337 s
    and 67.8 GiB (docs/launch.md)."""
    job = job_copy(GPT3_175B_ON_1024_H100)
    free = search_plans(PlanRequest.model_validate({**job, "search": {"top_k": 1}}))
    pipeline = search_plans(
        PlanRequest.model_validate({**job, "search": {"top_k": 1, "allow": {"zero_stage": [0, 1]}}})
    )
    assert free.status == pipeline.status == "optimal"
    best, kept = free.plans[0], pipeline.plans[0]
    assert (best.config.tp, best.config.pp, best.config.vpp, best.config.zero_stage) == (
        4,
        8,
        12,
        1,
    )  # no ZeRO-2 with pp
    assert best.step_time_s == pytest.approx(6.3373, abs=5e-4) and best.memory_gib.total == pytest.approx(
        67.8, abs=0.05
    )
    # every plan now runs on a framework: the pipeline restriction changes nothing
    assert (kept.config.tp, kept.config.pp, kept.config.vpp, kept.config.zero_stage) == (4, 8, 12, 1)
    assert kept.step_time_s == best.step_time_s and best.frameworks == ["megatron-lm"]
    assert not [n for n in best.notes if "with pipeline parallelism" in n]
