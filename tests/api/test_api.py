"""HTTP API in-process (FastAPI TestClient / httpx ASGI transport).

Everything except ``TestRealService`` replaces the planner with stand-ins where it needs one,
so these tests pin the adapter (routing, validation, limits, errors, pool) on their own;
``TestRealService`` goes through the real ``optimizer.service``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.openapi_examples import EVALUATE_EXAMPLES, PLAN_EXAMPLES
from api.settings import Settings
from jobs import GPT3_175B_ON_1024_H100, LLAMA3_70B_ON_1024_H100, job_copy
from optimizer import service
from optimizer.errors import InvalidLayout
from optimizer.results import (
    LaunchArgs,
    MemoryBreakdown,
    Plan,
    PlanResponse,
    SolverInfo,
    TimeBreakdown,
)
from optimizer.specs import EvaluateRequest, Layout, PlanRequest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GPU_IDS = (
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "h100-sxm-80gb",
    "h800-sxm-80gb",
    "h200-sxm-141gb",
    "b200",
    "gb200",
    "mi300x",
)
NETWORK_IDS = ("ib-hdr-200", "ib-ndr-400", "ib-xdr-800", "roce-400")
CLUSTER_IDS = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72")
MODEL_IDS = (
    "gpt3-175b",
    "llama3-70b",
    "llama3.1-405b",
    "mixtral-8x22b",
    "deepseek-v3",
    "qwen3-235b-a22b",
)
CATALOGS = {"gpus": GPU_IDS, "networks": NETWORK_IDS, "clusters": CLUSTER_IDS, "models": MODEL_IDS}

JOB: dict[str, Any] = job_copy(LLAMA3_70B_ON_1024_H100)
EVALUATE_BODY: dict[str, Any] = {
    **JOB,
    "config": {"tp": 8, "pp": 4, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"},
}
DENSE_2T: dict[str, Any] = {
    "name": "dense-2t",
    "num_layers": 160,
    "hidden_size": 32768,
    "ffn_hidden_size": 131072,
    "num_attention_heads": 256,
    "num_kv_heads": 32,
    "vocab_size": 128256,
}


def canned_plan(tp: int = 8, pp: int = 4, dp: int = 32) -> Plan:
    """A syntactically complete Plan (numbers are placeholders, not estimates)."""
    return Plan(
        config=Layout(tp=tp, pp=pp, dp=dp, num_micro_batches=32),
        placement={"tp": "nvlink", "cp": "nvlink", "ep": "nvlink", "dp": "leaf", "pp": "spine"},
        step_time_s=10.0,
        tokens_per_s=838860.8,
        tokens_per_s_per_gpu=819.2,
        mfu=0.4,
        hfu=0.45,
        model_tflops_per_gpu=395.0,
        time_breakdown_s=TimeBreakdown(compute=8.0, tp_comm=1.0, pp_bubble=1.0),
        memory_gib=MemoryBreakdown(
            weights=4.4,
            gradients=4.4,
            optimizer=1.1,
            activations=30.0,
            buffers=3.0,
            total=42.9,
            capacity=79.2,
        ),
        fits_memory=True,
        bottleneck="compute",
        launch=LaunchArgs(megatron="--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4"),
    )


def canned_response() -> PlanResponse:
    return PlanResponse(status="optimal", plans=[canned_plan()], solver=SolverInfo(proved_optimal=True))


def _detail_locs(response: httpx.Response) -> list[list[Any]]:
    return [item["loc"] for item in response.json()["detail"]]


def _messages(response: httpx.Response) -> str:
    return " | ".join(item["msg"] for item in response.json()["detail"])


# ------------------------------------------------------------------------------ service endpoints


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_version_reports_package_and_catalog(client: TestClient) -> None:
    from importlib.metadata import version

    from hardware_catalog import load_catalog

    body = client.get("/version").json()
    assert body == {
        "version": version("parallelism-planner"),
        "catalog_version": load_catalog().version,
    }


def test_every_response_carries_a_request_id(client: TestClient) -> None:
    first = client.get("/healthz").headers["X-Request-ID"]
    second = client.get("/healthz").headers["X-Request-ID"]
    assert first and second and first != second


def test_a_well_formed_incoming_request_id_is_kept(client: TestClient) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "trace-42"}).headers["X-Request-ID"] == "trace-42"
    replaced = client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"}).headers["X-Request-ID"]
    assert replaced != "bad id\twith spaces"


def test_one_json_access_line_per_request(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pplan.access"):
        response = client.get("/gpus/nope")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pplan.access"]
    assert len(lines) == 1
    line = lines[0]
    assert line["method"] == "GET" and line["path"] == "/gpus/nope" and line["status"] == 404
    assert line["request_id"] == response.headers["X-Request-ID"]
    assert line["duration_ms"] >= 0


# --------------------------------------------------------------------------------------- catalogs


@pytest.mark.parametrize("catalog", sorted(CATALOGS))
def test_catalog_list_has_every_required_id_with_sources(client: TestClient, catalog: str) -> None:
    response = client.get(f"/{catalog}")
    assert response.status_code == 200
    entries = response.json()
    assert isinstance(entries, list)
    ids = [entry["id"] for entry in entries]
    assert len(ids) == len(set(ids))
    assert set(CATALOGS[catalog]) <= set(ids)
    assert all("source" in json.dumps(entry) for entry in entries)


@pytest.mark.parametrize(("catalog", "entry_id"), [(c, i) for c, ids in sorted(CATALOGS.items()) for i in ids])
def test_catalog_get_returns_the_entry(client: TestClient, catalog: str, entry_id: str) -> None:
    response = client.get(f"/{catalog}/{entry_id}")
    assert response.status_code == 200
    assert response.json()["id"] == entry_id
    assert response.json() in client.get(f"/{catalog}").json()


@pytest.mark.parametrize(
    ("catalog", "kind"),
    [("gpus", "gpu"), ("networks", "network"), ("clusters", "cluster"), ("models", "model")],
)
def test_unknown_catalog_id_is_404_listing_valid_ids(client: TestClient, catalog: str, kind: str) -> None:
    response = client.get(f"/{catalog}/no-such-thing")
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert detail.startswith(f"unknown {kind} id 'no-such-thing'; valid ids: ")
    for entry_id in CATALOGS[catalog]:
        assert entry_id in detail


def test_gb200_presets_default_to_a_72_gpu_nvlink_domain(client: TestClient) -> None:
    assert client.get("/gpus/gb200").json()["default_nvlink_domain_size"] == 72
    assert client.get("/clusters/gb200-nvl72").json()["nvlink_domain_size"] == 72


# ----------------------------------------------------------------------- request validation (422)


def test_unknown_model_preset_is_422_listing_valid_ids(client: TestClient) -> None:
    response = client.post("/plan", json={**JOB, "model": {"preset": "llama9-1t"}})
    assert response.status_code == 422
    assert ["body", "model"] in _detail_locs(response)
    assert "unknown model preset id 'llama9-1t'" in _messages(response)
    assert all(m in _messages(response) for m in MODEL_IDS)


def test_unknown_gpu_id_is_422_listing_valid_ids(client: TestClient) -> None:
    cluster = {"num_gpus": 16, "gpu": "h100-pcie-42gb", "gpus_per_node": 8}
    response = client.post("/plan", json={**JOB, "cluster": cluster})
    assert response.status_code == 422
    assert ["body", "cluster"] in _detail_locs(response)
    message = _messages(response)
    assert "unknown gpu id 'h100-pcie-42gb'; valid ids:" in message
    assert all(gpu in message for gpu in GPU_IDS)


def test_unknown_cluster_preset_on_evaluate_is_422(client: TestClient) -> None:
    response = client.post("/evaluate", json={**EVALUATE_BODY, "cluster": {"preset": "dgx-z9", "num_gpus": 8}})
    assert response.status_code == 422
    assert "unknown cluster preset id 'dgx-z9'" in _messages(response)


def test_heads_not_divisible_by_kv_heads_is_422(client: TestClient) -> None:
    model = {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_kv_heads": 6,
        "vocab_size": 32000,
    }
    response = client.post("/plan", json={**JOB, "model": model})
    assert response.status_code == 422
    assert ["body", "model"] in _detail_locs(response)
    assert "num_attention_heads (16) must be divisible by num_kv_heads (6)" in _messages(response)


def test_missing_seq_len_is_422_naming_it(client: TestClient) -> None:
    response = client.post("/plan", json={**JOB, "training": {"global_batch_size": 1024}})
    assert response.status_code == 422
    assert ["body", "training", "seq_len"] in _detail_locs(response)


def test_unknown_attention_kernel_is_422_naming_it(client: TestClient) -> None:
    training = {**JOB["training"], "attention_kernel": "flash9"}
    response = client.post("/plan", json={**JOB, "training": training})
    assert response.status_code == 422
    assert ["body", "training", "attention_kernel"] in _detail_locs(response)
    assert "'unfused', 'flash2' or 'flash3'" in _messages(response)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("dp_collectives", "tree", "'hierarchical' or 'flat'"), ("cross_entropy", "chunked", "'fused' or 'unfused'")],
)
def test_unknown_stack_choice_is_422_naming_it(client: TestClient, field: str, value: str, allowed: str) -> None:
    training = {**JOB["training"], field: value}
    response = client.post("/evaluate", json={**JOB, "training": training, "config": {"tp": 8, "pp": 1}})
    assert response.status_code == 422
    assert ["body", "training", field] in _detail_locs(response)
    assert allowed in _messages(response)


@pytest.mark.parametrize("field", ["dp_comm_overlap", "grad_reduce_in_fp32"])
def test_non_boolean_stack_switch_is_422_naming_it(client: TestClient, field: str) -> None:
    training = {**JOB["training"], field: "sometimes"}
    response = client.post("/evaluate", json={**JOB, "training": training, "config": {"tp": 8, "pp": 1}})
    assert response.status_code == 422
    assert ["body", "training", field] in _detail_locs(response)
    assert "valid boolean" in _messages(response)


def test_flat_dp_collectives_slow_a_zero3_layout_across_nodes(client: TestClient) -> None:
    """Through the API: Llama 3 70B with ZeRO-3 on 1,024 H100 (128 nodes), hierarchical and flat."""

    def step(collectives: str) -> float:
        body = {
            **JOB,
            "training": {**JOB["training"], "dp_collectives": collectives},
            "config": {"tp": 1, "pp": 1, "zero_stage": 3, "recompute": "full"},
        }
        response = client.post("/evaluate", json=body)
        assert response.status_code == 200, response.text
        return response.json()["step_time_s"]

    assert step("flat") > 1.2 * step("hierarchical")


def test_context_parallel_with_unfused_attention_is_422_under_config_cp(client: TestClient) -> None:
    body = {
        **EVALUATE_BODY,
        "training": {**JOB["training"], "attention_kernel": "unfused"},
        "config": {**EVALUATE_BODY["config"], "tp": 4, "cp": 2},
    }
    response = client.post("/evaluate", json=body)
    assert response.status_code == 422
    assert ["body", "config", "cp"] in _detail_locs(response)
    assert "needs a fused attention kernel" in _messages(response)


def test_extra_unknown_field_is_422_naming_it(client: TestClient) -> None:
    response = client.post("/evaluate", json={**EVALUATE_BODY, "config": {**EVALUATE_BODY["config"], "tpp": 2}})
    assert response.status_code == 422
    assert ["body", "config", "tpp"] in _detail_locs(response)
    assert response.json()["detail"][0]["type"] == "extra_forbidden"


def test_top_k_above_the_schema_cap_is_422(client: TestClient) -> None:
    response = client.post("/plan", json={**JOB, "search": {"top_k": 51}})
    assert response.status_code == 422
    assert ["body", "search", "top_k"] in _detail_locs(response)


def test_top_k_above_the_server_limit_is_422(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "plan", lambda request: canned_response())
    with TestClient(create_app(Settings(max_top_k=10))) as small:
        response = small.post("/plan", json={**JOB, "search": {"top_k": 11}})
        assert response.status_code == 422
        assert ["body", "search", "top_k"] in _detail_locs(response)
        assert "max_top_k (10)" in _messages(response)
        assert small.post("/plan", json={**JOB, "search": {"top_k": 10}}).status_code == 200


def test_malformed_json_is_422(client: TestClient) -> None:
    response = client.post("/plan", content=b'{"model": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    (item,) = response.json()["detail"]
    assert item["loc"] == ["body", 10]
    assert item["msg"] == "JSON decode error: Expecting value (character 10 of the body)"


def test_a_body_not_sent_as_json_says_how_to_send_it(client: TestClient) -> None:
    """curl -d sends a form content type, which FastAPI does not parse as JSON."""
    body = b'{"model": {"preset": "llama3-8b"}}'
    form = client.post("/plan", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 422
    assert form.json()["detail"][0]["msg"].endswith(
        "(the body was sent as application/x-www-form-urlencoded; send JSON, Content-Type: application/json)"
    )


def test_body_that_is_not_utf8_is_422(client: TestClient) -> None:
    response = client.post("/evaluate", content=b"\xff\xfe\x00\x00\xff", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_validation_messages_drop_the_pydantic_prefix(client: TestClient) -> None:
    response = client.post("/plan", json={**JOB, "model": {"preset": "nope"}})
    assert not _messages(response).startswith("Value error")


# ----------------------------------------------------------------------------------------- limits


def test_time_limit_is_clamped_and_defaulted(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[PlanRequest] = []

    def fake_plan(request: PlanRequest) -> PlanResponse:
        seen.append(request)
        return canned_response()

    monkeypatch.setattr(service, "plan", fake_plan)
    with TestClient(create_app(Settings(max_time_limit_s=20, default_time_limit_s=3))) as app_client:
        clamped = app_client.post("/plan", json={**JOB, "search": {"time_limit_s": 60}})
        defaulted = app_client.post("/plan", json=JOB)
        kept = app_client.post("/plan", json={**JOB, "search": {"time_limit_s": 5}})
    assert [r.status_code for r in (clamped, defaulted, kept)] == [200, 200, 200]
    assert [r.search.time_limit_s for r in seen] == [20, 3, 5]
    assert any("clamped" in w for w in clamped.json()["warnings"])
    assert defaulted.json()["warnings"] == [] and kept.json()["warnings"] == []


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    big = json.dumps({**JOB, "padding": "x" * (8 << 20)})
    response = client.post("/plan", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "limit" in response.json()["detail"]


def test_chunked_body_over_the_limit_is_413() -> None:
    app = create_app(Settings(max_body_bytes=4096))

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b" " * 1024

    with TestClient(app) as small:
        response = small.post("/plan", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


# ------------------------------------------------------------------------ errors from the service


def test_invalid_layout_is_422_under_config(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def reject(request: EvaluateRequest) -> Plan:
        raise InvalidLayout("config.tp", "tp (3) must divide num_attention_heads (64)")

    monkeypatch.setattr(service, "evaluate", reject)
    response = client.post("/evaluate", json=EVALUATE_BODY)
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "loc": ["body", "config", "tp"],
                "msg": "tp (3) must divide num_attention_heads (64)",
                "type": "invalid_layout",
            }
        ]
    }


def test_invalid_layout_field_without_prefix_still_lands_under_config(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reject(request: EvaluateRequest) -> Plan:
        raise InvalidLayout("pp", "pp (7) does not divide num_gpus")

    monkeypatch.setattr(service, "evaluate", reject)
    assert _detail_locs(client.post("/evaluate", json=EVALUATE_BODY)) == [["body", "config", "pp"]]


def test_unexpected_exception_is_a_logged_500_with_request_id(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(request: PlanRequest) -> PlanResponse:
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(service, "plan", explode)
    with caplog.at_level(logging.ERROR, logger="pplan.error"):
        response = client.post("/plan", json=JOB)
    assert response.status_code == 500
    body = response.json()
    assert body["detail"] == "internal error"
    assert body["request_id"] == response.headers["X-Request-ID"]
    assert "solver exploded" not in response.text
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pplan.error"]
    assert logged and logged[0]["request_id"] == body["request_id"]
    assert "RuntimeError: solver exploded" in logged[0]["traceback"]


def test_infeasible_is_a_200_passed_through(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    infeasible = PlanResponse(status="infeasible", plans=[], solver=SolverInfo(), explanation="needs 93 GiB, has 80")
    monkeypatch.setattr(service, "plan", lambda request: infeasible)
    response = client.post("/plan", json=JOB)
    assert response.status_code == 200
    assert response.json()["status"] == "infeasible"
    assert response.json()["explanation"] == "needs 93 GiB, has 80"


def test_plan_and_evaluate_return_the_service_result(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "plan", lambda request: canned_response())
    monkeypatch.setattr(service, "evaluate", lambda request: canned_plan())
    assert PlanResponse.model_validate(client.post("/plan", json=JOB).json()) == canned_response()
    assert Plan.model_validate(client.post("/evaluate", json=EVALUATE_BODY).json()) == canned_plan()


# ------------------------------------------------------------------------ the bounded solver pool


def test_saturated_pool_answers_503_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    on_the_loop: list[bool] = []

    def slow_plan(request: PlanRequest) -> PlanResponse:
        on_the_loop.append(threading.current_thread() is threading.main_thread())
        release.wait(timeout=10)
        return canned_response()

    monkeypatch.setattr(service, "plan", slow_plan)
    app = create_app(Settings(solver_workers=1, max_queue=1))
    pool = app.state.solver_pool

    async def scenario() -> tuple[list[int], httpx.Response, float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://planner") as http:
            held = [asyncio.create_task(http.post("/plan", json=JOB)) for _ in range(2)]
            deadline = time.monotonic() + 5
            while pool.in_flight < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            # The loop stays responsive while the pool is busy.
            started = time.monotonic()
            assert (await http.get("/healthz")).status_code == 200
            health_s = time.monotonic() - started
            rejected = await http.post("/plan", json=JOB)
            release.set()
            statuses = [(await task).status_code for task in held]
        return statuses, rejected, health_s

    try:
        statuses, rejected, health_s = asyncio.run(scenario())
    finally:
        release.set()
        pool.close()
    assert rejected.status_code == 503
    assert rejected.headers["Retry-After"] == "1"
    assert statuses == [200, 200]
    assert health_s < 1.0
    assert on_the_loop == [False, False]
    assert pool.in_flight == 0


def test_pool_slot_is_freed_when_the_service_fails(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "plan", lambda request: (_ for _ in ()).throw(RuntimeError("boom")))
    for _ in range(3):
        assert client.post("/plan", json=JOB).status_code == 500
    assert client.app.state.solver_pool.in_flight == 0  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------- OpenAPI


def test_openapi_has_stable_operation_ids_and_tags(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    operations = {(method.upper(), path): op for path, item in schema["paths"].items() for method, op in item.items()}
    assert {op["operationId"]: key for key, op in operations.items()} == {
        "plan": ("POST", "/plan"),
        "evaluate": ("POST", "/evaluate"),
        "compare": ("POST", "/compare"),
        "list_gpus": ("GET", "/gpus"),
        "get_gpu": ("GET", "/gpus/{gpu_id}"),
        "list_networks": ("GET", "/networks"),
        "get_network": ("GET", "/networks/{network_id}"),
        "list_clusters": ("GET", "/clusters"),
        "get_cluster": ("GET", "/clusters/{cluster_id}"),
        "list_models": ("GET", "/models"),
        "get_model": ("GET", "/models/{model_id}"),
        "healthz": ("GET", "/healthz"),
        "version": ("GET", "/version"),
        "create_sweep": ("POST", "/sweeps"),
        "get_sweep": ("GET", "/sweeps/{sweep_id}"),
        "cancel_sweep": ("DELETE", "/sweeps/{sweep_id}"),
    }
    assert all(op["tags"] for op in operations.values())
    for path in ("/plan", "/evaluate"):
        examples = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["examples"]
        assert examples, path
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize("name", sorted(PLAN_EXAMPLES))
def test_plan_openapi_examples_are_valid_requests(name: str) -> None:
    PlanRequest.model_validate(PLAN_EXAMPLES[name]["value"])


@pytest.mark.parametrize("name", sorted(EVALUATE_EXAMPLES))
def test_evaluate_openapi_examples_are_valid_requests(name: str) -> None:
    EvaluateRequest.model_validate(EVALUATE_EXAMPLES[name]["value"])


# ------------------------------------------------------------------------------- the real planner


class TestRealService:
    """Through ``optimizer.service`` itself (no stand-ins)."""

    def test_evaluate_llama3_70b_tp8_pp4(self, client: TestClient) -> None:
        response = client.post("/evaluate", json=EVALUATE_BODY)
        assert response.status_code == 200, response.text
        plan = Plan.model_validate(response.json())
        assert plan.step_time_s > 0
        assert 0 < plan.mfu < 1
        assert isinstance(plan.fits_memory, bool)
        assert plan.memory_gib.total > 0
        assert plan.config.tp == 8 and plan.config.pp == 4 and plan.config.dp == 32

    def test_evaluate_invalid_layout_is_422_under_config(self, client: TestClient) -> None:
        body = {**EVALUATE_BODY, "config": {**EVALUATE_BODY["config"], "tp": 3}}
        response = client.post("/evaluate", json=body)
        assert response.status_code == 422, response.text
        assert any("config" in loc for loc in _detail_locs(response))

    def test_evaluate_takes_embedding_only_and_loss_only_chunks(self, client: TestClient) -> None:
        """Zero layers in the first (embedding) and last (output layer and loss) chunk, as
        Megatron's account-for-embedding/loss split; nowhere else."""
        # Megatron-Core's selective recompute (core_attn): a layout Megatron-LM runs, so it gets its arguments
        ends = {
            **EVALUATE_BODY,
            "config": {**EVALUATE_BODY["config"], "recompute": "core_attn", "stage_layers": [0, 40, 40, 0]},
        }
        response = client.post("/evaluate", json=ends)
        assert response.status_code == 200, response.text
        plan = Plan.model_validate(response.json())
        assert plan.config.stage_layers == [0, 40, 40, 0]
        assert "'E|t*40|t*40|L'" in plan.launch.megatron
        middle = {**EVALUATE_BODY, "config": {**EVALUATE_BODY["config"], "stage_layers": [40, 0, 20, 20]}}
        response = client.post("/evaluate", json=middle)
        assert response.status_code == 422, response.text
        assert ["body", "config", "stage_layers"] in _detail_locs(response)
        assert "at least one layer" in _messages(response)

    def test_plan_returns_ranked_plans(self, client: TestClient) -> None:
        response = client.post("/plan", json={**JOB, "search": {"top_k": 3, "time_limit_s": 10}})
        assert response.status_code == 200, response.text
        body = PlanResponse.model_validate(response.json())
        assert body.status in {"optimal", "feasible"}
        assert 1 <= len(body.plans) <= 3
        times = [p.step_time_s for p in body.plans]
        assert times == sorted(times)

    def test_a_model_that_cannot_fit_is_200_infeasible_with_explanation(self, client: TestClient) -> None:
        job = {
            "model": DENSE_2T,
            "training": {"seq_len": 4096, "global_batch_size": 64},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
            "search": {"time_limit_s": 10},
        }
        response = client.post("/plan", json=job)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "infeasible"
        assert body["plans"] == []
        assert body["explanation"]

    def test_evaluated_plan_reproduces_the_planned_numbers(self, client: TestClient) -> None:
        best = client.post("/plan", json={**JOB, "search": {"top_k": 1}}).json()["plans"][0]
        config = {k: v for k, v in best["config"].items() if v is not None}
        config["placement"] = best["placement"]
        again = client.post("/evaluate", json={**JOB, "config": config})
        assert again.status_code == 200, again.text
        assert again.json()["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("path", ["/plan", "/evaluate"])
@pytest.mark.parametrize("precision, cluster, units", [("fp8", "dgx-a100", "FP8"), ("fp4", "dgx-h100", "FP4")])
def test_low_precision_on_a_gpu_without_its_tensor_cores_is_422_naming_training_precision(
    client: TestClient, path: str, precision: str, cluster: str, units: str
) -> None:
    body: dict = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "precision": precision},
        "cluster": {"preset": cluster, "num_gpus": 8},
    }
    if path == "/evaluate":
        body["config"] = {"tp": 1, "pp": 1}
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["loc"] == ["body", "training", "precision"] and units in d["msg"] for d in detail), detail


def test_moe_recompute_pinned_on_a_dense_model_is_422(client: TestClient) -> None:
    response = client.post("/plan", json={**JOB, "search": {"fix": {"recompute": "moe"}}})
    assert response.status_code == 422
    assert "search.fix.recompute: 'moe' recomputes MoE blocks and needs an MoE model" in _messages(response)


# ------------------------------------------------------------------------------ recompute notes


def _evaluate_llama70b(recompute: str, kernel: str = "flash3", cp: int = 2) -> Any:
    return service.evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-70b"},
        # FSDP2's ZeRO-3 buffers: with Megatron-FSDP's (8.7 GiB more) the selective layout no longer fits
        "training": {"seq_len": 8192, "global_batch_size": 512, "attention_kernel": kernel, "fsdp_buffers": "layer"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 512},
        "config": {"tp": 1, "pp": 1, "cp": cp, "micro_batch_size": 1, "zero_stage": 3, "recompute": recompute},
    }))  # fmt: skip


def test_selective_recompute_plan_says_what_megatron_default_would_keep() -> None:
    """A Llama 3 70B layout on 512 H100 (TP1 CP2 ZeRO-3, selective recompute, FSDP2's buffers):
    71.8 GiB as costed, but Megatron-Core's selective recompute (core_attn, the launch arguments)
    keeps the norm and activation outputs: with flash-class attention that is the same layout's
    memory with recompute none (101.5 GiB). The note gives both numbers so that nobody launches
    it that way and runs out of memory."""
    selective, none = _evaluate_llama70b("selective"), _evaluate_llama70b("none")
    assert selective.fits_memory and not none.fits_memory
    assert selective.memory_gib.total == pytest.approx(71.8, abs=0.05)
    (note,) = [n for n in selective.notes if "core_attn" in n]
    extra = none.memory_gib.total - selective.memory_gib.total
    assert f": {extra:.1f} GiB more" in note and f", {none.memory_gib.total:.1f} GiB of" in note
    assert "(core_attn)" in note and "(does not fit)" in note
    assert not [n for n in none.notes if "core_attn" in n]


def _megatron_gib(note: str) -> float:
    return float(re.search(r"more on the peak stage, ([0-9.]+) GiB of", note).group(1))


def test_selective_recompute_note_drops_what_megatron_still_drops() -> None:
    """Megatron's core_attn still drops unfused attention's materialised scores, and on MLA
    models mla_up_proj (which the launch arguments add) the per-head q, k, v: the note's memory
    sits between the costed selective and recompute none."""
    sel, none = _evaluate_llama70b("selective", "unfused", cp=1), _evaluate_llama70b("none", "unfused", cp=1)
    (note,) = [n for n in sel.notes if "core_attn" in n]
    assert sel.memory_gib.total + 1 < _megatron_gib(note) < none.memory_gib.total - 1

    def deepseek(recompute: str) -> Any:
        return service.evaluate(EvaluateRequest.model_validate({
            "model": {"preset": "deepseek-v3"},
            "training": {"seq_len": 4096, "global_batch_size": 15360, "precision": "fp8"},
            "cluster": {"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
            "config": {"tp": 1, "pp": 16, "ep": 64, "zero_stage": 1, "recompute": recompute},
        }))  # fmt: skip

    sel, none = deepseek("selective"), deepseek("none")
    (note,) = [n for n in sel.notes if "core_attn, mla_up_proj" in n]
    assert sel.memory_gib.total + 1 < _megatron_gib(note) < none.memory_gib.total - 1


# ------------------------------------------------------------------------------ data-parallel overlap note


def _evaluate_gpt3_zero3(**training: Any) -> Any:
    return service.evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1536, **training},
        "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
        "config": {"tp": 4, "pp": 1, "micro_batch_size": 3, "zero_stage": 3, "recompute": "none"},
    }))  # fmt: skip


def test_plan_says_how_much_it_rests_on_hiding_data_parallel_collectives() -> None:
    """The planner's best GPT-3 175B layout on 1,024 A100 (TP4, ZeRO-3 over 256 ranks) hides most
    of its weight gathers under compute; the note gives the same layout, rank order and split with
    weights gathered on demand. Only the data-parallel term moves, so the two steps differ by exactly the
    hidden time; ``dp_comm_overlap: false`` may pick a better rank order, never a slower one."""
    overlapped, blocking = _evaluate_gpt3_zero3(), _evaluate_gpt3_zero3(dp_comm_overlap=False)
    (note,) = [n for n in overlapped.notes if "hidden under compute" in n]
    found = re.fullmatch(r"([0-9.]+) s of data-parallel communication per step is hidden under compute .*"
                         r"without it the step takes ([0-9.]+) s \(([0-9]+)% slower\)", note)  # fmt: skip
    assert found, note
    hidden_s, step_s, pct = float(found[1]), float(found[2]), int(found[3])
    # 12.77 s of ZeRO-3 collectives: on demand the two weight gathers (2/3 of them) block, the
    # reduce-scatter still hides; overlapped, 8% of the gathers' time is still costed (contention)
    assert hidden_s == pytest.approx(12.77 * 2 / 3 * (1 - 0.08), abs=0.01)
    assert step_s == pytest.approx(overlapped.step_time_s + hidden_s, abs=0.01)
    assert pct == round(100 * (step_s / overlapped.step_time_s - 1))
    assert blocking.step_time_s <= step_s + 1e-3
    assert not [n for n in blocking.notes if "hidden under compute" in n]


def test_no_overlap_note_when_little_is_hidden() -> None:
    """Llama 3 70B, TP8 PP4 ZeRO-1 on 512 H100: the gradient reduce-scatter and parameter gather
    hide under the last micro-batch; blocking would cost under 5% of the step."""
    plan = service.evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": 512},
        "config": {"tp": 8, "pp": 4, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"},
    }))  # fmt: skip
    assert not [n for n in plan.notes if "hidden under compute" in n]


def _evaluate_gpt3_pipeline(zero_stage: int, pp: int = 8) -> Any:
    return service.evaluate(EvaluateRequest.model_validate({
        **job_copy(GPT3_175B_ON_1024_H100),
        "config": {"tp": 2, "pp": pp, "vpp": 8 if pp > 1 else 1, "micro_batch_size": 1,
                   "zero_stage": zero_stage, "recompute": "none"},
    }))  # fmt: skip


def test_pipeline_plans_with_zero2_say_what_zero1_takes() -> None:
    """The frameworks the launch arguments target run ZeRO-1 at most with pipeline parallelism.
    GPT-3 175B, TP2 PP8 with 8 chunks a stage on 1,024 H100 (the planner's layout): ZeRO-2 fits
    in 80 GB; as ZeRO-1 it keeps every gradient of its stage (about 175B / 16 x 2 bytes, 64 times
    its ZeRO-2 shard) and does not. The note's numbers are the same layout costed as ZeRO-1."""
    zero2, zero1 = _evaluate_gpt3_pipeline(2), _evaluate_gpt3_pipeline(1)
    (note,) = [n for n in zero2.notes if "with pipeline parallelism" in n]
    needs_gib = float(re.search(r"needs ([0-9.]+) GiB", note).group(1))
    assert needs_gib == pytest.approx(zero1.memory_gib.total, abs=0.05)
    assert zero2.fits_memory and not zero1.fits_memory and "(does not fit)" in note
    assert f"steps in {zero1.step_time_s:.3f} s" in note
    assert zero1.memory_gib.gradients == pytest.approx(64 * zero2.memory_gib.gradients, rel=1e-9)  # dp = 64
    # the gradients' difference (20.5 GiB), less Megatron-FSDP's ZeRO-2 reduce-scatter queue (1e9 + a
    # layer of bf16 gradient elements, 2.3 GiB, in place of two 160 MB buckets), plus the allocator's share
    assert 17.0 < zero1.memory_gib.total - zero2.memory_gib.total < 22.0
    assert not [n for n in zero1.notes if "with pipeline parallelism" in n]
    assert not [n for n in _evaluate_gpt3_pipeline(2, pp=1).notes if "with pipeline parallelism" in n]


def _example(name: str, **training: Any) -> Any:
    from api import cli

    data = cli.load_document(str(Path(__file__).resolve().parents[2] / "examples" / name))
    data["training"] = {**data["training"], **training}
    return data


def test_recompute_notes_give_what_the_other_frameworks_keep() -> None:
    """A selective plan runs as op-level checkpointing in torchtitan, an op plan as Megatron-Core's
    selective recompute in Megatron and Bridge; the notes give those memories, each the same
    layout costed with that recompute. Llama 3 70B at TP 8: op keeps the w2 partial sums (8.3 GiB
    more, fits); torchtitan's 8B example: Megatron's selective keeps norms, activations and every
    matmul output with the expanded keys and values and eager SwiGLU's silu output (62 GiB more,
    does not fit)."""
    selective_req = _example("evaluate-llama3-70b.yaml")
    selective_req["config"] = {**selective_req["config"], "recompute": "selective"}  # the cost model's own
    selective = service.evaluate(EvaluateRequest.model_validate(selective_req))
    op = service.evaluate(
        EvaluateRequest.model_validate({**selective_req, "config": {**selective_req["config"], "recompute": "op"}})
    )
    (note,) = [n for n in selective.notes if n.startswith("torchtitan runs recompute 'selective'")]
    assert f"{op.memory_gib.total:.1f} GiB of 78.6 GiB usable (fits)" in note
    assert f"keeps {op.memory_gib.total - selective.memory_gib.total:.1f} GiB more" in note
    titan = service.evaluate(EvaluateRequest.model_validate(_example("evaluate-llama3.1-8b-torchtitan.yaml")))
    (note,) = [n for n in titan.notes if "Megatron-Core's selective recompute" in n]
    assert "143.8 GiB of 95.0 GiB usable (does not fit)" in note


def test_pipeline_note_for_expert_sharding_without_data_parallelism() -> None:
    """Mixtral 8x7B, TP4 PP4 EP2 on 16 H100 (dp = 1): expert state still shards over
    tp x dp x cp / ep = 2, so ZeRO-2 and ZeRO-1 differ and the pipeline note is given. The ZeRO-1
    figure includes the optimizer step's fp32 copy of the 16-bit gradients of the optimizer's shard
    (4 bytes a parameter: dense state unsharded at dp = 1, expert state over 2)."""
    plan = service.evaluate(EvaluateRequest.model_validate({
        "model": {"preset": "mixtral-8x7b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
        "config": {"tp": 4, "pp": 4, "ep": 2, "zero_stage": 2, "recompute": "full"},
    }))  # fmt: skip
    assert plan.config.dp == 1
    (note,) = [n for n in plan.notes if "with pipeline parallelism" in n]
    assert "68.7 GiB of 78.6 GiB usable (fits)" in note


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("PUT", "/plan", "POST"), ("DELETE", "/gpus", "GET, HEAD"), ("PUT", "/sweeps/x", "DELETE, GET, HEAD")],
)
def test_405_names_the_allowed_methods(client: TestClient, method: str, path: str, allow: str) -> None:
    """Routes of included routers carry no methods of their own: every 405 had an empty Allow."""
    r = client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow


def test_evaluate_notes_moe_settings_on_a_dense_model(client: TestClient) -> None:
    """/plan and /compare warned that they do nothing; /evaluate said nothing."""
    body = {
        **JOB,
        "training": {**JOB["training"], "moe_dispatcher": "deepep", "moe_capacity_factor": 1.0},
        "config": {"tp": 8, "pp": 4, "micro_batch_size": 1},
    }
    r = client.post("/evaluate", json=body)
    assert r.status_code == 200, r.text
    assert any(
        n.startswith("training.moe_dispatcher, training.moe_capacity_factor have no effect") for n in r.json()["notes"]
    ), r.json()["notes"]
