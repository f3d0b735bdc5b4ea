"""The plans' 80% error bands: class lookup, ranges on real plans, and the fit and
leave-one-source-out coverage of ``benchmarks/error_bands.py`` on hand-counted residuals."""

from __future__ import annotations

import math
import sys
import tomllib
from pathlib import Path
from types import MappingProxyType

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from jobs import LLAMA3_70B_ON_1024_H100, job_copy

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.calibration_rows import load_rows
from benchmarks.error_bands import (
    DATA_OUT,
    HeldOut,
    Residual,
    coverage_by,
    fit_bands,
    leave_one_source_out,
    quantile_pair,
    residuals_from,
)
from benchmarks.validation import run_validation
from optimizer import service
from optimizer.error_bands import (
    ANY,
    ROOT_CLASS,
    BandClass,
    ErrorBand,
    ErrorBands,
    band_class,
    load_error_bands,
    parse_error_bands,
    plan_ranges,
)
from optimizer.specs import EvaluateRequest, JobSpec, PlanRequest

DENSE_H100_BF16 = job_copy(
    LLAMA3_70B_ON_1024_H100, config={"tp": 8, "pp": 4, "vpp": 5, "zero_stage": 1, "recompute": "selective"}
)
MOE_B200_FP8 = {
    "model": {"preset": "qwen3-235b-a22b"},
    "training": {"seq_len": 4096, "global_batch_size": 2048, "precision": "fp8"},
    "cluster": {"preset": "dgx-b200", "num_gpus": 256},
    "config": {"tp": 1, "pp": 8, "ep": 32, "zero_stage": 1, "recompute": "selective"},
}

DHB = BandClass("dense", "hopper", "16-bit")
MBF = BandClass("moe", "blackwell", "fp8-class")


def _job(doc: dict) -> JobSpec:
    return JobSpec(model=doc["model"], training=doc["training"], cluster=doc["cluster"])


# ---------------------------------------------------------------------------------------- classes


def test_class_of_dense_h100_bf16_and_moe_b200_fp8() -> None:
    assert band_class(_job(DENSE_H100_BF16)) == DHB
    assert band_class(_job(MOE_B200_FP8)) == MBF
    a100_fp16 = {**DENSE_H100_BF16, "training": {**DENSE_H100_BF16["training"], "precision": "fp16"},
                 "cluster": {"preset": "dgx-a100", "num_gpus": 1024}}  # fmt: skip
    assert band_class(_job(a100_fp16)) == BandClass("dense", "ampere", "16-bit")
    gb300_fp4 = {**MOE_B200_FP8, "training": {**MOE_B200_FP8["training"], "precision": "fp4"},
                 "cluster": {"preset": "gb300-nvl72", "num_gpus": 288}}  # fmt: skip
    assert band_class(_job(gb300_fp4)) == MBF  # Blackwell Ultra and FP4 band with Blackwell FP8


def _bands(*bands: ErrorBand, generations: tuple[str, ...] = ("hopper",)) -> ErrorBands:
    return ErrorBands(MappingProxyType({b.cls: b for b in bands}), 0.1, 0.9, 10, generations, 0.8)


def test_lookup_walks_to_the_nearest_parent() -> None:
    root = ErrorBand(ROOT_CLASS, 100, -0.2, 0.1)
    dense = ErrorBand(BandClass("dense", ANY, ANY), 80, -0.1, 0.1)
    own = ErrorBand(DHB, 20, -0.05, 0.03)
    moe = ErrorBand(BandClass("moe", ANY, ANY), 20, -0.5, 0.1)
    bands = _bands(root, dense, own, moe)
    assert bands.lookup(DHB) is own
    assert bands.lookup(MBF) is moe
    assert bands.lookup(BandClass("dense", "blackwell", "fp8-class")) is dense
    assert _bands(root).lookup(MBF) is root


def test_shipped_bands_for_the_two_jobs() -> None:
    bands = load_error_bands()
    assert ROOT_CLASS in bands.bands
    for doc, cls in ((DENSE_H100_BF16, DHB), (MOE_B200_FP8, MBF)):
        r = plan_ranges(_job(doc), 2.0, 1000.0)
        assert r.band.cls in cls.lineage()
        # the band is that of the first class in the lineage with one of its own
        assert r.band.cls == next(c for c in cls.lineage() if c in bands.bands)
        # a plan on a generation without calibration rows says so
        assert (r.note is None) == (cls.generation in bands.generations)
    assert plan_ranges(_job(DENSE_H100_BF16), 2.0, 1000.0).band.cls.kind == "dense"


# ---------------------------------------------------------------------------------------- ranges


@pytest.mark.parametrize("doc", [DENSE_H100_BF16, MOE_B200_FP8], ids=["dense-h100-bf16", "moe-b200-fp8"])
def test_evaluate_ranges_bracket_the_prediction(doc: dict) -> None:
    plan = service.evaluate(EvaluateRequest(**doc))
    assert plan.tokens_per_s_per_gpu_range is not None and plan.step_time_s_range is not None
    t_lo, t_hi = plan.tokens_per_s_per_gpu_range
    s_lo, s_hi = plan.step_time_s_range
    assert t_lo <= plan.tokens_per_s_per_gpu <= t_hi
    assert s_lo <= plan.step_time_s <= s_hi
    assert t_lo < t_hi and s_lo < s_hi
    # step = tokens per step / (throughput x GPUs) at both ends
    tokens_per_step = plan.tokens_per_s * plan.step_time_s
    n = doc["cluster"]["num_gpus"]
    assert s_lo == pytest.approx(tokens_per_step / (t_hi * n), rel=1e-9)
    assert s_hi == pytest.approx(tokens_per_step / (t_lo * n), rel=1e-9)
    # the factors are the shipped band's, clamped to bracket 1
    band = plan_ranges(_job(doc), plan.step_time_s, plan.tokens_per_s_per_gpu).band
    assert t_lo / plan.tokens_per_s_per_gpu == pytest.approx(math.exp(min(band.log_low, 0.0)), rel=1e-9)
    assert t_hi / plan.tokens_per_s_per_gpu == pytest.approx(math.exp(max(band.log_high, 0.0)), rel=1e-9)


def test_clamped_band_keeps_the_prediction_inside() -> None:
    """A class whose runs were all slower than predicted: the high end is the prediction."""
    slow = ErrorBand(DHB, 12, -0.3, -0.1)
    lo, hi = slow.throughput_factors
    assert lo == pytest.approx(math.exp(-0.3)) and hi == 1.0
    assert slow.covers(0.0) and slow.covers(-0.3) and not slow.covers(-0.31) and not slow.covers(0.01)


def test_plan_results_carry_ranges() -> None:
    req = PlanRequest(
        model={"preset": "llama3-8b"},
        training={"seq_len": 4096, "global_batch_size": 256, "precision": "bf16"},
        cluster={"preset": "dgx-h100", "num_gpus": 16},
        search={"top_k": 2, "time_limit_s": 10},
    )
    resp = service.plan(req)
    assert resp.plans
    for p in resp.plans:
        t_lo, t_hi = p.tokens_per_s_per_gpu_range
        s_lo, s_hi = p.step_time_s_range
        assert t_lo <= p.tokens_per_s_per_gpu <= t_hi and s_lo <= p.step_time_s <= s_hi
        assert s_lo * t_hi == pytest.approx(p.step_time_s * p.tokens_per_s_per_gpu, rel=1e-9)
    assert "tokens_per_s_per_gpu_range" in resp.plans[0].model_dump(mode="json")


# ---------------------------------------------------------------------------------------- fit


def _res(source: str, value: float, cls: BandClass = DHB, i: int = 0) -> Residual:
    return Residual(f"{source}-{i}-{value}", source, cls, value)


def test_quantiles_are_split_conformal_order_statistics() -> None:
    """n = 10: the floor(11 x 0.1) = 1st and ceil(11 x 0.9) = 10th smallest (the extremes; numpy's
    interpolated percentiles would be 1.9 and 9.1); n = 20: the 2nd and 19th."""
    assert quantile_pair([float(v) for v in range(10, 0, -1)]) == (1.0, 10.0)
    assert quantile_pair([float(v) for v in range(1, 21)]) == (2.0, 19.0)
    assert quantile_pair([3.0]) == (3.0, 3.0)


def test_fit_merges_small_classes_into_parents() -> None:
    rows = [_res("a", v) for v in (-0.1, 0.0, 0.2)] + [_res("b", 0.4, MBF)]
    bands = fit_bands(rows, min_rows=3)
    # dense / hopper / 16-bit and its two dense parents have 3 rows each; the MoE row only the root
    assert set(bands) == {DHB, BandClass("dense", "hopper", ANY), BandClass("dense", ANY, ANY), ROOT_CLASS}
    # sorted (-0.1, 0.0, 0.2), n = 3: the floor(0.4) -> 1st and ceil(3.6) = 4th -> 3rd smallest
    assert bands[DHB].log_low == pytest.approx(-0.1) and bands[DHB].log_high == pytest.approx(0.2)
    # root: (-0.1, 0.0, 0.2, 0.4), n = 4: floor(0.5) -> 1st, ceil(4.5) = 5th -> 4th smallest
    assert bands[ROOT_CLASS].rows == 4
    assert bands[ROOT_CLASS].log_low == pytest.approx(-0.1) and bands[ROOT_CLASS].log_high == pytest.approx(0.4)


def test_leave_one_source_out_coverage_matches_a_hand_count() -> None:
    rows = [_res("a", -0.1), _res("a", 0.0), _res("b", 0.1), _res("b", 0.2), _res("c", 0.5)]
    held = leave_one_source_out(rows, min_rows=2)
    # n = 3: the 1st and 3rd smallest; n = 4: the 1st and 4th
    # without a: (0.1, 0.2, 0.5) -> [0.1, 0.5], clamped [0, 0.5]: -0.1 out, 0.0 in
    # without b: (-0.1, 0.0, 0.5) -> [-0.1, 0.5]: 0.1 and 0.2 in
    # without c: (-0.1, 0.0, 0.1, 0.2) -> [-0.1, 0.2]: 0.5 out
    got = {h.residual.id: h.covered for h in held}
    assert got == {"a-0--0.1": False, "a-0-0.0": True, "b-0-0.1": True, "b-0-0.2": True, "c-0-0.5": False}
    by_source = coverage_by(held, lambda h: h.residual.source)
    assert [(k, c.covered, c.n) for k, c in by_source.items()] == [("a", 1, 2), ("b", 2, 2), ("c", 0, 1)]
    total = coverage_by(held, lambda h: "all")["all"]
    assert (total.covered, total.n) == (3, 5) and total.fraction == pytest.approx(0.6)
    band_b = next(h for h in held if h.residual.source == "b").band
    assert (band_b.log_low, band_b.log_high) == pytest.approx((-0.1, 0.5))


def test_held_out_rows_use_the_parent_when_their_class_is_left_too_small() -> None:
    rows = [_res("a", 0.0, MBF), _res("b", 0.3, MBF), _res("c", -0.05), _res("c", 0.05)]
    held: list[HeldOut] = leave_one_source_out(rows, min_rows=2)
    moe_a = next(h for h in held if h.residual.source == "a")
    assert moe_a.band.cls == ROOT_CLASS  # one MoE row left without a: the root band
    assert moe_a.band.rows == 3


# ---------------------------------------------------------------------------------------- file


def test_parse_rejects_a_file_without_the_root_band() -> None:
    data = {"meta": {"quantile_low": 0.1, "quantile_high": 0.9, "min_rows": 10, "generations": [],
                     "loso_coverage": 0.8},
            "band": [{"kind": "dense", "generation": "*", "precision": "*", "rows": 10, "log_low": -0.1,
                      "log_high": 0.1}]}  # fmt: skip
    with pytest.raises(ValueError, match="no band for all runs"):
        parse_error_bands(data)


def test_shipped_file_is_the_fit_of_the_current_cost_model() -> None:
    """``make bands`` was rerun after the last change to the cost model or the calibration rows."""
    raw = load_rows()
    fresh = fit_bands(residuals_from(run_validation(rows=raw), raw))
    shipped = parse_error_bands(tomllib.loads(DATA_OUT.read_text(encoding="utf-8")))
    assert set(shipped.bands) == set(fresh), "rerun `make bands`"
    for cls, band in fresh.items():
        got = shipped.bands[cls]
        assert (got.rows, got.log_low, got.log_high) == pytest.approx(
            (band.rows, band.log_low, band.log_high), abs=2e-6
        ), f"{cls.label}: rerun `make bands`"
    assert 0.70 <= shipped.coverage <= 0.90


def test_cli_evaluate_table_shows_the_ranges() -> None:
    from api import cli

    plan = service.evaluate(EvaluateRequest(**DENSE_H100_BF16))
    (t_lo, t_hi), (s_lo, s_hi) = plan.tokens_per_s_per_gpu_range, plan.step_time_s_range
    line = next(x for x in cli.evaluate_table(plan).splitlines() if x.startswith("80% range"))
    assert line == f"80% range: tokens/s per GPU {t_lo:,.0f} - {t_hi:,.0f}  step_s {s_lo:.3f} - {s_hi:.3f}"


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.floats(-1.0, 1.0, allow_nan=False)), min_size=2, max_size=30)
)
def test_leave_one_source_out_agrees_with_a_brute_force_count(rows: list[tuple[str, float]]) -> None:
    """One class (min_rows 1): each row is covered when it lies in the clamped 10-90% split-conformal
    range of the other sources' values (their floor((n+1)/10)-th and ceil(9(n+1)/10)-th smallest),
    counted here directly."""
    residuals = [_res(src, v, i=i) for i, (src, v) in enumerate(rows)]
    held = {h.residual.id: h.covered for h in leave_one_source_out(residuals, min_rows=1)}
    for r in residuals:
        others = np.array([o.log_ratio for o in residuals if o.source != r.source])
        if others.size == 0:
            assert r.id not in held
            continue
        ordered, n = np.sort(others), others.size
        low, high = ordered[max(1, int(np.floor((n + 1) * 0.1))) - 1], ordered[min(n, int(np.ceil((n + 1) * 0.9))) - 1]
        lo, hi = min(low, 0.0), max(high, 0.0)
        assert held[r.id] == (lo <= r.log_ratio <= hi)
