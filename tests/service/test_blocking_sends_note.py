"""A non-interleaved pipeline is costed with blocking sends when a Megatron framework is a
target (they overlap sends only interleaved), and the plan says so in one line with the seconds;
an interleaved one, or one under torchtitan, has no such note."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

JOB: dict[str, Any] = {
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 4096, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 256},
}
PREFIX = "pipeline sends costed as blocking"


def _evaluate(client: TestClient, framework: str | None, vpp: int) -> dict[str, Any]:
    training = {**JOB["training"], "framework": framework}
    config = {"tp": 8, "pp": 8, "vpp": vpp, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}
    r = client.post("/evaluate", json={**JOB, "training": training, "config": config})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    ("framework", "vpp", "noted"),
    [(None, 1, True), ("megatron-lm", 1, True), ("megatron-bridge", 1, True), ("megatron-lm", 2, False),
     ("torchtitan", 1, False)],
)  # fmt: skip
def test_blocking_sends_are_noted_with_their_seconds(client: TestClient, framework: str | None, vpp: int, noted: bool):
    plan = _evaluate(client, framework, vpp)
    notes = [n for n in plan["notes"] if n.startswith(PREFIX)]
    assert bool(notes) is noted
    if noted:
        assert f"({plan['time_breakdown_s']['pp_comm']:.3f} s a step)" in notes[0]
        assert "only in interleaved schedules (vpp > 1)" in notes[0]


def test_the_note_names_the_cause_when_no_framework_runs_the_stack(client: TestClient) -> None:
    """Mixtral under torchtitan: no framework runs the job's stack, so the larger time is charged
    and the note says so rather than blaming Megatron."""
    job = {
        "model": {"preset": "mixtral-8x7b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "framework": "torchtitan"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "config": {"tp": 1, "pp": 4, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"},
    }
    r = client.post("/evaluate", json=job)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["frameworks"] == []
    [note] = [n for n in plan["notes"] if n.startswith(PREFIX)]
    assert "no framework runs this job's stack as costed" in note and "Megatron" not in note
