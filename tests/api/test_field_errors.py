"""422s that name the field a request gave: values the validators work out from other fields,
checks across fields (their ``loc`` goes as deep as the field the message names), pins that no
layout can take, sweep jobs, and the search never building a layout the response would reject."""

from __future__ import annotations

import copy
from typing import Any

from fastapi.testclient import TestClient

from api.errors import field_loc
from optimizer.capacity.sweep import SweepRequest, point_requests

PLAN: dict[str, Any] = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
}


def _with(section: str, **fields: Any) -> dict[str, Any]:
    body = copy.deepcopy(PLAN)
    body[section] = {**body.get(section, {}), **fields}
    return body


def _one_error(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    (item,) = r.json()["detail"]
    return item


def test_worked_out_values_beyond_their_bounds_are_422s(client: TestClient) -> None:
    steps = _one_error(client, "/plan", _with("training", total_steps=10**10))
    assert steps["loc"] == ["body", "training"]
    assert steps["msg"].startswith("total_tokens worked out from total_steps x global_batch_tokens is 10,485,760,")
    tokens = _one_error(client, "/plan", _with("training", seq_len=65537, global_batch_size=1 << 24))
    assert "global_batch_tokens worked out" in tokens["msg"] and "at most 1,099,511,627,776" in tokens["msg"]
    body = _with("training", seq_len=1, global_batch_tokens=1 << 25)
    del body["training"]["global_batch_size"]
    assert "global_batch_size worked out from the batch and seq_len is 33,554,432" in _one_error(client, "/evaluate", {
        **body, "config": {"tp": 1}})["msg"]  # fmt: skip
    wide = {"num_layers": 2, "hidden_size": 131072, "num_attention_heads": 4, "vocab_size": 1000}
    head = _one_error(client, "/plan", {**PLAN, "model": wide})
    assert head["loc"] == ["body", "model"] and head["msg"].startswith("head_dim worked out from hidden_size")


def test_the_search_keeps_micro_batches_within_the_layout_limit(client: TestClient) -> None:
    tiny = {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 1, "vocab_size": 1}
    body = {"model": tiny, "training": {"seq_len": 1, "global_batch_size": 1 << 17},
            "cluster": {"preset": "dgx-b200", "num_gpus": 1}}  # fmt: skip
    r = client.post("/plan", json=body)
    assert r.status_code == 200, r.text
    assert max(p["config"]["micro_batch_size"] for p in r.json()["plans"]) == 1 << 16


def test_cross_field_errors_are_located_at_the_field_they_name(client: TestClient) -> None:
    megatron = _with("training", framework="megatron-lm")
    fix = _one_error(client, "/plan", {**megatron, "search": {"fix": {"recompute": "op"}}})
    assert fix["loc"] == ["body", "search", "fix", "recompute"]
    dense = _one_error(client, "/plan", {**PLAN, "search": {"fix": {"recompute": "moe"}}})
    assert dense["loc"] == ["body", "search", "fix", "recompute"]
    compare = _one_error(client, "/compare", {**megatron, "layouts": [{"tp": 2}, {"tp": 4, "recompute": "op"}]})
    assert compare["loc"] == ["body", "layouts", 1, "recompute"]
    assert field_loc(["body", "cluster", "topology"], "topology.nodes: names repeat") == [
        "body", "cluster", "topology", "nodes"]  # fmt: skip
    assert field_loc(["body", "training"], "global_batch_size (3) is odd") == ["body", "training"]


def test_an_unknown_tier_is_named(client: TestClient) -> None:
    body = {**PLAN, "config": {"tp": 8, "placement": {"tp": "rack"}}}  # 16 GPUs: tiers nvlink, leaf
    item = _one_error(client, "/evaluate", body)
    assert item["loc"] == ["body", "config", "placement", "tp"]
    assert (
        item["msg"] == "unknown tier 'rack': this job's tiers are ['nvlink', 'leaf'], or 'none' (size 1) and 'cluster'"
    )
    # a tier of the catalog this job's GPUs do not span: the rank-order check, at config.placement
    spine = _one_error(client, "/evaluate", {**PLAN, "config": {"tp": 8, "placement": {"dp": "spine"}}})
    assert spine["loc"] == ["body", "config", "placement"] and "tiers are ['nvlink', 'leaf']" in spine["msg"]


def test_pins_no_layout_can_take_are_422s(client: TestClient) -> None:
    outside = _one_error(client, "/plan", {**PLAN, "search": {"fix": {"tp": 4}, "allow": {"tp": [2]}}})
    assert outside["loc"] == ["body", "search", "fix", "tp"] and "not among search.allow.tp [2]" in outside["msg"]
    only_moe = _one_error(client, "/plan", {**PLAN, "search": {"allow": {"recompute": ["moe"]}}})
    assert only_moe["loc"] == ["body", "search", "allow", "recompute"]
    r = client.post("/plan", json={**PLAN, "search": {"allow": {"recompute": ["moe", "none"]}}})
    assert r.status_code == 200 and {p["config"]["recompute"] for p in r.json()["plans"]} == {"none"}
    deepspeed = _with("training", framework="deepspeed")
    # bf16 with 16-bit gradients (DeepSpeed's ZeRO default): its pipeline engine runs no stage
    # so the pinned pp is what no layout can take, whatever stage is pinned with it or none
    for fix in ({"zero_stage": 1, "pp": 2}, {"zero_stage": 3, "pp": 2}, {"pp": 2}):
        piped = _one_error(client, "/plan", {**deepspeed, "search": {"fix": fix}})
        assert piped["loc"] == ["body", "search", "fix", "pp"], (fix, piped)
        assert piped["msg"].startswith("no layout can take pp = 2: DeepSpeed runs no zero_stage with pp > 1")
        assert "training.grad_reduce_in_fp32 true runs pipelines" in piped["msg"]
    fp32 = {**deepspeed, "training": {**deepspeed["training"], "grad_reduce_in_fp32": True}}
    zero = _one_error(client, "/plan", {**fp32, "search": {"fix": {"zero_stage": 2, "pp": 2}}})
    assert zero["loc"] == ["body", "search", "fix", "zero_stage"]
    assert "DeepSpeed runs zero_stage [0, 1] with pp > 1" in zero["msg"]
    flat = _one_error(client, "/plan", {**fp32, "search": {"fix": {"zero_stage": 1, "pp": 1}}})
    assert flat["loc"] == ["body", "search", "fix", "pp"]
    assert "DeepSpeed runs no zero_stage with pp = 1" in flat["msg"], flat["msg"]
    torchtitan = _with("training", framework="torchtitan")  # 16 GPUs: TP8 leaves dp or pp above 1
    ddp = _one_error(client, "/plan", {**torchtitan, "search": {"fix": {"zero_stage": 0, "tp": 8}}})
    assert ddp["loc"] == ["body", "search", "fix", "zero_stage"]
    assert "torchtitan runs zero_stage 0 only with data parallelism alone" in ddp["msg"], ddp["msg"]
    r = client.post("/plan", json={**torchtitan, "search": {"fix": {"zero_stage": 0}}})
    assert r.status_code == 200 and r.json()["status"] == "infeasible"  # DDP alone runs; 8B does not fit it
    assert r.json()["explanation"].startswith("no layout fits in memory"), r.json()["explanation"]
    cp = _one_error(client, "/plan", {**deepspeed, "search": {"fix": {"cp": 2}}})
    assert cp["loc"] == ["body", "search", "fix", "cp"] and "no context parallelism" in cp["msg"]


def test_sweep_jobs_are_checked_before_they_run(client: TestClient) -> None:
    def sweep(job: dict[str, Any]) -> dict[str, Any]:
        return _one_error(client, "/sweeps", {"job": job, "vary": {"num_gpus": [8, 16]}})

    assert sweep({**PLAN, "cluster": "dgx-h100"})["msg"] == "job.cluster: must be an object, not str"
    assert sweep({**PLAN, "training": [1]})["loc"] == ["body", "job", "training"]
    typed = sweep({**PLAN, "search": {"top_k": "x"}})
    assert typed["loc"] == ["body", "job", "search", "top_k"] and "valid integer" in typed["msg"]
    many = sweep({**PLAN, "search": {"top_k": 3}})
    assert many["msg"] == "job.search.top_k: a sweep plans each point's best plan only (top_k 1)"


def test_duplicate_node_names_are_named(client: TestClient) -> None:
    nodes = [{"name": f"n{i % 8000}", "free_gpus": 8} for i in range(16384)]  # counted once each, not per name
    topology = {"levels": ["kubernetes.io/hostname"], "nodes": nodes}
    item = _one_error(client, "/plan", _with("cluster", topology=topology))
    assert item["loc"] == ["body", "cluster", "topology", "nodes"]
    assert item["msg"] == "topology.nodes: node names must be unique (['n0', 'n1', 'n10'] repeat)"


def test_a_sweep_validates_its_shared_topology_once(client: TestClient) -> None:
    nodes = [{"name": f"n{i}", "free_gpus": 8} for i in range(4)]
    job = _with("cluster", topology={"levels": ["kubernetes.io/hostname"], "nodes": nodes})
    del job["cluster"]["num_gpus"]
    sweep = SweepRequest.model_validate({"job": job, "vary": {"num_gpus": [8, 16, 32]}})
    (_, first), *rest = point_requests(sweep)
    assert [r.cluster.num_gpus for _, r in rest] == [16, 32]
    assert all(r.cluster.topology is first.cluster.topology for _, r in rest)  # one model, not one per point
    nodes[1]["name"] = "n0"
    bad = _one_error(client, "/sweeps", {"job": job, "vary": {"num_gpus": [8, 16]}})
    assert bad["loc"] == ["body", "job", "cluster", "topology", "nodes"]
    assert bad["msg"] == "topology.nodes: node names must be unique (['n0'] repeat)"


def test_sweep_point_errors_are_located_at_the_vary_value_or_the_job_field(client: TestClient) -> None:
    huge = _one_error(client, "/sweeps", {"job": PLAN, "vary": {"num_gpus": [8, 2097152]}})
    assert (
        huge["loc"] == ["body", "vary", "num_gpus", 1]
        and huge["msg"] == "Input should be less than or equal to 1048576"
    )
    preset = _one_error(client, "/sweeps", {"job": PLAN, "vary": {"cluster": ["nope"]}})
    assert preset["loc"] == ["body", "vary", "cluster", 0] and "unknown cluster preset id 'nope'" in preset["msg"]
    job = {**_with("training", framework="megatron-lm"), "search": {"fix": {"recompute": "op"}}}
    pinned = _one_error(client, "/sweeps", {"job": job, "vary": {"num_gpus": [8]}})
    assert pinned["loc"] == ["body", "job", "search", "fix", "recompute"]
    assert "Value error" not in pinned["msg"]


def test_the_default_recompute_is_none_and_every_framework_runs_it(client: TestClient) -> None:
    """``config.recompute`` left out is ``none``, a name every framework has (the cost model's own
    ``selective`` runs on none, so a layout that left it out would have no launch arguments)."""
    for framework in ("deepspeed", "torchtitan", None):
        training = {"framework": framework} if framework else {}
        response = client.post(
            "/evaluate", json={**_with("training", **training), "config": {"tp": 1, "zero_stage": 3}}
        )
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["config"]["recompute"] == "none"
        assert answer["frameworks"] and (framework is None or answer["frameworks"] == [framework])
    body = {**_with("training", framework="deepspeed"), "config": {"tp": 1, "recompute": "selective"}}
    item = _one_error(client, "/evaluate", body)
    assert item["loc"] == ["body", "config", "recompute"]
    assert item["msg"].startswith("config.recompute: 'selective' is not a")


def test_a_capacity_factor_below_one_is_a_422(client: TestClient) -> None:
    """Below 1 every expert drops tokens even under balanced routing, which MFU would still count
    as computed (a factor of 0.01 once gave an MFU of 194%)."""
    moe = {"model": {"preset": "mixtral-8x7b"}, "training": {"seq_len": 4096, "global_batch_size": 64}}
    item = _one_error(client, "/plan", {**_with("training", moe_capacity_factor=0.5), **moe} | {
        "training": {**moe["training"], "moe_capacity_factor": 0.5}})  # fmt: skip
    assert item["loc"] == ["body", "training", "moe_capacity_factor"]
    assert "greater than or equal to 1" in item["msg"]


def test_a_sweep_count_out_of_range_is_located_at_its_index(client: TestClient) -> None:
    item = _one_error(client, "/sweeps", {"job": PLAN, "vary": {"num_gpus": [8, -1]}})
    assert item["loc"] == ["body", "vary", "num_gpus", 1] and "greater than or equal to 1" in item["msg"]
    item = _one_error(client, "/sweeps", {"job": PLAN, "vary": {"seq_len": [4096, 10**9]}})
    assert item["loc"] == ["body", "vary", "seq_len", 1]


def test_token_counts_take_whole_floats(client: TestClient) -> None:
    """``total_tokens: 1e12`` (how budgets are written, and how answers print them) is 10**12; a
    fractional count is still a 422."""
    body = {**_with("training", total_tokens=1e12), "search": {"top_k": 1}}
    response = client.post("/plan", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["plans"][0]["time_to_train"]["total_tokens"] == 1e12
    item = _one_error(client, "/plan", _with("training", total_tokens=1.5e3 + 0.25))
    assert item["loc"] == ["body", "training", "total_tokens"]


def test_a_product_that_does_not_divide_is_located_at_the_field_at_fault(client: TestClient) -> None:
    """The first size that alone does not divide num_gpus, else the last one making the product."""
    for config, field in (({"pp": 64}, "pp"), ({"cp": 3}, "cp"), ({"tp": 3}, "tp"), ({"tp": 8, "pp": 4}, "pp")):
        item = _one_error(client, "/evaluate", {**PLAN, "config": config})
        assert item["loc"] == ["body", "config", field], config
        assert "does not divide num_gpus = 16" in item["msg"]


def test_a_gpu_memory_below_four_gib_is_a_422(client: TestClient) -> None:
    item = _one_error(client, "/plan", _with("cluster", gpu_memory_gib=0.001))
    assert item["loc"] == ["body", "cluster", "gpu_memory_gib"] and "greater than or equal to 4" in item["msg"]


def test_num_gpus_that_disagrees_with_the_assignment_is_a_422(client: TestClient) -> None:
    """``num_gpus`` with ``topology.assignment``: equal, or a 422 at ``cluster.num_gpus`` (it was
    silently replaced by the assignment's size)."""
    nodes = [{"name": f"n{i}", "labels": {"rack": "r0"}, "free_gpus": 8} for i in range(4)]
    topology = {"levels": ["rack"], "nodes": nodes, "assignment": {"nodes": ["n0", "n1"]}}
    body = {**_with("cluster", num_gpus=8, topology=topology), "config": {"tp": 8}}
    item = _one_error(client, "/evaluate", body)
    assert item["loc"] == ["body", "cluster", "num_gpus"]
    assert item["msg"] == (
        "cluster.num_gpus: 8 disagrees with topology.assignment (2 nodes x 8 GPUs = 16); omit num_gpus or make them agree"
    )
    body["cluster"]["num_gpus"] = 16
    assert client.post("/evaluate", json=body).status_code == 200


def test_an_moe_block_with_no_moe_layer_is_a_422(client: TestClient) -> None:
    """A ``moe`` block whose dense prefix covers every layer planned ``ep: 8`` and wrote MoE launch
    flags for a model without experts."""
    moe = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 4096, "first_dense_layers": 32}
    item = _one_error(client, "/plan", _with("model", moe=moe))
    assert item["loc"] == ["body", "model", "moe", "first_dense_layers"]
    assert item["msg"].startswith("model.moe.first_dense_layers: 32 leaves no MoE layer of num_layers (32)")


def test_a_checkpoint_time_and_a_write_rate_together_are_a_422(client: TestClient) -> None:
    """The write time overrode the rate without a word."""
    item = _one_error(
        client, "/plan", _with("reliability", checkpoint_write_s=10, checkpoint_write_bytes_per_s_per_node=1e9)
    )
    assert item["loc"] == ["body", "reliability", "checkpoint_write_bytes_per_s_per_node"]


def test_sweep_counts_are_bounded_as_the_fields_they_replace(client: TestClient) -> None:
    body = {"job": PLAN, "vary": {"global_batch_size": [1 << 24, (1 << 24) + 1]}}
    item = _one_error(client, "/sweeps", body)
    assert item["loc"] == ["body", "vary", "global_batch_size", 1]


def test_a_leaf_span_below_the_nvlink_domain_is_a_422(client: TestClient) -> None:
    """It was raised to the domain size without a word (``leaf_span_gpus: 1`` and ``8`` gave the
    same step time on dgx-h100)."""
    item = _one_error(client, "/plan", _with("cluster", leaf_span_gpus=4))
    assert item["loc"] == ["body", "cluster", "leaf_span_gpus"]
    assert item["msg"].startswith("cluster.leaf_span_gpus: 4 is below nvlink_domain_size (8)")
    assert client.post("/plan", json=_with("cluster", leaf_span_gpus=8)).status_code == 200


def test_a_leaf_span_left_out_is_never_refused_for_a_large_domain(client: TestClient) -> None:
    """The default leaf span (32 nodes of GPUs) below a 576-GPU NVLink domain is raised to the
    domain, not refused as if the request had given it."""
    cluster = {"gpu": "gb200", "gpus_per_node": 4, "nvlink_domain_size": 576, "num_gpus": 1152}
    assert client.post("/plan", json={**PLAN, "cluster": cluster}).status_code == 200


def test_a_placement_tier_name_is_bounded(client: TestClient) -> None:
    """A 100 KB tier name was echoed back whole in the 422; names are at most a Kubernetes label
    key's 317 characters."""
    body = {**PLAN, "config": {"tp": 2, "placement": {"tp": "x" * 100_000}}}
    err = _one_error(client, "/evaluate", body)
    assert err["loc"] == ["body", "config", "placement", "tp"] and err["type"] == "string_too_long"
    assert len(str(err)) < 2_000


def test_an_expert_block_larger_than_the_job_is_a_422(client: TestClient) -> None:
    """fix ep 8 with etp 64 is 512 expert ranks on 256 GPUs: it was a 200 'infeasible' whose
    explanation blamed the tp/pp/cp/dp divisibility."""
    body = {
        "model": {"preset": "mixtral-8x22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"fix": {"ep": 8, "etp": 64}},
    }
    err = _one_error(client, "/plan", body)
    assert err["loc"] == ["body", "search", "fix", "etp"]
    assert "ep 8 x etp 64 x pp 1 does not divide num_gpus (256)" in err["msg"]
    # etp unpinned (or 1): the expert block is ep x pp, and the field to name is ep
    for fix in ({"ep": 8, "pp": 16}, {"ep": 8, "etp": 1, "pp": 16}):
        body = {**body, "cluster": {"preset": "dgx-h100", "num_gpus": 64}, "search": {"fix": fix}}
        err = _one_error(client, "/plan", body)
        assert err["loc"] == ["body", "search", "fix", "ep"], fix
        assert "ep 8 x etp 1 x pp 16 does not divide num_gpus (64)" in err["msg"]
