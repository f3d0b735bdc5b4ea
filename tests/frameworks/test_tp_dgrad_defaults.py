"""Which frameworks run ``training.tp_dgrad_overlap``: Megatron-LM and Megatron-Bridge by default,
torchtitan and DeepSpeed never."""

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


def _post(client: TestClient, **training: object):
    return client.post("/evaluate", json={**JOB, "training": {**JOB["training"], **training}, "config": LAYOUT})


def _tp_comm(client: TestClient, **training: object) -> float:
    r = _post(client, **training)
    assert r.status_code == 200, r.text
    return float(r.json()["time_breakdown_s"]["tp_comm"])


@pytest.mark.parametrize("framework", ["megatron-lm", "megatron-bridge"])
def test_megatron_stacks_run_it_by_default(client: TestClient, framework: str) -> None:
    named = _tp_comm(client, framework=framework, grad_reduce_in_fp32=False)
    assert named == pytest.approx(_tp_comm(client, tp_dgrad_overlap=True))
    assert named < _tp_comm(client)  # no framework named: every TP collective exposed
    # false is a slower bound of the same run, which Megatron also runs
    assert _tp_comm(client, framework=framework, tp_dgrad_overlap=False) == pytest.approx(_tp_comm(client))


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_other_stacks_do_not_run_it(client: TestClient, framework: str) -> None:
    """As with any stack knob the framework does not run: scored, on no framework, and said."""
    r = _post(client, framework=framework, tp_dgrad_overlap=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["frameworks"] == []
    assert any("training.tp_dgrad_overlap [False], the job has True" in note for note in body["notes"])
