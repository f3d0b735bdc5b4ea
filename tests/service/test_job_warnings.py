"""Warnings for jobs that look wrong, in the `warnings` of /plan and /compare answers, and the
reference numbers behind them (optimizer/data/job_checks.toml) against the published runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from optimizer import model_mfu
from optimizer.job_warnings import load_job_checks, split_mfu_warning
from optimizer.specs import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import job_checks  # noqa: E402

RUNS = ROOT / "benchmarks" / "data" / "published_runs.json"
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


def test_settings_that_do_nothing_for_the_model(client: TestClient) -> None:
    dense = _job(256, 16, seq=4096)
    dense["training"] |= {"moe_dispatcher": "deepep", "ep_comm_overlap": True}
    [warning] = [w for w in _compare_warnings(client, dense) if "no effect" in w]
    assert (
        warning
        == "training.moe_dispatcher, training.ep_comm_overlap have no effect on this model: the plans ignore them"
    )
    windowless = _job(256, 16, seq=4096)
    windowless["model"] = {"preset": "llama3-8b", "sliding_window_every": 2}
    [warning] = [w for w in _compare_warnings(client, windowless) if "no effect" in w]
    assert warning.startswith("model.sliding_window_every (no model.sliding_window) has no effect")
    moe = _job(256, 64, seq=4096, preset="mixtral-8x7b")
    moe["training"] |= {"moe_dispatcher": "deepep"}
    assert not [w for w in _compare_warnings(client, moe, [{"tp": 2, "ep": 8, "zero_stage": 1}, {"tp": 1, "ep": 8, "zero_stage": 1}]) if "no effect" in w]  # fmt: skip
    assert not [w for w in _compare_warnings(client, _job(256, 16, seq=4096)) if "no effect" in w]


def test_gpus_that_are_not_whole_nodes(client: TestClient) -> None:
    warnings = _compare_warnings(client, _job(100, 100), [{"tp": 4, "zero_stage": 1}, {"tp": 2, "zero_stage": 1}])
    assert any("num_gpus (100) is not a whole number of 8-GPU nodes (12 nodes and 4 GPUs)" in w for w in warnings)
    for gpus in (4, 8, 64):  # half a node, or whole nodes
        small = [{"tp": 2, "zero_stage": 1}, {"tp": 1, "zero_stage": 1}]
        assert not [w for w in _compare_warnings(client, _job(64, gpus), small) if "whole number" in w]


def test_a_gpu_the_preset_does_not_come_with(client: TestClient) -> None:
    """An explicit cluster.gpu overrides only the GPU: where the preset's node size or NVLink domain
    is not the GPU's own (catalog) and the request leaves them, the answer says which stay (B200s
    in a gb200-nvl72 preset get 72-GPU NVLink domains of 4-GPU nodes)."""

    def warned(cluster: dict) -> list[str]:
        job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
               "cluster": {**cluster, "num_gpus": 72}, "search": {"top_k": 1}}  # fmt: skip
        r = client.post("/plan", json=job)
        assert r.status_code == 200, r.text
        return [w for w in r.json()["warnings"] if w.startswith("cluster.gpu")]

    [warning] = warned({"preset": "gb200-nvl72", "gpu": "b200"})
    assert warning == (
        "cluster.gpu b200 replaces preset gb200-nvl72's gb200 and keeps the preset's 72-GPU NVLink domains and "
        "4 GPUs a node, where b200 comes with 8 and 8: set cluster.nvlink_domain_size and cluster.gpus_per_node "
        "if the cluster differs"
    )
    assert not warned({"preset": "dgx-h100", "gpu": "b200"})  # the same 8-GPU nodes and domains
    assert not warned({"preset": "gb200-nvl72", "gpu": "b200", "gpus_per_node": 8, "nvlink_domain_size": 8})
    assert not warned({"preset": "gb200-nvl72", "gpu": "gb200"})  # the preset's own GPU


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
    # a dense model is held to the GPU's best (the 1T model's 56.3% on A100)
    job = {
        "model": {"preset": "gpt3-175b", "num_layers": 88},
        "training": {"seq_len": 2048, "global_batch_size": 1536},
        "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
    }
    mine = {"tp": 8, "pp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"}
    yours = {"tp": 4, "pp": 8, "vpp": 11, "micro_batch_size": 2, "zero_stage": 2, "recompute": "none"}
    response = client.post("/compare", json={**job, "layouts": [mine, yours]}).json()
    mfus = [e["plan"]["mfu"] for e in response["entries"]]
    assert mfus[0] < 0.563 < mfus[1]
    [warning] = response["warnings"]
    assert warning.startswith(f"layout 1: predicted MFU {100 * mfus[1]:.1f}% is above the best published")
    assert "a100-sxm-80gb at bf16 (56.3%, Korthikanti et al. 2022: 1T on 512 A100)" in warning
    # the sweep table groups these warnings by what follows the MFU (api/sweep_cli.py)
    value, rest = split_mfu_warning(warning.removeprefix("layout 1: ")) or (0.0, "")
    assert value == round(100 * mfus[1], 1) and rest.startswith("is above the best published for a100")
    assert split_mfu_warning(response["warnings"][0].replace("MFU", "mfu")) is None
    # fp16 shares the 16-bit row; a GPU without a published row gets no such warning
    assert load_job_checks().best_for("a100-sxm-40gb", "fp16").mfu == 0.563
    assert load_job_checks().best_for("mi300x", "bf16") is None


def test_a_gpu_with_no_published_run_is_held_to_its_generations_best(client: TestClient) -> None:
    """H200 has no published run in the calibration set: its plans face the H100's 49.4% (same
    generation); a generation with no run at all (CDNA3) gets no such warning."""
    checks = load_job_checks()
    assert checks.best_for("h200-sxm-141gb", "bf16") is None
    assert checks.best_among(frozenset({"h100-sxm-80gb", "h200-sxm-141gb"}), "bf16").mfu == 0.4943
    assert checks.best_among(frozenset({"mi300x", "mi325x"}), "bf16") is None
    job = {
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "gpu": "h200-sxm-141gb", "num_gpus": 64},
    }
    layout = {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 3, "recompute": "none"}
    response = client.post("/compare", json={**job, "layouts": [layout, {**layout, "tp": 8}]}).json()
    mfus = [e["plan"]["mfu"] for e in response["entries"]]
    assert mfus[0] > 0.4943
    warning = next(w for w in response["warnings"] if w.startswith("layout 0: predicted MFU"))
    assert warning == (
        f"layout 0: predicted MFU {100 * mfus[0]:.1f}% is above the best published on hopper GPUs at bf16 "
        "(49.4%, Megatron-LM README, Megatron-Core r0.8.0: GPT 16B on 192 H100, on h100-sxm-80gb; none is "
        "published on h200-sxm-141gb): treat the prediction as an upper estimate"
    )


def test_mfu_above_the_best_published_for_the_moe_model_shape(client: TestClient) -> None:
    """An MoE job of a published model's shape (Qwen3-235B-A22B on H100 in bf16 at 4,096 tokens:
    the ModelZoo's best, 27.9% in the planner's own FLOP count) is held to that model's best run,
    well below the GPU's best (49.4%, a dense model); a dense job keeps the GPU's bound."""
    job = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 2048},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    }
    slow = {"tp": 4, "pp": 8, "vpp": 4, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}
    fast = {"tp": 1, "pp": 1, "ep": 4, "micro_batch_size": 4, "zero_stage": 3, "recompute": "full"}
    response = client.post("/compare", json={**job, "layouts": [slow, fast]}).json()
    mfus = [e["plan"]["mfu"] for e in response["entries"]]
    assert mfus[0] < 0.279 < mfus[1] < 0.494
    [warning] = response["warnings"]
    assert warning.startswith(f"layout 1: predicted MFU {100 * mfus[1]:.1f}% is above the best published for this")
    assert "model's shape on h100-sxm-80gb at bf16 and 4,096 tokens (27.9%, Qwen3-235B-A22B on 256 GPUs" in warning
    # another sequence length has no run of its own: the GPU's bound applies, which neither passes
    longer = {**job, "training": {"seq_len": 8192, "global_batch_size": 1024}}
    assert not client.post("/compare", json={**longer, "layouts": [slow, fast]}).json()["warnings"]


def test_a_dense_model_is_held_to_the_gpus_bound_only(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with a per-shape entry for it, a dense model's plans are held to the GPU's best: the
    per-shape bound is for MoE models."""
    gpt = {"model": {"preset": "gpt3-175b"}, "training": {"seq_len": 2048, "global_batch_size": 1536},
           "cluster": {"preset": "dgx-a100", "num_gpus": 1024}}  # fmt: skip
    shape = model_mfu.model_shape(PlanRequest.model_validate({**gpt, "search": {}}).model)
    low = model_mfu.ModelBest("GPT-3 175B", shape, ("a100-sxm-80gb",), "16-bit", 0.10, "x", 64, 2048, "test")
    monkeypatch.setattr(model_mfu, "load_model_bests", lambda: (low,))
    layout = {"tp": 8, "pp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"}
    dense = client.post("/compare", json={**gpt, "layouts": [layout, {**layout, "recompute": "full"}]}).json()
    mfus = [e["plan"]["mfu"] for e in dense["entries"]]
    assert 0.10 < min(mfus) and max(mfus) < 0.563 and not dense["warnings"]
    # an MoE model's entry is read (the same patched table, a Mixtral shape)
    moe = PlanRequest.model_validate({**gpt, "model": {"preset": "mixtral-8x7b"}, "search": {}}).model
    entry = model_mfu.ModelBest("M", model_mfu.model_shape(moe), ("a100-sxm-80gb",), "16-bit", 0.1, "y", 8, 2048, "t")
    monkeypatch.setattr(model_mfu, "load_model_bests", lambda: (entry,))
    assert model_mfu.best_for_model(moe, "a100-sxm-80gb", "bf16", 2048) is entry


def test_best_published_mfus_per_model_shape_are_the_calibration_rows() -> None:
    """model_mfu.toml holds the best MFU of each MoE model shape, GPU, precision and sequence length
    in the calibration set, each run's measured tokens/s in the planner's own FLOP count: Qwen3-235B-A22B
    at 4,096 tokens on H100 in bf16 is the ModelZoo's best (1,862 tokens/s a GPU, 27.9%), its
    128k-token run 39.3%."""
    assert job_checks.model_mismatches() == []
    qwen = PlanRequest.model_validate(
        {**_job(2048, 256, 4096, "qwen3-235b-a22b"), "training": {"seq_len": 4096, "global_batch_size": 2048}}
    ).model
    best = model_mfu.best_for_model(qwen, "h800-sxm-80gb", "bf16", 4096)
    assert best.run == "modelzoo-qwen3-235b-256gpu-cfg2"  # cfg3 ran 1,862 too: the smaller id
    assert best.mfu == pytest.approx(0.279, abs=5e-4)
    assert model_mfu.best_for_model(qwen, "h100-sxm-80gb", "bf16", 131072).mfu == pytest.approx(0.3933, abs=5e-4)
    assert model_mfu.best_for_model(qwen, "h100-sxm-80gb", "fp8", 4096).precision == "fp8"
    assert model_mfu.best_for_model(qwen, "a100-sxm-80gb", "bf16", 4096) is None
    assert model_mfu.best_for_model(qwen, "h100-sxm-80gb", "bf16", 8192) is None
    # the planner's FLOP count: one row's table entry is its measured throughput as a plan's MFU
    mapped = {mr.id: mr for mr in job_checks.map_all()[0]}
    assert job_checks.planner_mfu(mapped[best.run]) == pytest.approx(best.mfu, abs=5e-5)


def test_best_published_mfus_are_the_calibration_rows() -> None:
    """job_checks.toml's [[best]] tables are the best MFU per GPU and precision of the calibration
    set (benchmarks/job_checks.py), each with its source, and agree with what the sources print."""
    assert job_checks.mismatches() == []
    best = {(b.gpus[0], b.precision): b for b in job_checks.best_published()}
    assert {key: (b.run, b.mfu) for key, b in best.items()} == {
        ("a100-sxm-80gb", "16-bit"): ("korthikanti-1T-seqsel", 0.563),
        ("h100-sxm-80gb", "16-bit"): ("megatron-core-h100-weak-16B", 0.4943),  # 489.1 / 989.4
        ("h100-sxm-80gb", "fp8"): ("nemo2407-gpt3-175b-512gpu", 0.4487),  # 888 / 1,978.9
        ("gb200", "fp8"): ("mbridge-26.04.01-llama3-70b-gb200-64gpu-fp8", 0.3784),  # 1,892 / 5,000
        ("b200", "fp8"): ("mbridge-26.04.01-qwen3-235b-b200-256gpu-mxfp8", 0.1244),  # 560 / 4,500
    }
    runs = {r["id"]: r for r in json.loads(RUNS.read_text())}
    for entry in load_job_checks().best_mfu:
        assert entry.source and entry.cite and entry.kind
        printed = runs[entry.run]["measured"]["mfu"]
        assert printed is None or abs(entry.mfu - printed) < 0.005  # the source's rounding and peak
    # hardware FLOPs (recompute counted) are no MFU: the SC'21 PTD-P 530B run's 171 TFLOP/s is left out
    assert job_checks.row_mfu(runs["sc21-t2-ptd-530B-560gpu"]) is None


def test_model_bests_do_not_depend_on_the_rows_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact ties (the ModelZoo's cfg2 and cfg3 both ran 1,861.8 tokens/s a GPU) go to the smaller
    id, so the table is the same whatever order the calibration rows come in."""
    mapped, skipped = job_checks.map_all()
    forward = job_checks.model_bests()
    monkeypatch.setattr(job_checks, "map_all", lambda: (list(reversed(mapped)), skipped))
    assert job_checks.model_bests() == forward
    assert job_checks.model_mismatches() == []


def test_an_moe_model_on_a_gpu_with_no_run_is_held_to_its_shapes_best_on_the_generation() -> None:
    """Qwen3-235B-A22B's own bound (27.9% on H100, 4,096 tokens) holds its H200 plans too, not the
    dense 49.4% it would otherwise fall back to."""
    from optimizer.service import plan

    body = {"model": {"preset": "qwen3-235b-a22b"}, "training": {"seq_len": 4096, "global_batch_size": 2048},
            "cluster": {"preset": "dgx-h100", "gpu": "h200-sxm-141gb", "num_gpus": 256}, "search": {"top_k": 1}}  # fmt: skip
    answer = plan(PlanRequest.model_validate(body))
    mfu = answer.plans[0].mfu
    assert 0.279 < mfu < 0.4943
    assert any(w.startswith(f"predicted MFU {100 * mfu:.1f}% is above the best published for this model's shape on "
                            "hopper GPUs at bf16 and 4,096 tokens (27.9%") for w in answer.warnings), answer.warnings  # fmt: skip
