"""MoE layer costs: the permutation's HBM traffic and the host floor of small expert GEMMs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from optimizer.cost import build_context
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec
from tests.cost.cost_helpers import _deepseek_v3_h800, _scored


@pytest.mark.parametrize(
    "recompute, passes_in_backward", [("none", 1), ("selective", 1), ("op", 2), ("moe", 2), ("full", 2)]
)
def test_moe_permutation_moves_every_routed_copy_through_hbm(monkeypatch, recompute, passes_in_backward):
    """DeepSeek-V3's MoE layer (top-8, hidden 7168) on one H800 of TP1 EP64: the permutation and
    unpermutation read and write each of a token's 8 routed copies, 8 bytes per hidden unit
    forward, the same again in backward, and once more when the MoE block is recomputed (torchtitan's
    op-level policy saves matmul and all-to-all outputs, not gathers and scatters). Dense layers move
    nothing of the kind."""
    from optimizer.cost import layer as layer_mod
    from optimizer.cost.layer import Dims, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, est = _deepseek_v3_h800(recompute)
    groups = axis_groups(ctx.topology, est.order, est.layout.sizes())
    dims = Dims(1, 1, 64, 1, False, recompute)
    hbm = ctx.gpu.hbm_bandwidth_bytes_per_s.value * ctx.cal.hbm_efficiency
    moved_s = 4096 * 8 * 7168 * 8.0 / hbm  # tokens x top_k x hidden x PERMUTE_BYTES
    assert moved_s == pytest.approx(0.623e-3, rel=0.01)  # 1.88 GB at 90% of 3.35 TB/s
    for kind in ctx.kinds:
        with_perm = layer_cost(ctx, kind, dims, groups)
        monkeypatch.setattr(layer_mod, "PERMUTE_BYTES", 0.0)
        without = layer_cost(ctx, kind, dims, groups)
        monkeypatch.undo()
        expected = moved_s if kind.is_moe else 0.0
        assert with_perm.fwd_s - without.fwd_s == pytest.approx(expected, abs=1e-12)
        assert with_perm.bwd_s - without.bwd_s == pytest.approx(passes_in_backward * expected, abs=1e-12)


def test_small_expert_gemms_are_host_bound_and_large_ones_are_not():
    """The routed-expert GEMMs of a layer take at least the host's time to issue them: two per local
    expert forward, at ``expert_gemm_host_s`` each. Qwen3-235B's 16 local experts at EP8 and TP4
    with 4k tokens get 512 tokens per expert GEMM: host bound (still a little at 2,048). At TP2 with
    micro-batch 4 (4,096 each, the published FSDP layout) the GPU work is longer."""
    from optimizer.calibration import DEFAULT
    from optimizer.cost.layer import Dims, expert_gemm_times_s

    def times(seq: int, tp: int, mbs: int) -> tuple[float, float]:
        job = JobSpec(
            model={"preset": "qwen3-235b-a22b"},
            training={"seq_len": seq, "global_batch_size": 2048},
            cluster={"preset": "dgx-h100", "num_gpus": 256},
        )
        ctx = build_context(job)
        moe_kind = next(k for k in ctx.kinds if k.is_moe)
        return expert_gemm_times_s(ctx, moe_kind, Dims(tp, 1, 8, mbs, True, "none"))

    floor = 2 * 16 * DEFAULT.expert_gemm_host_s
    gpu, host = times(4096, 4, 1)  # 1,024 tokens per GPU, 512 per expert GEMM
    assert host == floor and gpu < 0.5 * floor
    gpu, host = times(16384, 4, 1)  # 2,048 per expert GEMM
    assert host == floor and 0.85 * floor < gpu < floor
    gpu, host = times(4096, 2, 4)  # 4,096 per expert GEMM
    assert host == floor and gpu > 1.5 * floor


def test_the_expert_host_floor_only_slows_host_bound_moe_layouts():
    """Switching the floor off speeds the Qwen3-235B TP4 EP8 layout (512 tokens per expert GEMM)
    up by about 2x, as measured against predicted before it; the TP2 EP32 layout (4,096 tokens per
    expert GEMM) and a dense model do not move."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    no_floor = dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0)
    qwen = {"seq_len": 4096, "global_batch_size": 2048}

    def step(model: str, training: dict[str, Any], cal: Any, **layout: Any) -> float:
        return _scored(model, "dgx-h100", 256, training, cal, **layout)[1].step_time_s

    tp4 = {"tp": 4, "pp": 8, "ep": 8, "vpp": 4, "micro_batch_size": 1, "recompute": "none"}
    assert 1.8 < step("qwen3-235b-a22b", qwen, DEFAULT, **tp4) / step("qwen3-235b-a22b", qwen, no_floor, **tp4) < 2.3
    tp2 = {"tp": 2, "pp": 8, "ep": 32, "vpp": 4, "micro_batch_size": 1, "recompute": "selective"}
    assert step("qwen3-235b-a22b", qwen, DEFAULT, **tp2) == step("qwen3-235b-a22b", qwen, no_floor, **tp2)
    dense = {"seq_len": 8192, "global_batch_size": 256}
    llama = {"tp": 8, "pp": 1, "micro_batch_size": 1, "recompute": "selective"}
    assert step("llama3-70b", dense, DEFAULT, **llama) == step("llama3-70b", dense, no_floor, **llama)


def test_a_host_bound_moe_plan_says_so_with_the_step_it_would_take_otherwise():
    def notes(**layout: Any) -> list[str]:
        plan = evaluate(EvaluateRequest(
            model={"preset": "qwen3-235b-a22b"}, training={"seq_len": 4096, "global_batch_size": 2048},
            cluster={"preset": "dgx-h100", "num_gpus": 256}, config=layout,
        ))  # fmt: skip
        return [n for n in plan.notes if n.startswith("expert GEMMs are host bound")]

    (note,) = notes(tp=4, pp=8, ep=8, vpp=4, micro_batch_size=1, recompute="none")
    assert "16 local experts gets about 512 tokens" in note
    fast, slow = (float(x) for x in re.findall(r"take ([\d.]+) s a step instead of ([\d.]+) s", note)[0])
    assert 1.8 < slow / fast < 2.3
    assert notes(tp=2, pp=8, ep=32, vpp=4, micro_batch_size=1, recompute="selective") == []


def test_a_stack_without_host_splits_drops_the_expert_floor():
    """``training.expert_gemm_host_splits: false`` (a device-side grouped GEMM, CUDA graphs over
    the experts) costs the layout as the calibration without the floor does."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    layout = {"tp": 4, "pp": 8, "ep": 8, "vpp": 4, "micro_batch_size": 1, "recompute": "none"}
    training = {"seq_len": 4096, "global_batch_size": 2048}
    no_floor = dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0)
    device = _scored("qwen3-235b-a22b", "dgx-h100", 256, {**training, "expert_gemm_host_splits": False}, **layout)[1]
    host = _scored("qwen3-235b-a22b", "dgx-h100", 256, training, **layout)[1]
    free = _scored("qwen3-235b-a22b", "dgx-h100", 256, training, no_floor, **layout)[1]
    assert device.step_time_s == free.step_time_s < 0.55 * host.step_time_s
