"""Warnings for jobs that look wrong, in the `warnings` of /plan and /compare answers, and the
reference numbers behind them (optimizer/data/job_checks.toml) against the published runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from hardware_catalog import load_catalog
from optimizer.job_warnings import load_job_checks

RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "published_runs.json"
LAYOUTS = [{"tp": 8, "pp": 1, "zero_stage": 1}, {"tp": 4, "pp": 1, "zero_stage": 1}]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def _compare_warnings(client: TestClient, job: dict[str, Any], layouts: list[dict[str, Any]] = LAYOUTS) -> list[str]:
    response = client.post("/compare", json={**job, "layouts": layouts})
    assert response.status_code == 200, response.text
    return response.json()["warnings"]


def _job(gbs: int, gpus: int, seq: int = 8192, preset: str = "llama3-8b") -> dict[str, Any]:
    return {
        "model": {"preset": preset},
        "training": {"seq_len": seq, "global_batch_size": gbs},
        "cluster": {"preset": "dgx-h100", "num_gpus": gpus},
    }


def test_a_batch_that_looks_like_tokens(client: TestClient) -> None:
    [warning] = [w for w in _compare_warnings(client, _job(16_777_216, 1024)) if "global_batch_size" in w]
    assert "16,777,216 sequences of 8,192 tokens, 137,438,953,472 tokens a step" in warning
    assert "62,914,560 tokens" in warning and "2,048 sequences of 8,192" in warning
    # 8 times the largest published batch (503.3M tokens) is the line: 61,440 sequences of 8,192 pass
    assert not [w for w in _compare_warnings(client, _job(61_440, 1024)) if "global_batch_size is" in w]
    assert [w for w in _compare_warnings(client, _job(62_464, 1024)) if "global_batch_size is" in w]


def test_gpus_that_are_not_whole_nodes(client: TestClient) -> None:
    warnings = _compare_warnings(client, _job(100, 100), [{"tp": 4, "zero_stage": 1}, {"tp": 2, "zero_stage": 1}])
    assert any("num_gpus (100) is not a whole number of 8-GPU nodes (12 nodes and 4 GPUs)" in w for w in warnings)
    for gpus in (4, 8, 64):  # half a node, or whole nodes
        small = [{"tp": 2, "zero_stage": 1}, {"tp": 1, "zero_stage": 1}]
        assert not [w for w in _compare_warnings(client, _job(64, gpus), small) if "whole number" in w]


def test_a_batch_too_small_for_the_gpu_count(client: TestClient) -> None:
    job = _job(16, 1024, preset="llama3-70b")
    layouts = [{"tp": 8, "cp": 8, "zero_stage": 3}, {"tp": 4, "cp": 16, "zero_stage": 3}]
    warnings = _compare_warnings(client, job, layouts)
    [warning] = [w for w in warnings if "is small for" in w]
    assert "global_batch_size (16) is small for 1,024 GPUs: at most 16 data-parallel replicas" in warning
    assert "at least 64 GPUs" in warning and "128 tokens a GPU a step" in warning
    assert not [w for w in _compare_warnings(client, _job(256, 1024)) if "is small for" in w]


def test_fewer_micro_batches_than_the_pipeline_wants(client: TestClient) -> None:
    """The seed scenario: GPT-3 175B on 8,192 H100 with a 2M-token batch; its best plan runs 16
    micro-batches through 16 stages."""
    body = client.post("/plan", json={
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_tokens": 2_097_152},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8192},
        "search": {"top_k": 1},
    }).json()  # fmt: skip
    top = body["plans"][0]
    assert (top["config"]["pp"], top["config"]["num_micro_batches"]) == (16, 16)
    [warning] = [w for w in body["warnings"] if "micro-batches" in w]
    bubble = top["time_breakdown_s"]["pp_bubble"]
    assert "runs 16 micro-batches through 16 pipeline stages" in warning and f"{bubble:.3f} s" in warning


def test_mfu_above_the_best_published_for_the_gpu_and_precision(client: TestClient) -> None:
    job = {
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1536},
        "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
    }
    mine = {"tp": 8, "pp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"}
    yours = {"tp": 4, "pp": 8, "vpp": 12, "micro_batch_size": 2, "zero_stage": 2, "recompute": "none"}
    response = client.post("/compare", json={**job, "layouts": [mine, yours]}).json()
    mfus = [e["plan"]["mfu"] for e in response["entries"]]
    assert mfus[0] < 0.563 < mfus[1]
    [warning] = response["warnings"]
    assert warning.startswith(f"layout 1: predicted MFU {100 * mfus[1]:.1f}% is above the best published")
    assert "a100-sxm-80gb at bf16 (56.3%, Korthikanti et al. 2022: 1T on 512 A100)" in warning
    # fp16 shares the 16-bit row; a GPU without a published row gets no such warning
    assert load_job_checks().best_for("a100-sxm-40gb", "fp16").mfu == 0.563
    assert load_job_checks().best_for("mi300x", "bf16") is None


def test_best_published_mfus_are_the_calibration_rows() -> None:
    runs = {r["id"]: r for r in json.loads(RUNS.read_text())}
    checked = 0
    for best in load_job_checks().best_mfu:
        assert best.source and best.cite and best.kind
        if best.run not in runs:
            continue
        measured = runs[best.run]["measured"]
        peak = runs[best.run]["hardware"]["peak_dense_tflops_used_for_mfu"]
        if measured["tflops_per_gpu"] is None:
            assert best.mfu == pytest.approx(measured["mfu"])
        else:  # model TFLOP/s a GPU over the dense peak at the precision (fp8: the catalog's fp8 peak)
            if best.precision == "fp8":
                peak = load_catalog().gpus[best.gpus[0]].fp8_dense_flops.value / 1e12
            assert best.mfu == pytest.approx(measured["tflops_per_gpu"] / peak, abs=5e-5)
            assert measured["mfu"] is None or abs(best.mfu - measured["mfu"]) < 0.005  # the source's rounding
        checked += 1
    assert checked == 4  # A100 and H100 16-bit, H100 and GB200 fp8
