"""Which frameworks run ``training.tp_dgrad_overlap``: Megatron-LM and Megatron-Bridge always (it is
their linear layers' backward), torchtitan and DeepSpeed never."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.frameworks.test_frameworks import NAMED_JOBS

JOB = NAMED_JOBS["llama3-70b, 1,024 H100"]
LAYOUT = {"tp": 8, "pp": 4, "vpp": 5, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app()) as test_client:
        yield test_client


def _post(client: TestClient, **training: object) -> dict:
    r = client.post("/evaluate", json={**JOB, "training": {**JOB["training"], **training}, "config": LAYOUT})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("framework", ["megatron-lm", "megatron-bridge"])
def test_megatron_stacks_always_run_it(framework: str, client: TestClient) -> None:
    named = _post(client, framework=framework)
    assert named["frameworks"] == [framework]
    # no framework named: costed as Megatron-Core runs its TP layers (the default)
    assert named["time_breakdown_s"]["tp_comm"] == pytest.approx(_post(client)["time_breakdown_s"]["tp_comm"])
    blocking = _post(client, framework=framework, tp_dgrad_overlap=False)
    assert blocking["frameworks"] == []
    assert any("training.tp_dgrad_overlap [True], the job has False" in note for note in blocking["notes"])


def test_torchtitan_does_not_run_it(client: TestClient) -> None:
    """As with any stack knob the framework does not run: scored, on no framework, and said."""
    body = _post(client, framework="torchtitan", tp_dgrad_overlap=True)
    assert body["frameworks"] == []
    assert any("training.tp_dgrad_overlap [False], the job has True" in note for note in body["notes"])


def test_deepspeed_runs_either_and_defaults_to_false(client: TestClient) -> None:
    """DeepSpeed runs the model's own TP layers: plain PyTorch (false, its default) or Megatron-
    DeepSpeed's, which are Megatron's (true)."""
    for overlap in (True, False):
        # fp32 gradients: what its pipeline engine runs a bf16 model with (BF16_Optimizer)
        training = {**JOB["training"], "framework": "deepspeed", "tp_dgrad_overlap": overlap,
                    "grad_reduce_in_fp32": True}  # fmt: skip
        r = client.post("/evaluate", json={**JOB, "training": training, "config": {**LAYOUT, "vpp": 1}})
        assert r.status_code == 200, r.text
        assert r.json()["frameworks"] == ["deepspeed"], r.json()["notes"]


def test_the_knobs_do_not_decide_the_framework_of_a_layout_without_tp(client: TestClient) -> None:
    """At tp 1 there is no TP collective: a layout runs whatever the TP knobs say."""
    r = client.post("/evaluate", json={**JOB, "training": {**JOB["training"], "framework": "torchtitan",
                    "tp_dgrad_overlap": True}, "config": {**LAYOUT, "tp": 1, "pp": 1, "vpp": 1, "zero_stage": 3}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert "tp_dgrad_overlap" not in " ".join(r.json()["notes"])
