"""The calibration-set mapping (benchmarks/calibration_rows.py) and the validation run.

The median target, no predicted out-of-memory for runs that happened, and a set of headline rows
are asserted here; the full gate, including the p90 target the model does not meet yet, is
``benchmarks/validation.py --check``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.calibration_rows import (
    Unmappable,
    account_for_embedding_and_loss_split,
    load_rows,
    map_all,
    map_row,
    source_flops_per_token,
)
from benchmarks.validation import ValidationReport, evaluate_row, pairwise_agreement, run_validation, spearman
from optimizer.calibration import DEFAULT
from optimizer.cost import best_estimate, build_context, resolve_layout
from optimizer.specs import EvaluateRequest, Layout, TrainingSpec


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {r["id"]: r for r in load_rows()}


@pytest.fixture(scope="module")
def default_report() -> ValidationReport:
    """The shipped calibration scored once for the tests of this module that read it."""
    return run_validation(DEFAULT)


def test_data_copy_is_self_contained() -> None:
    assert len(load_rows()) == 113


def test_megatron_weak_scaling_row(rows) -> None:
    m = map_row(rows["megatron-core-h100-weak-177B"])
    model, training, cluster = m.job.model, m.job.training, m.job.cluster
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (96, 12288, 96)
    assert model.num_kv_heads == 96  # null -> MHA
    assert model.activation == "gelu" and model.ffn_hidden_size == 4 * 12288
    assert model.vocab_size == 131072
    assert (training.seq_len, training.global_batch_size, training.precision) == (4096, 1152, "bf16")
    assert (cluster.gpu, cluster.network, cluster.nics_per_node, cluster.num_gpus) == (
        "h100-sxm-80gb",
        "ib-ndr-400",
        8,
        2304,
    )
    assert m.fixed["tp"] == 8 and m.fixed["pp"] == 6 and m.fixed["dp"] == 48
    assert m.fixed["sequence_parallel"] is True
    # unstated knobs are searched
    assert m.grid["micro_batch_size"] == (1, 2, 4)
    assert m.grid["recompute"] == ("none", "selective", "full")
    assert m.grid["vpp"] == (1, 2, 4, 8)  # divisors of 96/6 up to 8
    assert m.grid["zero_stage"] == (1,)
    # measured: model TFLOP/s / 72 L h^2 (1 + s/6h + V/12Lh) per token
    L, h, s, V = 96, 12288, 4096, 131072
    per_token = 72 * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert m.measured_tokens_per_s_per_gpu == pytest.approx(432.8e12 / per_token, rel=1e-9)
    assert m.measurement.startswith("TFLOP/s")
    assert len(m.layouts()) == 3 * 3 * 4
    assert isinstance(m.request(m.layouts()[0]), EvaluateRequest)


def test_sc21_ptd_row(rows) -> None:
    m = map_row(rows["sc21-t2-ptd-175B-384gpu"])
    assert m.job.cluster.gpu == "a100-sxm-80gb" and m.job.cluster.network == "ib-hdr-200"
    assert m.job.training.precision == "fp16"
    assert m.gpu_class == "A100" and m.kind == "dense"
    assert m.fixed["recompute"] == "full"  # "full (inferred)"
    assert m.fixed["micro_batch_size"] == 1
    assert m.fixed["sequence_parallel"] is False  # 2021 stack: no sequence parallelism
    assert "recompute" not in m.grid and "micro_batch_size" not in m.grid
    # hardware FLOPs with recompute: 96 L h^2 (1 + s/6h + V/16Lh) per token
    L, h, s, V = 96, 12288, 2048, 51200
    per_token = 96 * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert m.measured_tokens_per_s_per_gpu == pytest.approx(153e12 / per_token, rel=1e-9)


def test_zero3_row_pins_zero_stage(rows) -> None:
    m = map_row(rows["sc21-t2-zero3-175B-768gpu"])
    assert m.fixed["zero_stage"] == 3 and m.fixed["dp"] == 768 and m.grid == {}


def test_qwen3_moe_row(rows) -> None:
    m = map_row(rows["modelzoo-qwen3-235b-256gpu-cfg3"])
    model = m.job.model
    assert model.moe is not None
    assert (model.moe.num_experts, model.moe.top_k, model.moe.expert_ffn_hidden_size) == (128, 8, 1536)
    moe = model.moe
    assert (moe.num_shared_experts, moe.layer_frequency, moe.first_dense_layers) == (0, 1, 0)
    assert model.head_dim == 128 and model.num_kv_heads == 4 and model.activation == "swiglu"
    assert model.tied_embeddings is False
    assert m.kind == "moe"
    assert m.fixed["zero_stage"] == 3  # fsdp "on"
    assert (m.fixed["tp"], m.fixed["ep"], m.fixed["dp"], m.fixed["micro_batch_size"]) == (2, 8, 128, 4)
    assert m.fixed["recompute"] == "full"
    assert m.measured_tokens_per_s_per_gpu == pytest.approx(1861.8)
    assert m.measurement == "tokens/s/GPU"


def test_moe_block_recompute_row_fits_where_selective_does_not(rows) -> None:
    """Megatron "selective (layernorm, moe)" recomputes the whole MoE block; the 16k-token Qwen3
    run keeps ~57 GiB per GPU that way (the re-run block brings its routed copies back), while keeping the routed-expert activations would not fit."""
    m = map_row(rows["modelzoo-qwen3-235b-256gpu-seq16k"])
    assert m.fixed["recompute"] == "moe"
    assert map_row(rows["modelzoo-qwen3-235b-256gpu-cfg1"]).fixed["recompute"] == "selective"  # (norm, act)
    ctx = build_context(m.job, DEFAULT)
    config = {k: v for k, v in m.fixed.items() if k != "dp"}
    peak = {}
    for rc in ("selective", "moe", "full"):
        lay = resolve_layout(m.job, Layout(**{**config, "micro_batch_size": 1, "zero_stage": 1, "recompute": rc}))
        peak[rc] = best_estimate(ctx, lay)
    assert not peak["selective"].fits_memory
    assert peak["moe"].fits_memory
    assert peak["moe"].peak_memory_bytes / 2**30 == pytest.approx(57.0, abs=1.0)
    assert peak["full"].peak_memory_bytes < peak["moe"].peak_memory_bytes
    assert peak["full"].step_time_s > peak["moe"].step_time_s > peak["selective"].step_time_s


def test_torchtitan_rows(rows) -> None:
    m = map_row(rows["torchtitan-llama31-8b-8gpu-fsdp-compile-float8"])
    assert m.job.cluster.gpu == "h100-sxm-80gb"  # 96 GB / 500 W part, noted
    assert any("96 GB" in n for n in m.notes)
    assert m.job.training.precision == "fp8"
    assert m.fixed["zero_stage"] == 3 and m.fixed["recompute"] == "op"  # torchtitan's selective AC
    assert m.fixed["micro_batch_size"] == 2 and m.grid == {}
    assert m.measured_tokens_per_s_per_gpu == 8532

    # PP: the stated "local batch" (32) is split into pp x vpp micro-batches (torchtitan's default
    # pipeline_parallel_microbatches); 1F1B pins vpp = 1, so 8 micro-batches of 4
    pp = map_row(rows["torchtitan-llama31-405b-512gpu-1f1b"])
    assert pp.fixed["vpp"] == 1 and pp.fixed["micro_batch_size"] == 4
    # FSDP under PyTorch's pipeline schedule keeps weights gathered all step: ZeRO-1
    assert pp.fixed["zero_stage"] == 1 and any("ZeRO-1" in n for n in pp.notes)
    assert "micro_batch_size" not in pp.grid
    inter = map_row(rows["torchtitan-llama31-405b-512gpu-interleaved-1f1b"])
    assert inter.grid["vpp"] == (2,) and inter.fixed["micro_batch_size"] == 2
    # the measured 1.28x of interleaved over 1F1B needs the 1F1B bubble of 7 / 8 micro-batches
    one, two = (evaluate_row(m, DEFAULT) for m in (pp, inter))
    assert abs(one.error_pct) <= 5.0, one.error_pct
    assert 1.2 < two.predicted / one.predicted < 1.6  # measured 1.28
    # torchtitan's benchmark reports 82.5 GiB reserved for this run (the allocator's cache
    # included); as ZeRO-3 (weights gathered per layer) it would be under half of that
    assert 70.0 < one.memory_gib < 82.5, one.memory_gib
    pp_zero3 = dataclasses.replace(pp, fixed={**pp.fixed, "zero_stage": 3})
    assert evaluate_row(pp_zero3, DEFAULT).memory_gib < 82.5 / 2

    # no stated global batch: local batch x dp (torchtitan has no gradient accumulation)
    cp = map_row(rows["torchtitan-llama31-405b-512gpu-fsdp4-cp2"])
    assert cp.job.training.global_batch_size == 8 * 4 and cp.fixed["cp"] == 2


def test_flop_definitions_reproduce_reported_tflops(rows) -> None:
    """Rows with both TFLOP/s and tokens/s pin the definitions used for TFLOP/s-only rows."""
    nemo = map_row(rows["nemo2407-llama2-7b-8gpu"])
    per_token = source_flops_per_token(nemo.job.model, 4096, causal=False)
    assert 16934 * per_token / 1e12 == pytest.approx(780, rel=0.01)
    zoo = map_row(rows["modelzoo-qwen3-235b-256gpu-cfg1"])
    per_token = source_flops_per_token(zoo.job.model, 4096, causal=True)
    assert 1663.4 * per_token / 1e12 == pytest.approx(245, rel=0.01)


def test_unmappable_rows_are_listed(rows) -> None:
    # heads are not stated for SC'21 Table 1: inferred as hidden / 128 (they do not change FLOPs)
    inferred = map_row(rows["sc21-t1-1.7B"])
    assert inferred.job.model.num_attention_heads == inferred.job.model.hidden_size // 128
    with pytest.raises(Unmappable, match="global batch"):
        map_row(rows["korthikanti-530B-2240gpu-full"])
    mapped, skipped = map_all()
    assert len(mapped) + len(skipped) == 113
    assert all(s.reason for s in skipped)


def test_ranking_helpers() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert pairwise_agreement([1, 2, 3], [1, 3, 2]) == pytest.approx(2 / 3)
    assert pairwise_agreement([1, 2, 3], [5, 5, 6]) == pytest.approx(2.5 / 3)  # one predicted tie
    assert pairwise_agreement([1, 2], [5, 5]) is None  # every prediction the same: same inputs
    assert pairwise_agreement([1, 1], [1, 2]) is None  # measured tie


def test_alternative_calibration_is_used(rows) -> None:
    m = map_row(rows["nemo2407-llama2-7b-8gpu"])
    base = evaluate_row(m, DEFAULT)
    half = dataclasses.replace(DEFAULT, gemm_training_fraction=DEFAULT.gemm_training_fraction / 2)
    slower = evaluate_row(m, half)
    assert slower.predicted < base.predicted
    assert base.measured == slower.measured == 16934


@pytest.mark.slow
def test_run_validation_summary_is_finite(default_report: ValidationReport) -> None:
    rep = default_report
    s = rep.summary
    assert s.rows_used >= 60
    assert s.rows_used == len(rep.rows)
    assert s.rows_used + s.rows_skipped == 113
    for x in (s.median_abs_pct, s.p90_abs_pct, s.overall.mean_signed_pct):
        assert math.isfinite(x)
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in rep.rows)
    assert set(s.by_gpu) >= {"A100", "H100"} and set(s.by_kind) >= {"dense", "moe"}
    assert s.groups and all(g.n >= 2 for g in s.groups)


@pytest.mark.parametrize(
    ("bf16_id", "fp8_id"),
    [
        ("torchtitan-asynctp-llama3-8b-64gpu-bf16-vanilla-tp", "torchtitan-asynctp-llama3-8b-64gpu-float8-vanilla-tp"),
        (
            "torchtitan-asynctp-llama3-70b-256gpu-bf16-vanilla-tp",
            "torchtitan-asynctp-llama3-70b-256gpu-float8-vanilla-tp",
        ),
    ],
)
def test_fp8_speedup_matches_published_pairs(rows, bf16_id: str, fp8_id: str) -> None:
    """Same layout in bf16 and float8 (torchtitan): measured speed-ups 1.16x (8B) and 1.36x (70B).
    FP8 operand casts are memory-bound, so narrow GEMMs (8B at TP8) gain less than wide ones."""
    bf16, fp8 = (evaluate_row(map_row(rows[i]), DEFAULT) for i in (bf16_id, fp8_id))
    measured = fp8.measured / bf16.measured
    predicted = fp8.predicted / bf16.predicted
    assert predicted == pytest.approx(measured, rel=0.05), (measured, predicted)


def test_validation_headline_numbers(default_report: ValidationReport) -> None:
    """Regression guard on the published-run validation (docs/validation.md has the full table):
    the median and p90 targets hold, no layout that ran is predicted out of memory, and a spread of
    well-documented runs (Megatron-LM, NeMo, SC'21 PTD-P, Korthikanti et al., torchtitan,
    Megatron-MoE) stays within 10% of measured tokens/s/GPU."""
    rep = default_report
    assert rep.summary.overall.median_abs_pct <= 6.0  # the targets; docs/validation.md has the values
    assert rep.summary.overall.p90_abs_pct <= 15.0
    moe = rep.summary.by_kind["moe"]
    assert moe.median_abs_pct <= 10.0 and moe.p90_abs_pct <= 20.0
    assert rep.summary.oom_count == 0
    by_id = {r.id: r for r in rep.rows}
    for row_id in (
        "megatron-core-h100-strong-gpt3-175B-4608gpu",
        "korthikanti-530B-seqsel",
        "sc21-t1-1T",
        "sc21-t2-ptd-530B-2240gpu",
        "torchtitan-llama31-70b-256gpu-2d",
    ):
        assert abs(by_id[row_id].error_pct) <= 10.0, (row_id, by_id[row_id].error_pct)
    # context parallel: the overlapped K/V ring costs SM share (overlap_contention): 8.2% and
    # 8.4% without it, 10.2% and 10.3% with it
    for row_id in ("nemo2407-llama3-70b-64gpu", "nemo-longseq-llama2-7b-h100-128k"):
        assert abs(by_id[row_id].error_pct) <= 12.0, (row_id, by_id[row_id].error_pct)
    # ZeRO-3 against PTD-P (SC'21 Table 2) is ordered as measured at every GPU count
    groups = {g.group: g for g in rep.summary.groups}
    for name in ("sc21-t2-175B-384gpu", "sc21-t2-175B-768gpu", "sc21-t2-175B-1536gpu", "sc21-t2-530B",
                 "sc21-t2-530B-1120gpu", "sc21-t2-530B-2240gpu"):  # fmt: skip
        assert groups[name].pairwise_agreement == 1.0, name
    # The Qwen3-235B 256-GPU group orders all its pairs: TP2 EP32 without A2A overlap (measured 1,663)
    # below the ZeRO-3 EP8 layout (1,862) since cross-node dispatch runs at 0.7 of the NIC's rate
    # (at 1.0: 11% fast, and that pair inverted)
    assert groups["modelzoo-qwen3-235b-256gpu"].pairwise_agreement == 1.0
    others = [g for g in rep.summary.groups if g.group != "mbridge-qwen3-30b-h100"]
    assert all(g.pairwise_agreement in (1.0, None) for g in others), [
        g.group for g in others if g.pairwise_agreement not in (1.0, None)
    ]
    # one layout measured on two Megatron-Bridge releases, whose recipes differ (25.09 drops and pads
    # tokens, 25.11 overlaps the all-to-alls): Qwen3-235B ordered as measured; Qwen3-30B-A3B's 25.11
    # run measured half the 25.09 one's throughput, which neither change explains (+94%)
    assert groups["mbridge-qwen3-235b-h100"].pairwise_agreement == 1.0
    assert groups["mbridge-qwen3-30b-h100"].pairwise_agreement == 0.0
    assert len(rep.summary.groups) == 30


def test_tp_comm_overlap_is_read_from_the_row(rows) -> None:
    def overlap(row_id: str) -> bool:
        return map_row(rows[row_id]).job.training.tp_comm_overlap

    assert overlap("megatron-core-h100-weak-32B")  # --tp-comm-overlap
    assert overlap("torchtitan-asynctp-llama3-70b-256gpu-bf16-async-tp")
    assert not overlap("torchtitan-asynctp-llama3-70b-256gpu-bf16-vanilla-tp")
    assert not overlap("nemo2407-llama3-70b-64gpu")


def test_ep_comm_overlap_is_read_from_the_row(rows) -> None:
    def overlap(row_id: str) -> bool:
        return map_row(rows[row_id]).job.training.ep_comm_overlap

    assert overlap("modelzoo-qwen3-235b-256gpu-cfg2")  # notes: "cross-node EP + 1F1B A2A overlap"
    assert not overlap("modelzoo-qwen3-235b-256gpu-cfg1")  # notes: "cross-node EP"
    assert not overlap("modelzoo-qwen3-235b-256gpu-cfg3")


def test_expert_tp_follows_the_row_or_its_recipe(rows) -> None:
    """Stated expert TP is kept; Megatron-Bridge's performance configs and the model zoo set 1;
    a Megatron-Core recipe that names none (DGX Cloud's Grok-1, TP4) runs Megatron-Core's
    default, etp = tp, and the row says so. On Grok-1 the experts' TP split moves both rows
    within 9% of measured (etp 1: +5.7% BF16, +19.8% FP8)."""

    def etp(row_id: str) -> int | None:
        return map_row(rows[row_id]).fixed.get("etp")

    assert etp("modelzoo-qwen3-235b-256gpu-cfg5") == 1  # stated
    assert etp("modelzoo-qwen3-235b-256gpu-seq16k") == 1  # TP4, not stated: the zoo's YAML
    assert etp("mbridge-25.11-qwen3-235b-h100-256gpu-fp8") == 1  # TP2, not stated: Bridge's config
    assert etp("dgxc-24.11-grok1-314b-1024gpu-bf16") == 4  # TP4, not stated: Megatron-Core's default
    assert etp("megatron-core-h100-weak-70B") is None  # dense
    assert any("expert TP 4" in n for n in map_row(rows["dgxc-24.11-grok1-314b-1024gpu-fp8"]).notes)
    for row_id in ("dgxc-24.11-grok1-314b-1024gpu-bf16", "dgxc-24.11-grok1-314b-1024gpu-fp8"):
        assert abs(evaluate_row(map_row(rows[row_id]), DEFAULT).error_pct) <= 9.0, row_id


def test_megatron_bridge_moe_rows_run_their_release_recipe(rows) -> None:
    """25.09 (Megatron-Bridge v0.1.0rc4): Qwen3 drops and pads tokens (capacity 1.0, all-to-all
    dispatcher), DeepSeek-V3 overlaps DeepEP's all-to-alls; 25.11
    (v0.2.0): Qwen3 overlaps its all-to-alls, dropless; GPT-OSS neither."""

    def training(row_id: str) -> TrainingSpec:
        return map_row(rows[row_id]).job.training

    drop = training("mbridge-25.09-qwen3-235b-h100-256gpu-fp8")
    assert (drop.moe_capacity_factor, drop.ep_comm_overlap) == (1.0, False)
    assert drop.moe_dispatcher == "alltoall" and drop.tp_comm_overlap
    later = training("mbridge-25.11-qwen3-235b-h100-256gpu-fp8")
    assert (later.moe_capacity_factor, later.expert_gemm_host_splits, later.ep_comm_overlap) == (None, True, True)
    assert later.moe_dispatcher == "alltoall" and not later.tp_comm_overlap
    assert training("mbridge-25.09-qwen3-30b-h100-16gpu-fp8").moe_dispatcher == "alltoall"
    dsv3 = training("mbridge-25.09-dsv3-h100-1024gpu-fp8")
    assert dsv3.moe_dispatcher == "deepep" and dsv3.ep_comm_overlap
    gptoss = training("mbridge-25.11-gptoss-120b-h100-64gpu-bf16")
    assert gptoss.moe_dispatcher == "alltoall" and not gptoss.ep_comm_overlap
    # rows of other sources keep their own mapping
    assert not training("dgxc-24.11-grok1-314b-1024gpu-fp8").ep_comm_overlap


def test_megatron_bridge_moe_rows_recompute_as_their_recipe(rows) -> None:
    """The recipes' recompute: none for Qwen3 (both releases), the MLA up-projections re-made for
    DeepSeek-V3 (nearest: the cost model's core_attn, which adds the attention core); GPT-OSS's
    row does not match its recipe's
    micro-batch, so its recompute stays searched. Transformer Engine keeps fp8 GEMM inputs,
    torchtitan's float8 linears do not."""

    def recompute(row_id: str) -> tuple[str, ...]:
        mr = map_row(rows[row_id])
        return (mr.fixed["recompute"],) if "recompute" in mr.fixed else tuple(mr.grid["recompute"])

    for row_id in ("mbridge-25.09-qwen3-30b-h100-16gpu-fp8", "mbridge-25.11-qwen3-235b-h100-256gpu-fp8"):
        assert recompute(row_id) == ("none",), row_id
    assert recompute("mbridge-25.09-dsv3-h100-1024gpu-fp8") == ("core_attn",)  # + mla_up_proj, nearest
    assert len(recompute("mbridge-25.11-gptoss-120b-h100-64gpu-bf16")) > 1
    assert map_row(rows["mbridge-25.09-dsv3-h100-1024gpu-fp8"]).job.training.fp8_saved_inputs
    assert not map_row(rows["torchtitan-llama31-8b-8gpu-fsdp-compile-float8"]).job.training.fp8_saved_inputs


def test_eager_torchtitan_rows_are_unfused(rows) -> None:
    def fused(row_id: str) -> bool:
        return map_row(rows[row_id]).job.training.fused_kernels

    assert not fused("torchtitan-llama31-8b-8gpu-fsdp")  # no torch.compile
    assert fused("torchtitan-llama31-8b-8gpu-fsdp-compile")
    assert fused("megatron-core-h100-weak-32B")


def test_attention_kernel_follows_the_source_stack(rows) -> None:
    def kernel(row_id: str) -> str:
        return map_row(rows[row_id]).job.training.attention_kernel

    assert kernel("modelzoo-qwen3-235b-256gpu-seq128k") == "flash3"  # Megatron-Core / TE 2.x, 2025
    assert kernel("nemo-longseq-llama2-7b-h100-128k") == "flash2"  # NeMo 24.03
    assert kernel("torchtitan-llama31-8b-8gpu-fsdp1-cp8") == "flash2"  # PyTorch SDPA flash backend
    assert kernel("torchtitan-asynctp-llama3-8b-64gpu-bf16-vanilla-tp") == "flash2"  # 2025, still SDPA
    assert kernel("sc21-t1-1.7B") == "unfused"  # Megatron-LM 2021, before FlashAttention
    assert kernel("korthikanti-22B-seqsel") == "unfused"


def test_small_sc21_models_pay_for_materialised_attention_scores(rows) -> None:
    """SC'21's 1.7B and 3.6B runs (24-32 heads over a 2,304-3,072 hidden, seq 2048): the score
    tensors' HBM traffic is a large share of their layer time. Costed with flash kernels they
    were 24% and 17% fast."""
    for row_id in ("sc21-t1-1.7B", "sc21-t1-3.6B"):
        r = evaluate_row(map_row(rows[row_id]), DEFAULT)
        assert abs(r.error_pct) <= 8.0, (row_id, r.error_pct)


def test_long_context_moe_rows_with_hopper_attention_kernels(rows) -> None:
    """Qwen3-235B at 16k-128k tokens (Megatron-Core 2025, causal model FLOPs): the attention core
    is 36-82% of the work. With FlashAttention-2-class kernels every row was 18-49% slow. Their
    2,048 tokens per expert GEMM leave them a little host bound (about 1% slower). The SM share
    their overlapped all-to-all and TP collectives take (``overlap_contention``) moves 128k from
    -16.1% to -17.5%."""
    for seq in ("16k", "32k", "64k", "128k"):
        r = evaluate_row(map_row(rows[f"modelzoo-qwen3-235b-256gpu-seq{seq}"]), DEFAULT)
        assert abs(r.error_pct) <= 18.0, (seq, r.error_pct)


def test_torchtitan_micro_batch_size_follows_the_kept_vpp(rows) -> None:
    """With several possible stage counts per rank, each implies its own micro-batch size
    (local batch / (pp x vpp)); the mapping keeps one pair instead of crossing them."""
    row = copy.deepcopy(rows["torchtitan-llama31-405b-512gpu-interleaved-1f1b"])
    row["model"]["num_layers"] = 128  # vpp candidates 2, 4, 8; local batch 32 over pp 8 allows 2 and 4
    m = map_row(row)
    assert m.grid["vpp"] == (4,) and m.fixed["micro_batch_size"] == 1
    for lay in m.layouts():
        assert m.job.training.global_batch_size // (m.fixed["dp"] * lay.micro_batch_size) == 8 * lay.vpp


def test_deepspeed_pipeline_rows_do_not_overlap_sends(rows) -> None:
    def overlap(row_id: str) -> bool:
        return map_row(rows[row_id]).job.training.pp_comm_overlap

    assert not overlap("mtnlg-530B-2240gpu")  # DeepSpeed's pipeline engine
    assert not overlap("bloom-176B-384gpu")  # Megatron-DeepSpeed
    assert overlap("sc21-t2-ptd-530B-2240gpu") and overlap("nemo2407-gpt3-175b-128gpu")


def test_only_deepspeed_rows_run_blocking_collectives_and_zero3_of_2021_flat_ones(rows) -> None:
    def training(row: dict) -> TrainingSpec | None:
        try:
            return map_row(row).job.training
        except Unmappable:
            return None

    mapped = {i: t for i, row in rows.items() if (t := training(row)) is not None}
    sc21_zero3 = {
        f"sc21-t2-zero3-{size}gpu"
        for size in ("175B-384", "175B-768", "175B-1536", "530B-640", "530B-1120", "530B-2240")
    }
    assert {i for i, t in mapped.items() if t.dp_collectives == "flat"} == sc21_zero3
    # and DeepSpeed's pipeline engine (Megatron-DeepSpeed with pp > 1) turns overlap_comm off
    pipeline_engine = {"mtnlg-530B-2240gpu", "mtnlg-530B-2800gpu", "mtnlg-530B-3360gpu", "bloom-176B-384gpu"}
    assert {i for i, t in mapped.items() if not t.dp_comm_overlap} == sc21_zero3 | pipeline_engine
    # FSDP / ZeRO-3 on other stacks (Megatron-FSDP, FSDP2) stays hierarchical and prefetches
    for row_id in ("modelzoo-qwen3-235b-256gpu-cfg3", "torchtitan-llama31-8b-128gpu-fsdp"):
        assert mapped[row_id].dp_collectives == "hierarchical" and mapped[row_id].dp_comm_overlap


def test_fp32_gradient_what_if_fits_the_published_runs_worse(default_report: ValidationReport) -> None:
    """The rows are costed with 16-bit gradients; fp32 ones in every bf16 row (Megatron-LM's
    default with --bf16) fit them worse (docs/cost-model.md quotes the numbers)."""
    base = default_report.summary
    fp32 = run_validation(fp32_gradients=True).summary
    assert fp32.overall.median_abs_pct > base.overall.median_abs_pct + 0.3
    assert fp32.overall.p90_abs_pct > base.overall.p90_abs_pct + 3.0
    ordered = [sum(g.pairwise_agreement == 1.0 for g in s.groups) for s in (base, fp32)]
    assert ordered[1] < ordered[0]


def test_memory_matches_what_torchtitan_published() -> None:
    """Peak per-GPU memory against torchtitan's published peaks (reserved, cached blocks
    included) for 18 calibration runs, each scored as the validation scores it: the four 8B
    context-parallel runs at 32,768 tokens a GPU (the fp32 loss is a third of them) and the two
    8B FSDP runs without torch.compile within 3% (the recomputed layer's expanded keys and values
    included; compile's fused kernels keep less, which the
    model does not credit: those runs are predicted 6-8% over), the 70B TP8 runs (16 bytes a
    logit of PyTorch's loss_parallel) within 7%, no run more than 20% under, the median within
    6% (docs/memory_check.md)."""
    from benchmarks.memory_check import run_memory_check, summarise

    rows = {r.id: r for r in run_memory_check()}
    assert len(rows) == 18
    close = [f"torchtitan-llama31-8b-8gpu-fsdp{8 // cp}-cp{cp}" for cp in (1, 2, 4, 8)]
    close += ["torchtitan-llama31-8b-8gpu-fsdp", "torchtitan-llama31-8b-128gpu-fsdp"]
    for rid in close:
        assert abs(rows[rid].error_pct) < 3.0, (rid, rows[rid].error_pct)
    for rid in ("torchtitan-llama31-70b-256gpu-2d", "torchtitan-llama31-70b-256gpu-2d-asynctp"):
        assert abs(rows[rid].error_pct) < 7.0, (rid, rows[rid].error_pct)
    s = summarise(list(rows.values()))
    assert s.passes() and s.median_abs_pct < 6.0 and s.worst_under_pct > -20.0


def test_qwen3_235b_layouts_on_256_h100_are_ordered_as_measured(default_report: ValidationReport) -> None:
    """The five published Qwen3-235B layouts on 256 H100 (same batch): measured 1,862 (TP2 EP32
    with A2A overlap; TP2 EP8 FSDP), 1,663, 1,354 (PP32 EP8) and 1,130 (TP4 EP8) tokens/s/GPU.
    The last two give each of their 16 local experts 1,024 and 512 tokens per GEMM and are host
    bound; without the host floor they are predicted 1.42x and 1.88x too fast."""
    rows = {r.id: r for r in default_report.rows}
    ids = [f"modelzoo-qwen3-235b-256gpu-cfg{i}" for i in range(1, 6)]
    err = {i[-4:]: rows[i].error_pct for i in ids}
    assert abs(err["cfg5"]) <= 5.0 and abs(err["cfg4"]) <= 20.0, err  # 2.2% slow, 18.5% fast
    # cfg3 (ZeRO-3 over 128 ranks): its overlapped weight gathers cost SM share (overlap_contention),
    # and its DeepEP dispatch is exposed: -4.8% before both, -10.4% with them. cfg1 and cfg2
    # (cross-node EP32 with DeepEP's per-node de-duplication) are within 3%.
    assert abs(err["cfg3"]) <= 11.0, err
    assert all(abs(e) <= 12.0 for k, e in err.items() if k not in ("cfg3", "cfg4", "cfg5")), err
    by_predicted = sorted(ids, key=lambda i: -rows[i].predicted)
    assert by_predicted[-2:] == [ids[3], ids[4]]  # PP32, then TP4 last, as measured
    no_floor = {r.id: r for r in run_validation(dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0)).rows}
    assert no_floor[ids[4]].error_pct > 85 and no_floor[ids[3]].error_pct > 40


def test_account_for_embedding_and_loss_split(rows) -> None:
    """Megatron's split that counts the embedding and the loss as a layer each: the ModelZoo's
    PP32 x VPP3 run of 94 layers has 96 one-unit chunks; at PP8 x VPP4 it equals the cost
    model's own even split (first and last chunk one layer short)."""
    from optimizer.cost.pipeline import even_split

    assert map_row(rows["modelzoo-qwen3-235b-256gpu-cfg4"]).fixed["stage_layers"] == [0] + [1] * 94 + [0]
    assert account_for_embedding_and_loss_split(94, 32) == even_split(94, 32) == [2] + [3] * 30 + [2]
    assert "stage_layers" not in map_row(rows["modelzoo-qwen3-235b-256gpu-cfg5"]).fixed
    with pytest.raises(Unmappable):
        account_for_embedding_and_loss_split(94, 64)
