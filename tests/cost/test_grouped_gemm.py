"""The grouped expert GEMM term (``optimizer/cost/grouped_gemm.py``): the measured curve against
the DeepGEMM table it comes from, a hand-computed expert GEMM, and invariants."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.cost import build_context
from optimizer.cost.grouped_gemm import (
    expert_gemm_host_s,
    grouped_gemm_gpu_s,
    load_m_curve,
    m_efficiency,
    parse_m_curve,
)
from optimizer.cost.layer import Dims, expert_gemm_times_s
from optimizer.specs import JobSpec

# DeepGEMM README @55ab91f7 (H800, FP8): TFLOP/s by m per group for the two MoE shapes
# (n, k) = (4096, 7168) and (7168, 2048); the largest-m rows (8192) are 1346 and 1214.
M256 = (932 / 1346 + 815 / 1214) / 2  # 0.681878
M512 = (1040 / 1346 + 916 / 1214) / 2  # 0.763595
M1024 = (1233 / 1346 + 925 / 1214) / 2  # 0.838996


def _qwen3_235b_job(**training: object) -> JobSpec:
    """Qwen3-235B-A22B's MoE block (128 experts, top-8, expert FFN 1536, hidden 4096) on H100."""
    return JobSpec.model_validate({
        "model": {
            "name": "qwen3-235b-moe-block", "num_layers": 4, "hidden_size": 4096, "num_attention_heads": 64,
            "num_kv_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 1536},
        },
        "training": {"seq_len": 4096, "global_batch_size": 256, **training},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    })  # fmt: skip


def test_curve_points_are_the_source_table_relative_to_large_m() -> None:
    curve = load_m_curve()
    assert curve.m == (256.0, 512.0, 1024.0, 4096.0, 8192.0)
    assert curve.efficiency == pytest.approx((M256, M512, M1024, 1.0, 1.0), abs=1e-9)
    assert M512 == pytest.approx(0.763595, abs=1e-6)


def test_efficiency_hand_computed_between_and_beyond_the_measured_points() -> None:
    assert m_efficiency(512) == pytest.approx(M512)
    # log-linear: 512 * sqrt(2) is half-way between 512 and 1024
    assert m_efficiency(512 * 2**0.5) == pytest.approx((M512 + M1024) / 2)  # 0.801295
    assert m_efficiency(2048) == pytest.approx((M1024 + 1.0) / 2)  # 0.919498
    # below the table, the dense curve's m factor (gemm_dim_half 96) down from the 256-row value
    assert m_efficiency(128) == pytest.approx(M256 * (128 / 224) / (256 / 352))  # 0.535762
    assert m_efficiency(1e6) == 1.0
    assert m_efficiency(0) == 0.0


def test_parse_normalises_each_shape_by_its_largest_m_then_averages() -> None:
    doc = {
        "m_curve": [
            {"table": "t", "n": 1, "k": 1, "m_per_group": 100, "flops": {"value": 50.0}},
            {"table": "t", "n": 1, "k": 1, "m_per_group": 400, "flops": {"value": 100.0}},
            {"table": "t", "n": 2, "k": 2, "m_per_group": 100, "flops": {"value": 30.0}},
            {"table": "t", "n": 2, "k": 2, "m_per_group": 400, "flops": {"value": 40.0}},
            {"table": "other", "n": 1, "k": 1, "m_per_group": 100, "flops": {"value": 1.0}},
        ]
    }
    curve = parse_m_curve(doc, "t")
    assert curve.m == (100.0, 400.0)
    assert curve.efficiency == pytest.approx(((0.5 + 0.75) / 2, 1.0))
    with pytest.raises(ValueError, match="no m_curve rows"):
        parse_m_curve(doc, "missing")


def test_every_number_in_the_data_file_has_a_source_and_a_kind() -> None:
    doc = tomllib.loads(resources.files("optimizer").joinpath("data/grouped_gemm.toml").read_text())
    facts = [r["flops"] for r in doc["m_curve"]]
    facts += [r[key] for r in doc["large_m"] for key in ("time_s", "flops")]
    facts += list(doc["host"].values())
    assert len(facts) == 10 + 8 + 4
    for fact in facts:
        assert fact["source"]
        assert fact["kind"] in {"measured", "derived", "code"}


def test_qwen3_235b_expert_gemms_hand_computed() -> None:
    """TP4 EP8, micro-batch 1 (the ModelZoo layout with 512 tokens per expert GEMM): 1,024 tokens
    per GPU x top-8 = 8,192 routed copies over 16 local experts. Forward fc1 + fc2 FLOPs:
    2 x 8192 x 3 x 4096 x 1536 = 3.092e11 at n = 4096, k = 1536 x 3 / 2 = 2304 per expert;
    the host issues 2 x 16 GEMMs at 70 us = 2.24 ms, more than the GPU needs."""
    ctx = build_context(_qwen3_235b_job())
    kind = next(k for k in ctx.kinds if k.is_moe)
    gpu, host = expert_gemm_times_s(ctx, kind, Dims(4, 1, 8, 1, True, "none"))
    flops = 2 * 8192 * 3 * 4096 * 1536
    assert flops == pytest.approx(3.092e11, rel=1e-3)
    rate = ctx.gemm_peak_flops * ctx.gemm_efficiency * M512 * (4096 / (4096 + 96)) * (2304 / (2304 + 96))
    assert gpu == pytest.approx(flops / rate)
    assert host == pytest.approx(2 * 16 * 70e-6)
    assert host > gpu  # host bound: the step the ModelZoo measured for this layout


def test_host_term_is_zero_without_host_splits() -> None:
    ctx = build_context(_qwen3_235b_job(expert_gemm_host_splits=False))
    assert expert_gemm_host_s(ctx, 16) == 0.0
    kind = next(k for k in ctx.kinds if k.is_moe)
    assert expert_gemm_times_s(ctx, kind, Dims(4, 1, 8, 1, True, "none"))[1] == 0.0


@settings(max_examples=200, deadline=None)
@given(a=st.floats(1.0, 1e6), b=st.floats(1.0, 1e6))
def test_efficiency_is_non_decreasing_in_tokens_per_expert(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert 0.0 < m_efficiency(lo) <= m_efficiency(hi) + 1e-12 <= 1.0 + 1e-12


@settings(max_examples=100, deadline=None)
@given(routed=st.floats(256.0, 1e6), experts=st.integers(1, 64), more=st.integers(1, 64))
def test_more_local_experts_at_equal_tokens_are_never_faster(routed: float, experts: int, more: int) -> None:
    """The same routed copies on a GPU over more local experts: fewer tokens per expert GEMM and
    more GEMMs for the host to issue; neither side gets faster."""
    ctx = build_context(_qwen3_235b_job())
    flops = 2 * routed * 3 * 4096 * 1536

    def times(local: int) -> tuple[float, float]:
        return grouped_gemm_gpu_s(ctx, flops, routed / local, 4096, 2304), expert_gemm_host_s(ctx, local)

    few, many = times(experts), times(experts + more)
    assert many[0] >= few[0] * (1 - 1e-12)
    assert many[1] > few[1]
