"""null next to a model preset: on a nullable field it leaves the preset's value (the schema
allows null there), on any other field it is a 422 naming the field, as it is without a preset."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

EVALUATE: dict[str, Any] = {
    "training": {"seq_len": 2048, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "config": {"tp": 2},
}


def _evaluate(client: TestClient, model: dict[str, Any]):
    return client.post("/evaluate", json={**EVALUATE, "model": model})


@pytest.mark.parametrize("field", ["sliding_window_every"])
def test_null_on_a_field_that_takes_no_null_is_refused_with_a_preset_too(client: TestClient, field: str) -> None:
    for model in ({"preset": "llama3-8b", field: None}, {"preset": "gpt-oss-120b", field: None}):
        response = _evaluate(client, model)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"][-1] == field
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ModelSpec"]["properties"][field]
    assert "anyOf" not in schema and schema["type"] == "integer"  # what the schema promises


def test_null_on_a_nullable_field_keeps_the_preset_value(client: TestClient) -> None:
    plain = _evaluate(client, {"preset": "llama3-8b"})
    nulls = _evaluate(client, {"preset": "llama3-8b", "num_layers": None, "sliding_window": None, "moe": None})
    assert plain.status_code == nulls.status_code == 200, nulls.text
    assert nulls.json()["step_time_s"] == plain.json()["step_time_s"]


def test_an_unknown_field_is_refused_even_when_null(client: TestClient) -> None:
    response = _evaluate(client, {"preset": "llama3-8b", "layers": None})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-1] == "layers"
