"""Inputs meant to hurt: node names that would break out of Slurm host lists and shell commands,
bodies whose every value is an error, and topology answers whose size grows with top_k x nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.documents import MAX_JSON_VALUES, DocumentError, parse_json
from api.errors import MAX_ERROR_ITEMS
from api.main import create_app
from api.settings import Settings
from optimizer import service
from optimizer.specs import PlanRequest


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def _job(names: list[str]) -> dict[str, Any]:
    nodes = [{"name": n, "labels": {"rack": "r0"}, "free_gpus": 8} for n in names]
    return {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 128},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8 * len(names),
                    "topology": {"levels": ["rack", "kubernetes.io/hostname"], "nodes": nodes}},
    }  # fmt: skip


@pytest.mark.parametrize("name", ["a,b", "a[1]", "n0$(touch x)", "n1; reboot", "a b", "n0\nevil", "-n", "n.", "ñ"])
def test_a_node_name_outside_the_host_name_alphabet_is_a_422_at_it(client: TestClient, name: str) -> None:
    response = client.post("/plan", json=_job([name, "n1"]))
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert item["loc"] == ["body", "cluster", "topology", "nodes", 0, "name"]
    assert "letters, digits, '.', '_' and '-' only" in item["msg"]


def test_host_names_of_kubernetes_and_slurm_plan(client: TestClient) -> None:
    names = ["gke-a3-pool-00001-abcdef", "node_01", "dgx.b12.example.com", "7"]
    response = client.post("/plan", json={**_job(names), "search": {"top_k": 1}})
    assert response.status_code == 200, response.text
    sbatch = response.json()["plans"][0]["assignment"]["slurm"]["sbatch"]
    assert all(n in sbatch for n in names)


def test_a_body_of_too_many_values_is_refused_before_validation(client: TestClient) -> None:
    keys = {str(i): 0 for i in range(MAX_JSON_VALUES + 1)}
    response = client.post("/plan", content=json.dumps(keys), headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_too_many_values"
    with pytest.raises(DocumentError, match="more than 262,144 values"):
        parse_json(json.dumps(keys))


def test_a_422_lists_the_first_errors_and_counts_the_rest(client: TestClient) -> None:
    body = {**_job(["n0"]), **{f"bogus{i}": 0 for i in range(MAX_ERROR_ITEMS + 30)}}
    response = client.post("/plan", json=body)
    assert response.status_code == 422
    items = response.json()["detail"]
    assert len(items) == MAX_ERROR_ITEMS + 1
    assert items[-1] == {"loc": ["body"], "msg": f"and 30 more errors not listed (the first at body.bogus{MAX_ERROR_ITEMS})",
                         "type": "too_many_errors"}  # fmt: skip


def test_stage_layers_is_bounded(client: TestClient) -> None:
    body = {**_job(["n0"]), "config": {"tp": 1, "stage_layers": [1] * 5000}}
    del body["cluster"]["topology"]
    response = client.post("/evaluate", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "config", "stage_layers"]


def test_topology_answers_list_a_bounded_number_of_node_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each plan repeats its assignment: top_k is cut so top_k x nodes stays bounded, and says so."""
    monkeypatch.setattr(service, "MAX_ASSIGNED_NODES_PER_ANSWER", 8)
    body = {**_job(["n0", "n1", "n2", "n3"]), "search": {"top_k": 3}}
    body["cluster"]["num_gpus"] = 16
    answer = service.plan(PlanRequest.model_validate(body))
    assert len(answer.plans) == 2
    assert "search.top_k 3 cut to 2: each plan lists its node assignment (up to 4 nodes)" in answer.warnings[-1]
    body["search"]["top_k"] = 2
    assert not any("cut to" in w for w in service.plan(PlanRequest.model_validate(body)).warnings)
    body["cluster"]["num_gpus"], body["search"]["top_k"] = 2, 3  # at most 2 nodes a plan: 3 x 2 < 8
    assert not any("cut to" in w for w in service.plan(PlanRequest.model_validate(body)).warnings)
