"""`cluster.gemm_efficiency`: a request's own large-GEMM fraction of the dense peak replaces the
catalog's in the cost model (every GEMM), the board-power estimate and the plan's notes, and
/evaluate's answer shows it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from hardware_catalog import load_catalog
from optimizer.capacity.annotate import resolve_inputs
from optimizer.cost import build_context
from optimizer.specs import EvaluateRequest

H100_BF16 = 0.803  # the catalog's measured MAMF fraction (tests/catalog/test_catalog.py)


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def _evaluate(gemm_efficiency: float | None = None, precision: str = "bf16", kernel: str = "flash3") -> dict[str, Any]:
    cluster: dict[str, Any] = {"preset": "dgx-h100", "num_gpus": 64}
    if gemm_efficiency is not None:
        cluster["gemm_efficiency"] = gemm_efficiency
    return {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "precision": precision, "attention_kernel": kernel},
        "cluster": cluster,
        "config": {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
    }


def _post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/evaluate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_catalogs_own_value_changes_nothing_but_the_note(client: TestClient) -> None:
    assert load_catalog().gpus["h100-sxm-80gb"].gemm_efficiency_bf16.value == H100_BF16
    base, same = _post(client, _evaluate()), _post(client, _evaluate(H100_BF16))
    assert same["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)
    assert not [n for n in base["notes"] if "cluster.gemm_efficiency" in n]
    [note] = [n for n in same["notes"] if "cluster.gemm_efficiency" in n]
    assert note == (
        "GEMMs costed at cluster.gemm_efficiency 0.803 of the bf16 peak as given "
        "(the catalog's for h100-sxm-80gb: 0.803, measured)"
    )


def test_a_lower_fraction_slows_compute_and_lowers_mfu(client: TestClient) -> None:
    base, slow = _post(client, _evaluate()), _post(client, _evaluate(0.6))
    ratio = slow["time_breakdown_s"]["compute"] / base["time_breakdown_s"]["compute"]
    # GEMMs slow by 0.803 / 0.6; the fused attention core (its own efficiency) does not
    assert 1.15 < ratio <= H100_BF16 / 0.6 + 1e-9
    assert slow["mfu"] < base["mfu"] and slow["step_time_s"] > base["step_time_s"]


def test_it_applies_at_the_training_precision_only() -> None:
    """fp8: the override is the fp8 fraction; the bf16 batched GEMMs of unfused attention keep the catalog's."""
    ctx = build_context(EvaluateRequest.model_validate(_evaluate(0.5, "fp8", "unfused")).job_spec())
    frac = ctx.cal.gemm_training_fraction
    assert ctx.gemm_efficiency == pytest.approx(0.5 * frac)
    assert ctx.bf16_gemm_efficiency == pytest.approx(H100_BF16 * frac)
    bf16 = build_context(EvaluateRequest.model_validate(_evaluate(0.5, "bf16", "unfused")).job_spec())
    assert bf16.gemm_efficiency == bf16.bf16_gemm_efficiency == pytest.approx(0.5 * frac)


def test_the_board_power_estimate_reads_it() -> None:
    job = EvaluateRequest.model_validate(_evaluate(0.5)).job_spec()
    assert resolve_inputs(job).gemm_efficiency == pytest.approx(0.5)


@pytest.mark.parametrize("value", [0, 1.2, -0.1])
def test_out_of_range_is_a_422_at_the_field(client: TestClient, value: float) -> None:
    response = client.post("/evaluate", json=_evaluate(value))
    assert response.status_code == 422
    assert ["body", "cluster", "gemm_efficiency"] in [e["loc"] for e in response.json()["detail"]]
