"""Coercion is a 422 naming the field, over real HTTP: no numeric strings, no strings or numbers
for booleans, no booleans for numbers, anywhere in a request."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

PLAN: dict[str, Any] = {
    "model": {
        "name": "strict",
        "num_layers": 8,
        "hidden_size": 1024,
        "ffn_hidden_size": 4096,
        "num_attention_heads": 8,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "activation": "swiglu",
        "tied_embeddings": False,
        "moe": {
            "num_experts": 8,
            "top_k": 2,
            "expert_ffn_hidden_size": 1024,
            "num_shared_experts": 1,
            "shared_expert_ffn_hidden_size": 1024,
            "layer_frequency": 1,
            "first_dense_layers": 1,
        },
        "mla": {
            "q_lora_rank": 256,
            "kv_lora_rank": 128,
            "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32,
            "v_head_dim": 64,
        },
    },
    "training": {
        "seq_len": 2048,
        "global_batch_size": 64,
        "tp_comm_overlap": False,
        "fused_kernels": True,
        "pp_comm_overlap": True,
        "ep_comm_overlap": False,
        "expert_gemm_host_splits": True,
        "dp_comm_overlap": True,
        "grad_reduce_in_fp32": False,
    },
    "cluster": {
        "gpu": "h100-sxm-80gb",
        "num_gpus": 16,
        "gpus_per_node": 8,
        "nvlink_domain_size": 8,
        "nics_per_node": 8,
        "leaf_span_gpus": 256,
        "spine_oversubscription": 1.0,
        "gpu_power_limit_w": 700.0,
        "gpu_memory_gib": 80.0,
    },
    "search": {
        "top_k": 2,
        "time_limit_s": 1.0,
        "memory_headroom_gib": 1.0,
        "fix": {"tp": 2, "zero_stage": 1, "sequence_parallel": True},
        "allow": {"pp": [1, 2], "micro_batch_size": [1, 2], "sequence_parallel": [True]},
    },
}
EVALUATE: dict[str, Any] = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 2048, "global_batch_size": 64},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
    "config": {
        "tp": 2, "pp": 2, "cp": 1, "ep": 1, "vpp": 1, "micro_batch_size": 1,
        "zero_stage": 1, "sequence_parallel": True, "num_micro_batches": 16,
        "stage_layers": [16, 16],
    },
}  # fmt: skip


def _leaves(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _leaves(value, (*path, i))
    else:
        yield path, doc


def _replaced(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _coercions(doc: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every numeric leaf as a numeric string and as a boolean; every boolean as a string and
    as a number."""
    for path, value in _leaves(doc):
        if isinstance(value, bool):
            yield path, "true" if value else "off"
            yield path, int(value)
        elif isinstance(value, int | float):
            yield path, str(value)
            yield path, True


PLAN_CASES = list(_coercions(PLAN))
EVALUATE_CASES = list(_coercions(EVALUATE))
NAMED_CASES = [
    (("training", "dp_comm_overlap"), "yes"),
    (("training", "grad_reduce_in_fp32"), "off"),
    (("cluster", "num_gpus"), True),
    (("search", "fix", "zero_stage"), True),
    (("search", "fix", "zero_stage"), 1.0),  # Literal[0, 1, 2, 3] took 1.0 by equality
    (("search", "time_limit_s"), float("nan")),
]


def test_the_base_requests_are_valid(http: httpx.Client) -> None:
    assert http.post("/plan", json=PLAN).status_code == 200
    assert http.post("/evaluate", json=EVALUATE).status_code == 200
    assert len(PLAN_CASES) >= 80  # 40 numeric and boolean fields, two coercions each


def _assert_422_naming(response: httpx.Response, path: tuple[Any, ...]) -> None:
    assert response.status_code == 422, (path, response.text)
    locs = [tuple(item["loc"]) for item in response.json()["detail"]]
    assert any(loc[1 : 1 + len(path)] == path for loc in locs), (path, locs)


def test_every_coercion_of_a_plan_request_is_422(http: httpx.Client) -> None:
    for path, value in [*PLAN_CASES, *NAMED_CASES]:
        body = json.dumps(_replaced(PLAN, path, value))  # NaN goes out as the JSON token NaN
        response = http.post("/plan", content=body, headers={"content-type": "application/json"})
        _assert_422_naming(response, path)


@pytest.mark.parametrize("path_value", EVALUATE_CASES, ids=lambda pv: ".".join(map(str, pv[0])))
def test_every_coercion_of_an_evaluate_request_is_422(
    http: httpx.Client, path_value: tuple[tuple[Any, ...], Any]
) -> None:
    path, value = path_value
    _assert_422_naming(http.post("/evaluate", json=_replaced(EVALUATE, path, value)), path)


def test_a_float_zero_stage_is_422_wherever_it_is_given(http: httpx.Client) -> None:
    """``zero_stage: 2.0`` was answered as 2 (the Literal compares by equality) where every other
    integer field refuses a float."""
    _assert_422_naming(http.post("/evaluate", json=_replaced(EVALUATE, ("config", "zero_stage"), 1.0)),
                       ("config", "zero_stage"))  # fmt: skip
    allow = {**PLAN, "search": {**PLAN.get("search", {}), "allow": {"zero_stage": [1, 2.0]}}}
    response = http.post("/plan", json=allow)
    _assert_422_naming(response, ("search", "allow", "zero_stage", 1))
    assert "not a float" in response.text
