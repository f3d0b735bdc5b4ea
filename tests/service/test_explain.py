"""Every answer with plans says what limits the top plan and what the runner-up trades.

The explanation (``optimizer/explain.py``) is fed by the search's answer; its numbers are the
plans' own, or the cost model's for the same layout with lighter recompute (what ``/evaluate``
gives for it).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings

QUICK_START: dict[str, Any] = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 8192, "global_batch_size": 1024, "precision": "bf16"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    "search": {"top_k": 3},
}
SEED: dict[str, Any] = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_tokens": 2_097_152},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8192},
    "search": {"top_k": 2},
}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def _plan(client: TestClient, job: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/plan", json=job)
    assert response.status_code == 200, response.text
    return response.json()


SELECTIVE = {**QUICK_START, "search": {"top_k": 3, "allow": {"recompute": ["none", "selective"]}}}
"""The quick start with op-level selective recompute allowed (no Megatron-LM mode, so not in the
default space): TP1 CP2 ZeRO-3 with it, 6.996 s, beats the default space's TP2 PP4 CP4 VPP11
(7.298 s, no recompute, limited by compute), and memory binds it."""


def test_memory_binds_the_quick_start_plan_with_selective_recompute(client: TestClient) -> None:
    body = _plan(client, SELECTIVE)
    top = body["plans"][0]
    why = body["why"]
    assert body["explanation"] == why["summary"]
    memory = why["limits"][0]
    assert memory["kind"] == "memory"
    assert top["config"]["recompute"] == "selective"
    assert memory["values"]["peak_gib"] == pytest.approx(top["memory_gib"]["total"])
    usable = top["memory_gib"]["capacity"] - top["memory_gib"]["headroom"]
    assert memory["values"]["usable_gib"] == pytest.approx(usable)
    # without recompute the same layout needs 103.6 GiB of 78.6 usable: /evaluate says the same
    assert (top["config"]["tp"], top["config"]["cp"], top["config"]["zero_stage"]) == (2, 1, 3)
    assert top["step_time_s"] == pytest.approx(6.966, abs=1e-3)
    lighter = client.post("/evaluate", json={
        **{k: QUICK_START[k] for k in ("model", "training", "cluster")},
        "config": {**top["config"], "recompute": "none"},
    }).json()  # fmt: skip
    assert lighter["fits_memory"] is False
    assert memory["values"]["lighter_recompute_peak_gib"] == pytest.approx(lighter["memory_gib"]["total"])
    assert memory["values"]["lighter_recompute_peak_gib"] == pytest.approx(103.6, abs=0.05)
    assert "recompute 'none' would need 103.6 GiB a GPU of 78.6 GiB usable" in body["explanation"]


def test_runner_up_trades_are_the_plans_own_differences(client: TestClient) -> None:
    body = _plan(client, QUICK_START)
    top, second = body["plans"][:2]
    runner = body["why"]["runner_up"]
    assert runner["step_time_delta_s"] == pytest.approx(second["step_time_s"] - top["step_time_s"])
    assert runner["relative"] == pytest.approx(runner["step_time_delta_s"] / top["step_time_s"])
    a, b = top["time_breakdown_s"], second["time_breakdown_s"]
    expected = {k: b[k] - a[k] for k in a if abs(b[k] - a[k]) >= 1e-4}
    assert runner["time_deltas_s"] == pytest.approx(expected)
    assert runner["memory_delta_gib"] == pytest.approx(second["memory_gib"]["total"] - top["memory_gib"]["total"])
    for field, (mine, theirs) in runner["config_changes"].items():
        if not field.startswith("placement."):
            assert (top["config"][field], second["config"][field]) == (mine, theirs)
    assert runner["config_changes"], "the runner-up is another layout"


def test_pipeline_bubble_and_batch_arithmetic_of_the_seed_scenario(client: TestClient) -> None:
    body = _plan(client, SEED)
    top = body["plans"][0]
    c = top["config"]
    assert (c["tp"], c["pp"], c["cp"], c["dp"], c["vpp"], c["num_micro_batches"]) == (4, 16, 2, 64, 6, 16)
    limits = {lim["kind"]: lim for lim in body["why"]["limits"]}
    batch = limits["batch"]  # 16 micro-batches for 16 stages: fewer than two a stage
    assert batch["values"]["bubble_over_ideal"] == pytest.approx(15 / (6 * 16))
    assert batch["values"]["time_s"] == pytest.approx(top["time_breakdown_s"]["pp_bubble"])
    assert "1,024 sequences over 64 data-parallel replicas are 16 each" in batch["summary"]
    dp = next(lim for lim in body["why"]["limits"] if lim["kind"] == "communication" and "dp_size" in lim["values"])
    assert dp["values"]["time_s"] == pytest.approx(top["time_breakdown_s"]["dp_comm"])
    assert top["placement"]["dp"] == "spine" and dp["values"]["tier_gb_per_s"] == pytest.approx(47.0)
    # limits after memory come by time, largest first
    times = [lim["values"]["time_s"] for lim in body["why"]["limits"] if lim["kind"] != "memory"]
    assert times == sorted(times, reverse=True)
    # search.diverse: the runner-up is the best plan of another family (tp, pp, dp, cp, ep)
    assert body["why"]["runner_up"]["config_changes"] == {
        "tp": [4, 8],
        "cp": [2, 1],
        "placement.cp": ["nvlink", "none"],
        "placement.pp": ["spine", "leaf"],
    }


def test_single_plan_has_no_runner_up_and_infeasible_keeps_its_explanation(client: TestClient) -> None:
    body = _plan(client, {**QUICK_START, "search": {"top_k": 1}})
    assert body["why"]["runner_up"] is None and body["why"]["limits"]
    infeasible = _plan(client, {
        "model": {"preset": "llama3.1-405b"},
        "training": {"seq_len": 8192, "global_batch_size": 8},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    })  # fmt: skip
    assert infeasible["status"] == "infeasible" and infeasible["why"] is None
    assert "no layout fits in memory" in infeasible["explanation"]


@pytest.mark.parametrize(
    ("framework", "lighter"),
    [(None, ("selective", "selective")), ("megatron-lm", ("selective", "core_attn")),
     ("torchtitan", ("selective", "op")), ("deepspeed", ("none", "none"))],
)  # fmt: skip
def test_lighter_recompute_is_named_and_costed_as_the_framework_runs_it(framework, lighter) -> None:
    """The memory test costs the top plan's layout with the next lighter recompute in the
    plan's own names: under Megatron-LM its selective is Megatron-Core's (core_attn), which keeps
    the norm and activation outputs; DeepSpeed has only none and full."""
    from optimizer.explain import lighter_recompute, peak_with
    from optimizer.service import evaluate
    from optimizer.specs import EvaluateRequest, JobSpec

    training = {"seq_len": 8192, "global_batch_size": 64, **({"framework": framework} if framework else {})}
    job = {"model": {"preset": "llama3-8b"}, "training": training, "cluster": {"preset": "dgx-h100", "num_gpus": 8}}
    spec = JobSpec.model_validate(job)
    assert lighter_recompute(spec, "full") == lighter
    layout = {"tp": 1, "pp": 1, "micro_batch_size": 1, "zero_stage": 3 if framework == "torchtitan" else 1}
    full = evaluate(EvaluateRequest.model_validate({**job, "config": {**layout, "recompute": "full"}}))
    same = evaluate(EvaluateRequest.model_validate({**job, "config": {**layout, "recompute": lighter[0]}}))
    assert peak_with(spec, full, recompute=lighter[1]) == pytest.approx(same.memory_gib.total, abs=1e-3)


@pytest.mark.parametrize(
    ("recompute", "runs_on", "lighter"),
    [("moe", "megatron-lm", ("core_attn", "core_attn")), ("full", "megatron-lm", ("core_attn", "core_attn")),
     ("full", "torchtitan", ("op", "op")), ("full", "deepspeed", ("none", "none")),
     ("full", None, ("selective", "selective")), ("selective", "megatron-lm", ("none", "none"))],
)  # fmt: skip
def test_with_no_framework_named_the_lighter_recompute_is_the_plans_framework_s(recompute, runs_on, lighter) -> None:
    """No framework named: the memory test weighs the plan against the next lighter mode of the
    first framework it runs on, in the cost model's names (a Megatron 'moe' plan against
    'core_attn', Megatron-Core's selective, which the explanation then names)."""
    from optimizer.explain import lighter_recompute
    from optimizer.specs import JobSpec

    spec = JobSpec.model_validate({"model": {"preset": "mixtral-8x7b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
                                   "cluster": {"preset": "dgx-h100", "num_gpus": 8}})  # fmt: skip
    assert lighter_recompute(spec, recompute, runs_on) == lighter
