"""``training.tp_comm_overlap`` on a layout it cannot apply to (no sequence parallelism, or TP
beyond one NVLink domain) is costed without it, and the plan says so."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

JOB: dict[str, Any] = {
    "model": {"preset": "gpt3-175b"},
    "training": {"seq_len": 2048, "global_batch_size": 256, "tp_comm_overlap": True},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
}


def _evaluate(client: TestClient, overlap: bool, **config: Any) -> dict[str, Any]:
    job = {**JOB, "training": {**JOB["training"], "tp_comm_overlap": overlap}}
    r = client.post("/evaluate", json={**job, "config": {"pp": 8, "zero_stage": 1, "recompute": "full", **config}})
    assert r.status_code == 200, r.text
    return r.json()


def _note(plan: dict[str, Any]) -> list[str]:
    return [n for n in plan["notes"] if n.startswith("training.tp_comm_overlap is not applied")]


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"tp": 8, "sequence_parallel": False}, "runs TP without sequence parallelism"),
        ({"tp": 16, "pp": 4}, "TP group spans the leaf tier, beyond one NVLink domain"),
    ],
)
def test_the_overlap_that_cannot_apply_is_noted_and_not_costed(client: TestClient, config: dict, why: str) -> None:
    asked, plain = _evaluate(client, True, **config), _evaluate(client, False, **config)
    [note] = _note(asked)
    assert why in note
    assert asked["time_breakdown_s"]["tp_comm"] == pytest.approx(plain["time_breakdown_s"]["tp_comm"], rel=1e-12)


def test_the_overlap_that_applies_is_costed_without_a_note(client: TestClient) -> None:
    asked, plain = _evaluate(client, True, tp=8), _evaluate(client, False, tp=8)
    assert not _note(asked)
    assert asked["time_breakdown_s"]["tp_comm"] < plain["time_breakdown_s"]["tp_comm"]
