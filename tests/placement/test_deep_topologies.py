"""Topologies with many levels: the node-set knapsack's costs outgrow int64 from 7 levels of 256
nodes on, where it switches to Python integers; its "cannot" sentinel stayed int64's, below the
real costs, so every set read infeasible. And 8 levels plus the hostname level the validator
adds failed the 8-level limit when the request was validated again (a 500)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optimizer import service
from optimizer.placement.select import INF, Knapsack, domain_tree
from optimizer.specs import PlanRequest
from optimizer.topology_spec import ClusterTopology


def _request(levels: int, nodes: int, gpus: int) -> dict:
    names = [f"l{i}" for i in range(levels)]
    topo = {"levels": names, "nodes": [
        {"name": f"n{i}", "labels": {lv: "a" for lv in names}, "free_gpus": 8} for i in range(nodes)
    ]}  # fmt: skip
    return {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": gpus, "topology": topo},
    }


@pytest.mark.parametrize("levels", [6, 7, 8])
def test_every_level_count_plans_the_same_job(levels: int) -> None:
    answer = service.plan(PlanRequest.model_validate(_request(levels, 256, 2048)))
    assert answer.status == "optimal", answer.explanation
    assert answer.plans[0].step_time_s == pytest.approx(0.21330, abs=1e-4)
    assert answer.plans[0].assignment is not None and len(answer.plans[0].assignment.nodes) == 256


def test_the_python_integer_knapsack_has_a_sentinel_above_its_costs() -> None:
    topo = ClusterTopology.model_validate(_request(7, 256, 2048)["cluster"]["topology"])
    depths = len(topo.switch_levels())
    knap = Knapsack(domain_tree(topo, 8), depths, 256)
    assert knap.dtype is object and knap.inf > INF
    assert knap.inf > 256 * sum(knap.w)  # above any set's cost: 256 domains of each level at most


def test_more_than_eight_levels_besides_the_hostname_is_a_422() -> None:
    with pytest.raises(ValidationError, match="at most 8 levels besides kubernetes.io/hostname"):
        PlanRequest.model_validate(_request(9, 16, 128))


def test_the_hostname_level_anywhere_but_last_is_a_422() -> None:
    """Levels go coarsest first and the hostname is the finest: a hostname above a rack would make
    every node a domain holding racks."""
    body = _request(2, 16, 128)
    topo = body["cluster"]["topology"]
    topo["levels"] = ["kubernetes.io/hostname", *[lv for lv in topo["levels"] if lv != "kubernetes.io/hostname"]]
    with pytest.raises(ValidationError, match="kubernetes.io/hostname is the finest level, so the last"):
        PlanRequest.model_validate(body)


def test_a_level_name_longer_than_a_label_key_is_a_422() -> None:
    """Level names had no limit while placement tier names stop at 317 characters (a Kubernetes
    label key): a plan on a 400-character level named a tier its own config could not send back
    to /evaluate."""
    body = _request(2, 16, 128)
    topo = body["cluster"]["topology"]
    long = "x" * 400
    topo["levels"][0] = long
    for node in topo["nodes"]:
        node["labels"][long] = node["labels"].pop("l0")
    with pytest.raises(ValidationError, match="at most 317 characters"):
        PlanRequest.model_validate(body)
