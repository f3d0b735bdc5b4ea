"""Plans on the free nodes of a labelled cluster: over HTTP, against a brute-force oracle over
node subsets, and the Slurm / Kueue / launcher outputs."""

from __future__ import annotations

import random
from typing import Any

import hostlist
import pytest
from fastapi.testclient import TestClient

from optimizer import service
from optimizer.cost.node_tiers import level_spans
from optimizer.placement.select import all_subsets, rank_order
from optimizer.specs import PlanRequest
from optimizer.topology_spec import ClusterTopology

HOST = "kubernetes.io/hostname"
MODEL = {"preset": "llama3-8b"}
TRAINING = {"seq_len": 4096, "global_batch_size": 256, "precision": "bf16"}


def blocks_racks(
    blocks: int, racks: int, per_rack: int, busy: set[str] = frozenset(), partial: dict | None = None
) -> dict:
    nodes = []
    for b in range(blocks):
        for r in range(racks):
            for k in range(per_rack):
                name = f"gpu{(b * racks + r) * per_rack + k:03d}"
                free = 0 if name in busy else (partial or {}).get(name, 8)
                nodes.append({"name": name, "labels": {"block": f"b{b}", "rack": f"b{b}-r{r}"}, "free_gpus": free})
    return {"levels": ["block", "rack", HOST], "nodes": nodes}


def job(topology: dict, num_gpus: int | None, **cluster: Any) -> dict:
    c = {"preset": "dgx-h100", "topology": topology, **cluster}
    if num_gpus is not None:
        c["num_gpus"] = num_gpus
    return {"model": MODEL, "training": TRAINING, "cluster": c, "search": {"top_k": 2, "time_limit_s": 20}}


@pytest.fixture(scope="module")
def client(module_client: TestClient) -> TestClient:
    return module_client


def free_of(topology: dict) -> dict[str, int]:
    return {n["name"]: n["free_gpus"] for n in topology["nodes"]}


def test_fragmented_plan_uses_only_free_nodes_and_matches_evaluate(client: TestClient) -> None:
    busy = {"gpu000", "gpu005", "gpu006", "gpu009", "gpu013", "gpu018", "gpu022"}
    topo = blocks_racks(2, 3, 4, busy, partial={"gpu001": 4, "gpu014": 7})
    r = client.post("/plan", json=job(topo, 48))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "optimal"
    free = free_of(topo)
    for plan in body["plans"]:
        a = plan["assignment"]
        assert len(a["nodes"]) * a["gpus_per_node"] == 48
        assert all(free[n] >= a["gpus_per_node"] for n in a["nodes"])
        assert len(set(a["nodes"])) == len(a["nodes"])
        # the same assignment scored by /evaluate gives the same numbers
        ev = job(topo, 48)
        ev["cluster"]["topology"]["assignment"] = {"nodes": a["nodes"], "gpus_per_node": a["gpus_per_node"]}
        ev["config"] = plan["config"]
        del ev["search"]
        e = client.post("/evaluate", json=ev)
        assert e.status_code == 200, e.text
        assert e.json()["step_time_s"] == plan["step_time_s"]
        assert e.json()["memory_gib"] == plan["memory_gib"]
        assert e.json()["assignment"]["nodes"] == a["nodes"]


def test_partially_free_nodes_give_fewer_gpus_per_node(client: TestClient) -> None:
    topo = blocks_racks(1, 2, 4, partial={f"gpu{i:03d}": 4 for i in range(8)})
    r = client.post("/plan", json=job(topo, 16)).json()
    a = r["plans"][0]["assignment"]
    assert a["gpus_per_node"] == 4 and len(a["nodes"]) == 4
    assert "--ntasks-per-node=4" in a["slurm"]["sbatch"]
    # the warning says what the assignment does (16 is two whole nodes, but no node is free)
    shared = [w for w in r["warnings"] if "share" in w]
    assert shared == ["the plan takes 4 of the 8 GPUs on each of its 4 nodes: they share their node (NVLink "
                      "domain, NICs) with other jobs, which the plans do not cost"]  # fmt: skip
    r = client.post("/plan", json=job(topo, 20)).json()
    assert [w for w in r["warnings"] if "share" in w][0].startswith("the plan takes 4 of the 8 GPUs on each of its 5")


def test_whole_rack_preferred_when_faster(client: TestClient) -> None:
    # rack b0-r1 has all 4 nodes free; the others are scattered; crossing racks is 8:1 oversubscribed
    busy = {"gpu000", "gpu002", "gpu009", "gpu011"}
    topo = blocks_racks(1, 3, 4, busy)
    topo["links"] = [{"level": "rack", "oversubscription": 8.0}]
    request = job(topo, 32)
    request["training"] = {**TRAINING, "global_batch_size": 32}  # gradients cannot hide behind one micro-batch
    body = client.post("/plan", json=request).json()
    plan = body["plans"][0]
    assert plan["assignment"]["nodes"] == ["gpu004", "gpu005", "gpu006", "gpu007"]
    assert plan["assignment"]["kueue"]["annotations"] == {"kueue.x-k8s.io/podset-required-topology": "rack"}
    scattered = dict(request)
    scattered["cluster"]["topology"]["assignment"] = {"nodes": ["gpu001", "gpu003", "gpu008", "gpu010"]}
    scattered["config"] = plan["config"]
    del scattered["search"]
    other = client.post("/evaluate", json=scattered).json()
    assert other["step_time_s"] > plan["step_time_s"] * 1.01


def test_infeasible_names_the_numbers(client: TestClient) -> None:
    topo = blocks_racks(1, 2, 4, busy={"gpu000", "gpu001", "gpu002"})
    body = client.post("/plan", json=job(topo, 48)).json()
    assert body["status"] == "infeasible" and body["plans"] == []
    assert "asked for 48 GPUs; only 40 are free" in body["explanation"]
    assert "40 GPUs free on 5 of 8 nodes (5 nodes wholly free" in body["explanation"]  # busy ones not counted
    assert body["free_gpus_by_level"]["rack"] == {"b0/b0-r1": 32, "b0/b0-r0": 8}
    assert body["smallest_fitting_gpus"] == 8  # Llama 3 8B fits on one node
    assert "the smallest fitting layout needs 8 GPUs (1 whole nodes" in body["explanation"]


SMALLEST_405B = 128
"""Llama 3.1 405B at 4K tokens: its weights, gradients and Adam state alone (about 6.5 TB) need over 80 H100s."""


def test_memory_infeasible_names_the_smallest_fitting_count(client: TestClient) -> None:
    topo = blocks_racks(2, 4, 4, busy={f"gpu{i:03d}" for i in range(2, 32)})
    request = job(topo, 16)
    request["model"] = {"preset": "llama3.1-405b"}
    request["training"] = {**TRAINING, "global_batch_size": 64}
    body = client.post("/plan", json=request).json()
    assert body["status"] == "infeasible"
    assert "no layout fits on 16 GPUs of the free nodes: no layout fits in memory" in body["explanation"]
    assert body["smallest_fitting_gpus"] == SMALLEST_405B, body["explanation"]


def test_bad_assignment_is_a_4xx(client: TestClient) -> None:
    topo = blocks_racks(1, 1, 4, busy={"gpu000"})
    ev = job(topo, 16)
    ev["cluster"]["topology"]["assignment"] = {"nodes": ["gpu000", "gpu001"]}
    ev["config"] = {"tp": 8}
    del ev["search"]
    r = client.post("/evaluate", json=ev)
    assert r.status_code in (400, 422), r.text
    assert "gpu000" in r.text
    topo["nodes"][0]["labels"] = {"block": "b0"}
    r = client.post("/plan", json=job(topo, 16))
    assert r.status_code == 422 and "rack" in r.text


# --- brute-force oracle over node subsets ----------------------------------------------------


def compactness(topo: ClusterTopology, nodes: list) -> tuple[int, ...]:
    depths = len(topo.switch_levels())
    return tuple(len({topo.path(n)[: d + 1] for n in nodes}) for d in range(depths - 1, -1, -1))


def oracle(request: dict, count_nodes: int, g: int) -> tuple[float, tuple[int, ...]]:
    """Best (step time, compactness) over every subset of ``count_nodes`` eligible nodes."""
    req = PlanRequest.model_validate(request)
    topo = req.cluster.topology
    assert topo is not None
    by_spans: dict[tuple[int, ...], float] = {}
    best: tuple[float, tuple[int, ...]] | None = None
    for subset in all_subsets(topo, g, count_nodes):
        nodes = rank_order(topo, list(subset))
        spans = tuple(level_spans(topo, nodes, g))
        if spans not in by_spans:
            from optimizer.placement.plan import on_nodes
            from optimizer.service import search_plans

            sub = req.model_copy(update={"cluster": on_nodes(req.cluster, nodes, g)})
            resp = search_plans(sub)
            by_spans[spans] = round(resp.plans[0].step_time_s, 9) if resp.plans else float("inf")
        key = (by_spans[spans], compactness(topo, nodes))
        best = key if best is None or key < best else best
    assert best is not None
    return best


def random_topology(rng: random.Random, nvl: bool) -> dict:
    nodes = []
    racks = rng.randint(3, 4)
    for r in range(racks):
        for k in range(rng.randint(3, 4)):
            name = f"x{r}{k}"
            labels = {"block": f"blk{r % 2}", "rack": f"rack{r}"}
            nodes.append({"name": name, "labels": labels, "free_gpus": rng.choice([0, 4, 8, 8, 8])})
    nodes = nodes[:12]
    return {"levels": ["block", "rack", HOST], "nodes": nodes}


@pytest.mark.parametrize("seed", range(16))
def test_search_agrees_with_brute_force_oracle(seed: int) -> None:
    rng = random.Random(seed)
    topo = random_topology(rng, nvl=False)
    topo["links"] = [{"level": "rack", "oversubscription": rng.choice([1.0, 2.0, 4.0])}]
    full = sum(1 for n in topo["nodes"] if n["free_gpus"] >= 8)
    count = rng.randint(2, max(2, min(full, 6)))
    request = job(topo, 8 * count)
    request["training"] = {**TRAINING, "global_batch_size": rng.choice([8 * count, 64])}
    resp = service.plan(PlanRequest.model_validate(request))
    if full < count:
        assert resp.status == "infeasible"
        return
    want = oracle(request, count, 8)
    got_nodes = resp.plans[0].assignment.nodes
    req = PlanRequest.model_validate(request)
    by_name = {n.name: n for n in req.cluster.topology.nodes}
    got = (round(resp.plans[0].step_time_s, 9), compactness(req.cluster.topology, [by_name[x] for x in got_nodes]))
    assert got == want


def test_oracle_on_nvlink_cliques() -> None:
    """GB200-style: the NVLink level is a clique label over 4-GPU nodes."""
    nodes = []
    free = {"c0": 3, "c1": 2, "c2": 4}
    for clique, n_free in free.items():
        for k in range(4):
            nodes.append(
                {
                    "name": f"{clique}n{k}",
                    "labels": {"rack": f"rack-{clique}", "nvidia.com/gpu.clique": f"uuid.{clique}"},
                    "free_gpus": 4 if k < n_free else 0,
                }
            )
    topo = {"levels": ["rack", "nvidia.com/gpu.clique", HOST], "nvlink_level": "nvidia.com/gpu.clique", "nodes": nodes}
    request = {
        "model": MODEL,
        "training": {**TRAINING, "global_batch_size": 64},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 16, "topology": topo},
        "search": {"top_k": 1, "time_limit_s": 20},
    }
    resp = service.plan(PlanRequest.model_validate(request))
    assert resp.plans[0].assignment.nodes == ["c2n0", "c2n1", "c2n2", "c2n3"]
    assert oracle(request, 4, 4)[0] == round(resp.plans[0].step_time_s, 9)


# --- outputs ----------------------------------------------------------------------------------


def test_slurm_hostlist_round_trips() -> None:
    busy = {"gpu001", "gpu006", "gpu013"}
    topo = blocks_racks(2, 2, 4, busy)
    resp = service.plan(PlanRequest.model_validate(job(topo, 64)))
    a = resp.plans[0].assignment
    assert hostlist.expand_hostlist(a.slurm.nodelist) == sorted(a.nodes)
    assert a.launcher.hostfile.splitlines()[0] == f"{a.nodes[0]} slots=8"
    assert a.launcher.master_addr == a.nodes[0]
    pods = sum(d.count for d in a.kueue.topology_assignment.domains)
    assert pods == len(a.nodes) == 8


def test_balanced_set_gets_segment_and_slice() -> None:
    # every rack has exactly 2 free nodes: 8 nodes = 4 racks x 2
    busy = {f"gpu{i:03d}" for i in range(16) if i % 4 >= 2}
    topo = blocks_racks(2, 2, 4, busy)
    a = service.plan(PlanRequest.model_validate(job(topo, 64))).plans[0].assignment
    assert a.slurm.segment == 2 and a.slurm.switches == 4
    assert a.kueue.annotations["kueue.x-k8s.io/podset-slice-size"] == "2"
    assert a.kueue.annotations["kueue.x-k8s.io/podset-preferred-topology"] == "block"


# --- edge cases -------------------------------------------------------------------------------


def test_count_omitted_picks_the_best_throughput_per_gpu(client: TestClient) -> None:
    topo = blocks_racks(1, 2, 4, busy={"gpu000"})
    body = client.post("/plan", json=job(topo, None)).json()
    assert body["status"] == "optimal"
    best = body["plans"][0]
    assert best["assignment"]["candidates_compared"] >= 4  # 1, 2, 4 and 7 nodes
    for n in (1, 2, 4, 7):
        other = client.post("/plan", json=job(topo, 8 * n)).json()["plans"][0]
        assert other["tokens_per_s_per_gpu"] <= best["tokens_per_s_per_gpu"] + 1e-6


def test_no_whole_node_free_and_count_omitted_plans_on_shares_of_nodes(client: TestClient) -> None:
    """With no node wholly free the planner chooses among the largest share of a node some nodes
    have free (half nodes here), and says the nodes are shared; with none free at all it is
    infeasible, with the reason."""
    topo = blocks_racks(1, 1, 2, partial={"gpu000": 4, "gpu001": 4})
    body = client.post("/plan", json=job(topo, None)).json()
    assert body["status"] == "optimal", body
    assert body["plans"][0]["assignment"]["gpus_per_node"] == 4
    assert any("of the 8 GPUs on each of its" in w for w in body["warnings"])
    none = client.post("/plan", json=job(blocks_racks(1, 1, 2, busy={"gpu000", "gpu001"}), None)).json()
    assert none["status"] == "infeasible" and "no node has all its GPUs free" in none["explanation"]


def test_evaluate_without_assignment_places_the_layout(client: TestClient) -> None:
    topo = blocks_racks(1, 2, 4, busy={"gpu000", "gpu001"})
    ev = {
        "model": MODEL,
        "training": TRAINING,
        "cluster": {"preset": "dgx-h100", "topology": topo},
        "config": {"tp": 8, "dp": 4},
    }
    r = client.post("/evaluate", json=ev)
    assert r.status_code == 200, r.text
    assert r.json()["assignment"]["nodes"] == ["gpu004", "gpu005", "gpu006", "gpu007"]


def test_compare_on_a_topology_sizes_each_layout(client: TestClient) -> None:
    """With no num_gpus each layout's dp sizes the job, as /evaluate does; its warnings are those
    of the job at that size (a 500 before: they read num_gpus of the unplaced job)."""
    topo = blocks_racks(1, 2, 4, busy={"gpu000", "gpu001"})
    cluster = {"preset": "dgx-h100", "topology": topo}
    body = {"model": MODEL, "training": TRAINING, "cluster": cluster, "layouts": [{"dp": 32}, {"tp": 2, "dp": 8}]}
    r = client.post("/compare", json=body)
    assert r.status_code == 200, r.text
    entries = r.json()["entries"]
    assert [len(e["plan"]["assignment"]["nodes"]) for e in entries] == [4, 2]
    for e, layout in zip(entries, body["layouts"], strict=True):
        one = client.post(
            "/evaluate", json={"model": MODEL, "training": TRAINING, "cluster": cluster, "config": layout}
        ).json()
        assert e["plan"]["step_time_s"] == one["step_time_s"]
    # each layout's MFU warning, judged on the job at its own size
    assert [w.split(": ")[0] for w in r.json()["warnings"]] == ["layout 0", "layout 1"], r.json()["warnings"]
    unsized = client.post("/compare", json={**body, "layouts": [{"dp": 32}, {"tp": 2}]})
    assert unsized.status_code == 422
    [item] = unsized.json()["detail"]
    assert item["msg"] == "give num_gpus, layouts.1.dp or topology.assignment", item
    too_many = client.post("/compare", json={**body, "layouts": [{"dp": 8}, {"dp": 64}]})  # 48 GPUs free
    [item] = too_many.json()["detail"]
    assert item["loc"] == ["body", "layouts", 1, "dp"] and item["msg"].startswith("64 GPUs do not fit"), item


def test_compare_checks_every_layout_before_choosing_nodes(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A later layout that breaks a layout rule is a 422 at it before any layout's node choice (on
    a large topology each choice takes seconds)."""
    topo = blocks_racks(1, 2, 4)
    body = {"model": MODEL, "training": TRAINING, "cluster": {"preset": "dgx-h100", "num_gpus": 32, "topology": topo},
            "layouts": [{"tp": 2}, {"tp": 4}, {"tp": 1, "pp": 64}]}  # fmt: skip
    chosen: list[int] = []
    real = service.evaluate_on_topology
    monkeypatch.setattr(service, "evaluate_on_topology", lambda *a: chosen.append(1) or real(*a))
    r = client.post("/compare", json=body)
    assert r.status_code == 422 and chosen == []
    [item] = r.json()["detail"]
    assert item["loc"][:4] == ["body", "layouts", 2, "pp"], item
    body["layouts"] = body["layouts"][:2]
    assert client.post("/compare", json=body).status_code == 200 and chosen == [1, 1]


def test_hostname_level_is_implied_and_oversized_nodes_rejected(client: TestClient) -> None:
    topo = blocks_racks(1, 1, 2)
    topo["levels"] = ["block", "rack"]
    assert client.post("/plan", json=job(topo, 16)).json()["plans"][0]["assignment"]["domains_used"][HOST] == 2
    topo["nodes"][0]["free_gpus"] = 16
    r = client.post("/plan", json=job(topo, 16))
    assert r.status_code == 422 and "gpu000" in r.text and "gpus_per_node" in r.text


def test_a_one_node_job_asks_kueue_for_its_rack_not_the_hostname() -> None:
    """Kueue refuses a required level its Topology does not list, and from-kueue adds the hostname
    level itself: a job on one node is required to stay in the finest switch level, the rack."""
    answer = service.plan(PlanRequest.model_validate(job(blocks_racks(2, 3, 4, busy=set()), 8)))
    annotations = answer.plans[0].assignment.kueue.annotations
    assert annotations == {"kueue.x-k8s.io/podset-required-topology": "rack"}
