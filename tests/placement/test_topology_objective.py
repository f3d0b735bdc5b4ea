"""With ``cluster.topology`` and ``num_gpus`` omitted, ``search.objective`` chooses the GPU count:
over HTTP on a fragmented rack pair, against the same job planned at each count."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from test_topology_placement import blocks_racks, job

from api.main import create_app
from api.settings import Settings

TOTAL_TOKENS = 10**11
NODE_COUNTS = (1, 2, 4, 7)  # powers of two up to the 7 wholly free nodes, and 7
TOPOLOGY = blocks_racks(1, 2, 4, busy={"gpu000"})


def objective_job(objective: str, num_gpus: int | None) -> dict:
    body = copy.deepcopy(job(TOPOLOGY, num_gpus))
    body["training"]["total_tokens"] = TOTAL_TOKENS
    body["search"]["objective"] = objective
    return body


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings())) as c:
        yield c


@pytest.fixture(scope="module")
def per_count(client: TestClient) -> dict[tuple[str, int], dict]:
    """The best plan of every objective at each whole-node count (``num_gpus`` given)."""
    out = {}
    for objective in ("throughput", "time_to_train", "cost", "energy"):
        for nodes in NODE_COUNTS:
            r = client.post("/plan", json=objective_job(objective, 8 * nodes))
            assert r.status_code == 200, r.text
            out[(objective, nodes)] = r.json()["plans"][0]
    return out


def chosen(client: TestClient, objective: str) -> dict:
    r = client.post("/plan", json=objective_job(objective, None))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "optimal"
    return body["plans"][0]


def test_throughput_and_time_to_train_choose_different_counts(client: TestClient, per_count: dict) -> None:
    per_gpu = chosen(client, "throughput")
    fastest = chosen(client, "time_to_train")
    # throughput per GPU: one node (11,334 tokens/s per GPU); time to train: all 7 free nodes
    assert len(per_gpu["assignment"]["nodes"]) == 1
    assert len(fastest["assignment"]["nodes"]) == 7
    assert per_gpu["tokens_per_s_per_gpu"] == pytest.approx(11_334, rel=0.01)
    assert fastest["time_to_train"]["days"] == pytest.approx(2.18, rel=0.03)
    assert per_gpu["time_to_train"]["days"] == pytest.approx(12.77, rel=0.01)
    # each is the best of the per-count answers by its own measure
    assert per_gpu["tokens_per_s_per_gpu"] == max(
        per_count[("throughput", n)]["tokens_per_s_per_gpu"] for n in NODE_COUNTS
    )
    assert fastest["time_to_train"]["days"] == min(
        per_count[("time_to_train", n)]["time_to_train"]["days"] for n in NODE_COUNTS
    )
    assert fastest["goodput"]["tokens_per_s"] > 5 * per_gpu["goodput"]["tokens_per_s"]


def test_goodput_throughput_chooses_as_time_to_train(client: TestClient) -> None:
    plan = chosen(client, "goodput_throughput")
    assert len(plan["assignment"]["nodes"]) == 7
    assert plan["goodput"]["tokens_per_s"] == pytest.approx(chosen(client, "time_to_train")["goodput"]["tokens_per_s"])


@pytest.mark.parametrize("objective,field", [("cost", "cost_usd"), ("energy", "energy_mwh")])
def test_cost_and_energy_choose_the_cheapest_count(
    client: TestClient, per_count: dict, objective: str, field: str
) -> None:
    """With a fixed token budget the cheapest per token is the cheapest run."""
    plan = chosen(client, objective)
    cheapest = min(NODE_COUNTS, key=lambda n: per_count[(objective, n)]["time_to_train"][field])
    assert len(plan["assignment"]["nodes"]) == cheapest
    assert plan["time_to_train"][field] == pytest.approx(per_count[(objective, cheapest)]["time_to_train"][field])
    assert plan["time_to_train"][field] < per_count[(objective, 7)]["time_to_train"][field]
