"""Presets: the `hgx-h800` cluster and the `llama3.1-8b` / `llama3.1-70b` models."""

from __future__ import annotations

import pytest

from hardware_catalog import load_catalog
from optimizer.params import count_params
from optimizer.presets import load_model_presets
from optimizer.service import search_plans
from optimizer.specs import ClusterSpec, ModelSpec, PlanRequest


@pytest.mark.parametrize(("preset", "published"), [("llama3.1-8b", 8.03e9), ("llama3.1-70b", 70.6e9)])
def test_llama31_parameter_counts_within_two_percent(preset: str, published: float) -> None:
    entry = load_model_presets()[preset]
    assert entry.published_total_params == published
    total = count_params(ModelSpec(preset=preset)).total
    assert abs(total - published) / published <= 0.02
    assert "huggingface.co/meta-llama/Llama-3.1" in entry.source


def test_llama31_8b_is_llama3_8b_architecture() -> None:
    presets = load_model_presets()
    a, b = ModelSpec(preset="llama3.1-8b").architecture(), ModelSpec(preset="llama3-8b").architecture()
    assert {k: v for k, v in a.items() if k != "name"} == {k: v for k, v in b.items() if k != "name"}
    assert count_params(ModelSpec(preset="llama3.1-8b")).total == pytest.approx(8.03e9, rel=0.001)
    assert presets["llama3.1-70b"].num_layers == 80


def test_hgx_h800_cluster() -> None:
    entry = load_catalog().clusters["hgx-h800"]
    assert (entry.gpu, entry.gpus_per_node, entry.nvlink_domain_size, entry.network, entry.nics_per_node) == (
        "h800-sxm-80gb",
        8,
        8,
        "ib-ndr-400",
        8,
    )
    assert [t.name for t in entry.tiers] == ["nvlink", "leaf", "spine"] and entry.tiers[1].span_gpus == 256
    assert "arXiv:2505.09343" in entry.source
    spec = ClusterSpec(preset="hgx-h800", num_gpus=2048)
    assert (spec.gpu, spec.leaf_span_gpus) == ("h800-sxm-80gb", 256)


def test_llama31_70b_plans_on_hgx_h800_no_faster_than_on_dgx_h100() -> None:
    """Same GH100 compute, same fabric; H800's NVLink is cut to 200 GB/s a direction (450 on H100)."""

    def best(cluster: str):
        response = search_plans(PlanRequest.model_validate({
            "model": {"preset": "llama3.1-70b"},
            "training": {"seq_len": 8192, "global_batch_size": 256},
            "cluster": {"preset": cluster, "num_gpus": 256},
            "search": {"top_k": 1},
        }))  # fmt: skip
        assert response.status == "optimal" and response.plans[0].fits_memory
        return response.plans[0]

    h800, h100 = best("hgx-h800"), best("dgx-h100")
    assert h800.step_time_s >= h100.step_time_s
