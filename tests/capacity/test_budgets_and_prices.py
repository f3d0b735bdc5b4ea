"""Capacity figures a budget can rely on: one token budget and a price per GPU across a sweep's
points, whole steps in time to train, the nodes a placed plan writes its checkpoint from, and no
goodput-0 point on the Pareto front."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from jobs import LLAMA3_8B_ON_8_H100, job_copy
from optimizer import service
from optimizer.capacity.annotate import price_per_gpu_hour_usd
from optimizer.capacity.sweep import PointResult, SweepRequest, pareto_front, point_requests
from optimizer.specs import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
JOB = job_copy(LLAMA3_8B_ON_8_H100)


@pytest.mark.parametrize(("vary", "tokens_batch"), [({"global_batch_size": [64, 128]}, False),
                                                     ({"seq_len": [4096, 8192]}, False),
                                                     ({"seq_len": [4096, 8192]}, True)])  # fmt: skip
def test_a_step_budget_over_different_batches_is_refused(vary: dict, tokens_batch: bool) -> None:
    training = {**JOB["training"], "total_steps": 1000}
    if tokens_batch:  # the batch in tokens: a step holds the same tokens at every seq_len
        training.pop("global_batch_size")
        training["global_batch_tokens"] = 1 << 20
    doc = {"job": {**JOB, "training": training}, "vary": vary}
    if tokens_batch:
        assert SweepRequest.model_validate(doc).num_points() == 2
        return
    with pytest.raises(ValidationError, match="job.training.total_steps: a step holds a different number"):
        SweepRequest.model_validate(doc)


def test_one_price_over_different_gpus_is_refused_and_prices_by_gpu_apply() -> None:
    vary = {"cluster": ["dgx-h100", "dgx-b200"]}
    costs = {"price_per_gpu_hour_usd": 2.5}
    with pytest.raises(ValidationError, match=r"job.costs.price_per_gpu_hour_usd: one price would bill .*b200"):
        SweepRequest.model_validate({"job": {**JOB, "costs": costs}, "vary": vary})
    by_gpu = {"price_per_gpu_hour_usd_by_gpu": {"b200": 6.0}, "price_per_gpu_hour_usd": 2.5}  # one left: fine
    request = SweepRequest.model_validate({"job": {**JOB, "costs": by_gpu}, "vary": vary})
    prices = [price_per_gpu_hour_usd(r) for _, r in point_requests(request)]
    assert prices == [2.5, 6.0]
    # the same cluster twice over one GPU type, or no price at all, is fine
    SweepRequest.model_validate({"job": {**JOB, "costs": costs}, "vary": {"cluster": ["dgx-h100"]}})
    SweepRequest.model_validate({"job": JOB, "vary": vary})
    with pytest.raises(ValidationError, match="unknown GPU id 'h1000'"):
        PlanRequest.model_validate({**JOB, "costs": {"price_per_gpu_hour_usd_by_gpu": {"h1000": 1.0}}})


def test_time_to_train_counts_whole_steps() -> None:
    """A one-token budget is one step: its days are one step's time over the goodput, not a
    fraction of a step."""
    answer = service.plan(PlanRequest.model_validate({**JOB, "training": {**JOB["training"], "total_tokens": 1}}))
    plan = answer.plans[0]
    ttt, goodput = plan.time_to_train, plan.goodput
    assert ttt is not None and goodput is not None and ttt.steps == 1
    assert ttt.days * 86400 == pytest.approx(plan.step_time_s / goodput.fraction, rel=1e-9)


def test_a_placed_plan_writes_its_checkpoint_from_the_nodes_it_runs_on() -> None:
    """32 GPUs on nodes with 4 free GPUs each: 8 nodes write the checkpoint, not ceil(32 / 8)."""
    doc = json.loads((ROOT / "examples" / "scheduler" / "plan-on-slurm.json").read_text())
    for node in doc["cluster"]["topology"]["nodes"]:
        node["free_gpus"] = 4 if node["free_gpus"] else 0
    answer = service.plan(PlanRequest.model_validate(doc))
    plan = answer.plans[0]
    assert plan.assignment is not None and plan.goodput is not None
    nodes = len(plan.assignment.nodes)
    assert nodes == 8 and plan.assignment.gpus_per_node == 4
    assert plan.goodput.checkpoint_write_s == pytest.approx(plan.goodput.checkpoint_bytes / nodes / 28e9, rel=1e-9)


def test_goodput_zero_points_stay_off_the_pareto_front() -> None:
    job = copy.deepcopy(JOB)
    job["reliability"] = {"restart_s": 1e6, "gpu_mtbf_hours": 1.0}
    answer = service.plan(PlanRequest.model_validate(job))
    plan = answer.plans[0]
    assert plan.goodput is not None and plan.goodput.fraction == 0.0
    zero = PointResult(point={"num_gpus": 8}, status="done", plan=plan)
    assert pareto_front([zero], [None]) == []
    good = service.plan(PlanRequest.model_validate(JOB)).plans[0]
    front = pareto_front([zero, PointResult(point={"num_gpus": 8}, status="done", plan=good)], [None, None])
    assert [e.index for e in front] == [1]
    assert not math.isnan(front[0].goodput_tokens_per_s)


def test_a_count_no_faster_than_a_smaller_one_says_so() -> None:
    """16 GPUs that deliver less than 8 (here made so by hand) carry a warning naming 8; the
    8-GPU point, and points of another batch, do not."""
    from optimizer.capacity.sweep_notes import with_fewer_gpus_notes

    small = service.plan(PlanRequest.model_validate(JOB)).plans[0]
    big = service.plan(PlanRequest.model_validate({**JOB, "cluster": {**JOB["cluster"], "num_gpus": 16}})).plans[0]
    assert small.goodput is not None and big.goodput is not None
    slow = big.model_copy(
        update={"goodput": big.goodput.model_copy(update={"tokens_per_s": small.goodput.tokens_per_s * 0.9})}
    )
    results = [
        PointResult(point={"num_gpus": 8}, status="done", plan=small),
        PointResult(point={"num_gpus": 16}, status="done", plan=slow),
        PointResult(point={"num_gpus": 16, "global_batch_size": 1}, status="done", plan=slow),
    ]
    noted = with_fewer_gpus_notes(results)
    assert noted[0].warnings == [] and noted[2].warnings == []
    (warning,) = noted[1].warnings
    assert warning.startswith("16 GPUs train no faster than 8 in this sweep")
    fast = [results[0], PointResult(point={"num_gpus": 16}, status="done", plan=big)]
    assert all(r.warnings == [] for r in with_fewer_gpus_notes(fast))


def test_expected_failures_over_the_run() -> None:
    """Llama 3 70B for 15T tokens on 1,024 H100 (the README's job): 151.0 days against a system
    MTBF of 50,677 h / 1,024 = 49.5 h: 73 job-stopping failures."""
    doc = yaml.safe_load((ROOT / "examples" / "plan-llama3-70b-megatron.yaml").read_text())
    doc["training"]["total_tokens"] = 15e12
    plan = service.plan(PlanRequest.model_validate(doc)).plans[0]
    ttt, goodput = plan.time_to_train, plan.goodput
    assert ttt is not None and goodput is not None
    assert ttt.expected_failures == pytest.approx(ttt.days * 86400 / goodput.mtbf_system_s, rel=1e-12)
    assert goodput.mtbf_system_s == pytest.approx(50_677 * 3600 / 1024)
    assert ttt.expected_failures == pytest.approx(73.0, abs=0.5)
