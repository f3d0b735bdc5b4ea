"""Every worked number of the seed text (seed-notes sections 1-6), reproduced by the product's code.

Collective times, bubbles, FLOP counts and memory come from the cost model itself
(``optimizer.cost``); only quantities the cost model has no function for come from
``optimizer.seed_formulas``. Tolerances follow the seed's printed precision: a number printed
to ``k`` digits gets half a unit in its last digit (``abs=``), unless a comment says why the
seed's own arithmetic needs more (it sometimes multiplies already-rounded figures or drops the
``(N-1)/N`` ring factor). Numbers the cost model cannot reproduce are strict ``xfail`` tests
that state the discrepancy.
"""

from __future__ import annotations

import pytest

from hardware_catalog import load_catalog
from optimizer.cost import best_estimate, build_context, resolve_layout
from optimizer.cost.comm import (
    Level,
    all_to_all_time_s,
    flat_ring_levels,
    hierarchical_allreduce_time_s,
    p2p_time_s,
    ring_allreduce_time_s,
)
from optimizer.cost.estimate import Estimate
from optimizer.cost.flops import model_flops
from optimizer.cost.layer import Dims, layer_cost
from optimizer.cost.memory import WEIGHT_BYTES
from optimizer.cost.pipeline import bubble_fraction_gpipe, bubble_over_ideal, in_flight_microbatches
from optimizer.cost.topology import axis_groups
from optimizer.params import count_params
from optimizer.seed_formulas import (
    checkpoint_overhead_fraction,
    cluster_failure_probability,
    critical_message_bytes,
    kv_cache_bytes_per_token,
    logp_time_s,
    pp_boundary_bytes,
    scaling_efficiency,
    sharded_write_time_s,
    static_memory_bytes,
    system_mtbf_s,
    tp_allreduce_payload_bytes,
    young_daly_interval_s,
    zero_memory_bytes_per_gpu,
)
from optimizer.specs import JobSpec, Layout, ModelSpec
from optimizer.units import GB, KB, MB, MIB, MS, TB, US

HOUR = 3600.0
MINUTE = 60.0


# ---------------------------------------------------------------------------------------- helpers


def _model_with_params(preset: str, target: float, **overrides: object) -> ModelSpec:
    """``preset``'s layer shapes with the vocabulary sized so the model has ``target`` parameters.

    The seed's "7B" and "175B" are nominal counts; its arithmetic uses them exactly (7e9 * 16 B =
    112 GB), while the published architectures have 6.74B and 174.6B. Sizing the vocabulary keeps
    real layer shapes and puts the total on the nominal count to well under the seed's rounding.
    """
    probe = ModelSpec(preset=preset, vocab_size=1, **overrides)
    pc = count_params(probe)
    rest = pc.total - pc.embedding - pc.lm_head
    per_vocab = probe.hidden_size * (1 if probe.tied_embeddings else 2)
    model = ModelSpec(preset=preset, vocab_size=round((target - rest) / per_vocab), **overrides)
    assert count_params(model).total == pytest.approx(target, rel=1e-6)
    return model


def _estimate(
    model: ModelSpec, num_gpus: int, global_batch: int, seq: int = 2048, kernel: str = "flash3", **layout: object
) -> Estimate:
    job = JobSpec(
        model=model,
        training={"seq_len": seq, "global_batch_size": global_batch, "attention_kernel": kernel},
        cluster={"preset": "dgx-h100", "num_gpus": num_gpus},
    )
    return best_estimate(build_context(job), resolve_layout(job, Layout(**layout)))


def _static(est: Estimate, stage: int = 0) -> float:
    mem = est.memory[stage]
    return mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes


SEVEN_B = _model_with_params("llama2-7b", 7e9)
GPT3_175B = _model_with_params("gpt3-175b", 175e9, tied_embeddings=False)


# ===================================================================== section 1: step time

# 175B, 1024 H100, 2M-token batch, 6 FLOPs/param/token, FP8 peak at 50%.
S1_PARAMS = 175e9
S1_TOKENS = 2e6
S1_GPUS = 1024


def test_s1_flops_per_step_six_n_d():
    assert 6 * S1_PARAMS * S1_TOKENS == pytest.approx(2.1e18, rel=1e-12)


def test_s1_flops_per_step_cost_model_count_matches():
    """The cost model's per-layer count (attention core, LM head included) rounds to the same 2.1e18."""
    per_token = model_flops(ModelSpec(preset="gpt3-175b"), 2048).model_per_token
    assert per_token * S1_TOKENS == pytest.approx(2.1e18, abs=0.05e18)


def test_s1_compute_time_per_gpu():
    fp8_peak = load_catalog().gpus["h100-sxm-80gb"].fp8_dense_flops.value  # 1979 TFLOP/s
    t = 6 * S1_PARAMS * S1_TOKENS / (S1_GPUS * fp8_peak * 0.5)
    assert t == pytest.approx(2.1, abs=0.05)


def test_s1_pure_dp_allreduce_raw_and_exposed():
    raw = ring_allreduce_time_s(350 * GB, S1_GPUS, 50 * GB, 0.0)
    assert raw == pytest.approx(14.0, abs=0.5)
    assert raw * (1 - 0.75) == pytest.approx(3.5, abs=0.05)


def test_s1_pure_dp_scaling_efficiency():
    assert scaling_efficiency(2.1, 2.1 + 3.5) == pytest.approx(0.375, abs=0.0005)


def test_s1_tp8_dp128_gradient_allreduce():
    shard = 350 * GB / 8
    assert shard == pytest.approx(43.75 * GB, abs=0.005 * GB)
    # The seed quotes the large-N bandwidth bound 2M/beta; the ring is (N-1)/N of it (1.736 s).
    assert 2 * shard / (50 * GB) == pytest.approx(1.75, abs=0.005)
    t = ring_allreduce_time_s(shard, 128, 50 * GB, 0.0)
    assert t == pytest.approx(1.75 * 127 / 128, rel=1e-12)


def test_s1_tp8_scaling_efficiency():
    assert scaling_efficiency(2.1, 2.1 + 1.75) == pytest.approx(0.545, abs=0.0005)
    # "75-85% with overlap": the same 75% overlap as the pure-DP case.
    assert 0.75 <= scaling_efficiency(2.1, 2.1 + 1.75 * (1 - 0.75)) <= 0.85


def test_s1_tp8_pp4_dp32_bubble():
    assert bubble_over_ideal(4, 32) == pytest.approx(3 / 32, rel=1e-12)
    assert bubble_over_ideal(4, 32) == pytest.approx(0.09, abs=0.005)


# ======================================================= section 2: communication cost


def test_s2_ring_allreduce_70b_bf16_64_ranks():
    bandwidth_term = ring_allreduce_time_s(140 * GB, 64, 50 * GB, 0.0)
    total = ring_allreduce_time_s(140 * GB, 64, 50 * GB, 1.5 * US)
    assert bandwidth_term / MS == pytest.approx(5512.5, abs=0.05)
    assert (total - bandwidth_term) / MS == pytest.approx(0.2, abs=0.05)
    assert total / MS == pytest.approx(5512.7, abs=0.05)


def test_s2_hierarchical_allreduce_70b_16x8():
    """NVLink 450 GB/s inside the node, NDR 50 GB/s per GPU across; alpha 1.5 us as in the ring example.

    Any NVLink alpha in Table 6.2's 1-2 us range gives the same 1200.8 ms at this precision.
    """
    hier = hierarchical_allreduce_time_s(140 * GB, [Level(8, 450 * GB, 1.5 * US), Level(16, 50 * GB, 1.5 * US)])
    flat = ring_allreduce_time_s(140 * GB, 128, 50 * GB, 1.5 * US)
    assert hier / MS == pytest.approx(1200.8, abs=0.05)
    assert flat / MS == pytest.approx(5557, abs=0.5)
    # training.dp_collectives "flat" costs the same tiers as the seed's flat ring
    levels = (Level(8, 450 * GB, 1.5 * US), Level(16, 50 * GB, 1.5 * US))
    assert hierarchical_allreduce_time_s(140 * GB, flat_ring_levels(levels)) == pytest.approx(flat, rel=1e-12)


def test_s2_flat_ring_3gb_on_1024_gpus_and_measured_100ms():
    """Flat ring bound (bandwidth only, as the seed computes it) and the diagnosis of a measured 100 ms."""
    flat = ring_allreduce_time_s(3 * GB, 1024, 25 * GB, 0.0)
    hier = hierarchical_allreduce_time_s(3 * GB, [Level(8, 300 * GB, 0.0), Level(128, 25 * GB, 0.0)])
    assert flat / MS == pytest.approx(239.8, abs=0.05)
    assert hier < 100 * MS < flat  # "a measured 100 ms means the library is already hierarchical"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "seed's ~48.5 ms is not reproducible from its stated inputs: with the bandwidth-only "
        "assumptions of its own flat bound (239.8 ms), hierarchical_allreduce_time_s gives "
        "2 * 7/8 * 3 GB / 300 GB/s + 2 * 127/128 * 375 MB / 25 GB/s = 47.27 ms; the 1.23 ms gap "
        "would need ~4.6 us of alpha on each of the 268 steps, which the flat figure excludes"
    ),
)
def test_s2_topology_aware_3gb_on_128x8():
    hier = hierarchical_allreduce_time_s(3 * GB, [Level(8, 300 * GB, 0.0), Level(128, 25 * GB, 0.0)])
    assert hier / MS == pytest.approx(48.5, abs=0.05)


@pytest.mark.parametrize(
    ("link", "alpha_s", "beta", "expected", "tol"),
    [
        # n* uses the midpoint of each link's alpha range in Table 6.2.
        ("nvlink4", 1.5 * US, 450 * GB, 0.7 * MB, 0.05 * MB),
        ("ib-ndr-400", 2.0 * US, 50 * GB, 100 * KB, 0.5 * KB),
        ("ib-hdr-200", 3.5 * US, 25 * GB, 87.5 * KB, 0.05 * KB),
        ("pcie5", 3.5 * US, 64 * GB, 224 * KB, 0.5 * KB),
        # 93.75 KB, printed truncated as 93.7: the true value lies in [93.7, 93.8).
        ("roce-100", 7.5 * US, 12.5 * GB, 93.75 * KB, 0.05 * KB),
    ],
)
def test_s2_critical_message_size(link, alpha_s, beta, expected, tol):
    assert critical_message_bytes(alpha_s, beta) == pytest.approx(expected, abs=tol)


def test_s2_logp_overlap_example():
    assert logp_time_s(500 * US, 100 * US, 50 * US) == pytest.approx(600 * US, abs=0.5 * US)


# ================================================== section 3: hierarchy-aware parallelism

TP_PAYLOAD = tp_allreduce_payload_bytes(4, 2048, 4096, 2)


def test_s3_tp_payload_and_ring_volume():
    assert TP_PAYLOAD == pytest.approx(67 * MB, abs=0.5 * MB)
    # A ring moves 2(t-1)/t of the payload per GPU; the seed quotes the bound 2x.
    assert 2 * TP_PAYLOAD == pytest.approx(134 * MB, abs=0.5 * MB)


def test_s3_tp_volume_96_layers():
    forward = 96 * 2 * (2 * TP_PAYLOAD)  # two all-reduces per layer in the forward pass
    # The seed multiplies the rounded 134 MB and truncates: 25.7 GB forward, 51 GB per step.
    assert 25.7 * GB <= forward < 25.8 * GB
    assert 51 * GB <= 2 * forward < 52 * GB


def test_s3_tp_allreduce_time_nvlink_vs_ib():
    nvlink = ring_allreduce_time_s(TP_PAYLOAD, 8, 450 * GB, 1.5 * US)
    ib = ring_allreduce_time_s(TP_PAYLOAD, 8, 50 * GB, 1.5 * US)
    assert 0.1 * MS <= nvlink <= 0.5 * MS
    per_layer_ib = 2 * ib  # the two forward all-reduces of one block
    assert 2 * MS <= per_layer_ib <= 10 * MS
    assert 200 * MS <= 96 * per_layer_ib <= 960 * MS


# MoE: 4096 tokens on 8 GPUs, d = 2048 BF16 (4.096 KB/token), uniform routing over 64 experts.
MOE_GPUS = 8
MOE_TOKEN_BYTES = 2048 * 2
MOE_PAIR_BYTES = 4096 / MOE_GPUS * MOE_TOKEN_BYTES / MOE_GPUS  # a GPU's tokens, 1/8 to each GPU
MOE_ALPHA = 3 * US
MOE_BETA = 50 * GB


def test_s3_moe_bytes_per_pair_and_per_gpu():
    assert MOE_TOKEN_BYTES == pytest.approx(4.096 * KB, rel=1e-12)
    assert MOE_PAIR_BYTES == pytest.approx(262.144 * KB, rel=1e-12)
    assert (MOE_GPUS - 1) * MOE_PAIR_BYTES == pytest.approx(1.84 * MB, abs=0.005 * MB)


def test_s3_moe_transfer_times_serial():
    one = p2p_time_s(MOE_PAIR_BYTES, MOE_BETA, MOE_ALPHA)  # 8.24 us
    assert one == pytest.approx(8 * US, abs=0.5 * US)
    # The seed's 56 us is 7 x its rounded 8 us, so it carries 7 x 0.5 us of rounding.
    assert (MOE_GPUS - 1) * one == pytest.approx(56 * US, abs=(MOE_GPUS - 1) * 0.5 * US)


def test_s3_moe_all_to_all_parallel():
    """ "~8 us if all 7 run in parallel": every peer has its own 50 GB/s link.

    ``all_to_all_time_s`` gives the innermost level one link of ``beta`` per rank, so the
    seed's assumption is a level whose per-rank bandwidth is 7 links x 50 GB/s.
    """
    per_gpu = (MOE_GPUS - 1) * MOE_PAIR_BYTES
    t = all_to_all_time_s(per_gpu, [Level(MOE_GPUS, (MOE_GPUS - 1) * MOE_BETA, MOE_ALPHA)])
    assert t == pytest.approx(8 * US, abs=0.5 * US)
    assert t == pytest.approx(p2p_time_s(MOE_PAIR_BYTES, MOE_BETA, MOE_ALPHA), rel=1e-12)


# ============================================================= section 4: pipeline schedules


@pytest.mark.parametrize(
    ("pp", "m", "expected", "tol"),
    [(8, 32, 0.179, 0.0005), (16, 16, 0.48, 0.005), (4, 8, 0.27, 0.005), (16, 32, 0.319, 0.0005)],
)
def test_s4_bubble_fraction(pp, m, expected, tol):
    assert bubble_fraction_gpipe(pp, m) == pytest.approx(expected, abs=tol)


def test_s4_1f1b_memory_follows_stages_not_microbatches():
    assert {in_flight_microbatches(0, 8, 1, m) for m in (8, 32, 128)} == {8.0}


def test_s4_interleaving_cuts_bubble_by_chunks():
    assert bubble_over_ideal(8, 32, vpp=4) == pytest.approx(bubble_over_ideal(8, 32) / 4, rel=1e-12)


def test_s4_stage_boundary_bytes():
    assert pp_boundary_bytes(4, 2048, 12288, 2) == pytest.approx(200 * MB, abs=5 * MB)
    # 8192 x 2048 x 2 is exactly 32 MiB, the seed's "~32 MB".
    assert pp_boundary_bytes(1, 2048, 8192, 2) == pytest.approx(32 * MIB, rel=1e-12)


# ================================================================= section 5: memory per GPU


def test_s5_7b_static_memory_does_not_fit_80gb():
    est = _estimate(SEVEN_B, 1, 1, zero_stage=0)
    assert _static(est) == pytest.approx(112 * GB, abs=0.5 * GB)
    assert static_memory_bytes(7e9) == pytest.approx(112 * GB, rel=1e-12)
    assert not est.fits_memory


def test_s5_7b_zero3_over_64():
    est = _estimate(SEVEN_B, 64, 64, zero_stage=3)
    assert _static(est) == pytest.approx(1.75 * GB, abs=0.005 * GB)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_s5_zero_sharding_rules_match_cost_model(stage):
    """ZeRO-1 shards optimizer state (12/N), ZeRO-2 also gradients (2/N), ZeRO-3 also weights (2/N)."""
    est = _estimate(SEVEN_B, 64, 64, zero_stage=stage)
    expected = zero_memory_bytes_per_gpu(count_params(SEVEN_B).total, stage, 64)
    assert _static(est) == pytest.approx(expected, rel=1e-5)  # the final norm is not in the stage memory


def test_s5_175b_static_memory():
    est = _estimate(GPT3_175B, 1, 1, zero_stage=0)
    assert _static(est) == pytest.approx(2800 * GB, abs=0.5 * GB)


def test_s5_175b_zero3_over_64():
    """The seed's "43.8 GB" is 2,800 GB / 64 = 43.75 GB rounded half up; checked to 4 digits."""
    est = _estimate(GPT3_175B, 64, 64, zero_stage=3)
    assert _static(est) == pytest.approx(43.75 * GB, abs=0.005 * GB)


def test_s5_175b_zero3_plus_activations_does_not_fit():
    """ "43.8 GB static + activations at seq 2048, batch 1 > 80 GB: needs TP"."""
    est = _estimate(GPT3_175B, 64, 64, zero_stage=3, recompute="none")
    assert not est.fits_memory


@pytest.mark.xfail(
    strict=True,
    reason=(
        "the seed's ~50 GB of activations (175B, seq 2048, batch 1, 96 layers) has no derivation in "
        "the text; the cost model keeps ~32 bytes per token per hidden unit per layer (flash "
        "attention, bf16) and reports ~78.6 GB (77.3 GB stored + one layer's working set + logits), "
        "so 43.8 + 50 = 93.8 GB becomes ~122 GB"
    ),
)
def test_s5_175b_activations_batch1():
    est = _estimate(GPT3_175B, 64, 64, zero_stage=3, recompute="none")
    mem = est.memory[0]
    assert mem.activations_bytes == pytest.approx(50 * GB, abs=0.5 * GB)
    assert _static(est) + mem.activations_bytes == pytest.approx(93.8 * GB, abs=0.05 * GB)


def test_s5_175b_tp8_weights():
    est = _estimate(GPT3_175B, 8, 8, tp=8, zero_stage=0)
    assert est.memory[0].weights_bytes == pytest.approx(43.75 * GB, abs=0.005 * GB)


def test_s5_175b_tp8_pp16_weights_and_optimizer():
    """Per-GPU share of 175B over TP=8 x PP=16 = 128 GPUs.

    The seed splits the whole model evenly; the cost model puts the embedding on the first stage
    and the LM head on the last, so the comparison is the mean over the 16 stages (which sums to
    the whole model). The cost model's optimizer state is the full 12 bytes/param; the
    "2 + 8" (Adam moments only) figure uses the parameters the cost model places on each GPU.
    """
    est = _estimate(GPT3_175B, 128, 16, tp=8, pp=16, zero_stage=0)
    weights = sum(m.weights_bytes for m in est.memory) / len(est.memory)
    optimizer = sum(m.optimizer_bytes for m in est.memory) / len(est.memory)
    params_per_gpu = weights / WEIGHT_BYTES
    assert params_per_gpu * (2 + 8) == pytest.approx(13.7 * GB, abs=0.05 * GB)
    assert weights + optimizer == pytest.approx(19.1 * GB, abs=0.05 * GB)


def test_s5_175b_checkpointed_activations_microbatch4():
    """With full recompute each layer keeps only its input: 96 x 4 x 2048 x 12288 x 2 B ~ 19.3 GB."""
    job = JobSpec(
        model=GPT3_175B,
        training={"seq_len": 2048, "global_batch_size": 4},
        cluster={"preset": "dgx-h100", "num_gpus": 1},
    )
    ctx = build_context(job)
    lay = resolve_layout(job, Layout(micro_batch_size=4, recompute="full", zero_stage=0))
    groups = axis_groups(ctx.topology, ("tp", "cp", "dp", "pp"), lay.sizes())
    dims = Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute)
    stored = sum(layer_cost(ctx, ctx.kinds[k], dims, groups).stored_act_bytes for k in ctx.layer_kind)
    assert stored == pytest.approx(19.3 * GB, abs=0.05 * GB)


def test_s5_175b_activations_microbatch4_no_recompute():
    """The seed's ~1.1 TB is Korthikanti et al.'s count, 34sbh + 5as^2b bytes per layer, with the
    s x s attention scores materialised (``attention_kernel: unfused``): 96 x (3.4 + 8.1) GB. With
    flash attention (no score tensors) the same layout keeps ~0.31 TB."""
    unfused = _estimate(GPT3_175B, 1, 4, kernel="unfused", micro_batch_size=4, recompute="none", zero_stage=0)
    assert unfused.memory[0].activations_bytes == pytest.approx(1.1 * TB, abs=0.05 * TB)
    flash = _estimate(GPT3_175B, 1, 4, micro_batch_size=4, recompute="none", zero_stage=0)
    assert flash.memory[0].activations_bytes == pytest.approx(0.31 * TB, abs=0.02 * TB)
    scores = 96 * 5 * 96 * 2048**2 * 4  # layers x 5 bytes x heads x s^2 x b
    assert unfused.memory[0].activations_bytes - flash.memory[0].activations_bytes == pytest.approx(scores, rel=1e-9)


def test_s5_kv_cache_per_token():
    """2 * N_L * H_kv * d_head * 2 bytes; Llama 3 70B (80 layers, 8 KV heads of 128): 320 KiB."""
    m = ModelSpec(preset="llama3-70b")
    per_token = kv_cache_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim)
    assert per_token == 2 * 80 * 8 * 128 * 2
    assert per_token == pytest.approx(320 * 1024, rel=1e-12)


# ===================================================== section 6: batch, convergence, reliability

YD_MTBF = system_mtbf_s(50_000 * HOUR, 1024)
YD_WRITE = 5 * MINUTE


def test_s6_system_mtbf():
    assert YD_MTBF / HOUR == pytest.approx(48.8, abs=0.05)


def test_s6_young_daly_interval():
    assert young_daly_interval_s(YD_WRITE, YD_MTBF) / MINUTE == pytest.approx(171.2, abs=0.05)


def test_s6_overhead_at_young_daly_interval():
    tau = young_daly_interval_s(YD_WRITE, YD_MTBF)
    assert checkpoint_overhead_fraction(tau, YD_WRITE, YD_MTBF) == pytest.approx(0.058, abs=0.0005)


def test_s6_overhead_every_15_minutes():
    assert checkpoint_overhead_fraction(15 * MINUTE, YD_WRITE, YD_MTBF) == pytest.approx(0.336, abs=0.0005)


def test_s6_young_daly_minimises_overhead():
    tau = young_daly_interval_s(YD_WRITE, YD_MTBF)
    best = checkpoint_overhead_fraction(tau, YD_WRITE, YD_MTBF)
    for factor in (0.5, 0.9, 1.1, 2.0):
        assert checkpoint_overhead_fraction(factor * tau, YD_WRITE, YD_MTBF) > best


def test_s6_hundred_node_cluster_failures():
    assert cluster_failure_probability(0.999, 100) == pytest.approx(0.095, abs=0.0005)
    node_mtbf = HOUR / (1 - 0.999)  # 1000 h
    assert system_mtbf_s(node_mtbf, 100) / HOUR == pytest.approx(10, abs=0.5)


def test_s6_checkpoint_size_and_sharded_write():
    """1,750 GB = 175B x (2 B bf16 weights + 8 B fp32 Adam moments); 256 nodes x 28 GB/s NVMe."""
    size = static_memory_bytes(175e9, bytes_per_param=WEIGHT_BYTES + 8)
    assert size == pytest.approx(1750 * GB, rel=1e-12)
    assert size / 256 == pytest.approx(6.8 * GB, abs=0.05 * GB)
    assert sharded_write_time_s(size, 256, 28 * GB) == pytest.approx(0.24, abs=0.005)
