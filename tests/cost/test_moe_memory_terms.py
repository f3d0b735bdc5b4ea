"""MoE memory as Megatron-Core holds it (000c4ac2): DeepEP's buffers (``fused_a2a.py``
``get_buffer`` with DeepEP's size hints), the routed-token copies an MoE layer keeps at once
(``moe_layer.py`` ``custom_forward``) and the expert overlap's extra warm-up micro-batch
(``schedules.py``)."""

from __future__ import annotations

import pytest

from optimizer.cost.context import build_context
from optimizer.cost.deepep_buffers import WORKSPACE_BYTES, deepep_buffer_bytes
from optimizer.cost.layer import layer_compute
from optimizer.cost.pipeline import in_flight_microbatches
from optimizer.cost.routing import routing_load
from optimizer.cost.rules import Dims
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec
from optimizer.units import GIB

MIB = 1 << 20


def test_deepep_buffers_hand_computed() -> None:
    """Qwen3-235B (hidden 4096) over 8 ranks: NVLink only, 10 channels x 8 ranks x 256 received
    tokens x (8,192 row bytes + 8 meta + 128 x (8 + 4 + 4) index, weight and scale bytes) plus
    the channel counters, 195 MiB; over 64 ranks DeepSeek-V3 (7168) adds RDMA: 0.70 GiB."""
    nvl8 = 10 * 8 * 5 * 4 + 10 * 8 * 256 * (8192 + 8 + 128 * 16)
    assert deepep_buffer_bytes(4096, 8) == pytest.approx(-(-nvl8 // 128) * 128 + WORKSPACE_BYTES)
    assert (deepep_buffer_bytes(4096, 8) - WORKSPACE_BYTES) / MIB == pytest.approx(200.16, abs=0.01)
    assert (deepep_buffer_bytes(7168, 64) - WORKSPACE_BYTES) / GIB == pytest.approx(0.695, abs=0.001)
    assert deepep_buffer_bytes(4096, 1) == 0.0
    sizes = [deepep_buffer_bytes(4096, n) for n in (8, 16, 32, 64)]
    assert sizes == sorted(sizes)  # more ranks, more buffer


def _qwen3(dispatcher: str, **config: object) -> float:
    req = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 512, "moe_dispatcher": dispatcher},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "config": {"tp": 1, "pp": 8, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full", **config},
    }
    return evaluate(EvaluateRequest.model_validate(req)).memory_gib.buffers


def test_deepep_plans_carry_its_buffers() -> None:
    extra = _qwen3("deepep") - _qwen3("alltoall")
    assert extra * GIB == pytest.approx(deepep_buffer_bytes(4096, 8), rel=1e-6)


@pytest.mark.parametrize(("recompute", "rerun"), [("none", False), ("selective", False), ("full", True)])
def test_moe_layer_working_set_holds_four_routed_copies(recompute: str, rerun: bool) -> None:
    """Qwen3-235B at EP8 (16 local experts), TP1, 4,096 tokens: the layer holds four top-8 copies
    of each token's 4,096-wide row and the layer input at once, 270,336 bytes a token, above the
    layer's own kept set; a re-run block (full recompute) adds them to it."""
    job = JobSpec.model_validate({
        "model": {"preset": "qwen3-235b-a22b"}, "training": {"seq_len": 4096, "global_batch_size": 512},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
    })  # fmt: skip
    ctx = build_context(job)
    kind = next(k for k in ctx.kinds if k.is_moe)
    d = Dims(tp=1, cp=1, ep=8, micro_batch_size=1, sequence_parallel=False, recompute=recompute)
    working = layer_compute(ctx, kind, d).working_act_bytes
    copies = (4 * 8 * routing_load(ctx) * 4096 + 4096) * 2 * 4096
    one_expert_each = layer_compute(ctx, kind, Dims(1, 1, 128, 1, False, recompute)).working_act_bytes
    full_set = one_expert_each  # 1 local expert: no sorted copies, the layer's kept set only
    if rerun:
        assert working == pytest.approx(full_set + copies)
    else:
        assert working == pytest.approx(max(full_set, copies)) and working == pytest.approx(copies)


def test_the_expert_overlap_holds_one_more_warmup_chunk() -> None:
    """PP8 VPP3 with 32 micro-batches, stage 0: 14 + 16 + 1 = 31 chunk-micro-batches, 32 with the
    overlap's extra warm-up forward; capped at m x vpp."""
    assert in_flight_microbatches(0, 8, 3, 32) == pytest.approx(31 / 3)
    assert in_flight_microbatches(0, 8, 3, 32, 1) == pytest.approx(32 / 3)
    assert in_flight_microbatches(0, 8, 3, 2, 1) == pytest.approx(2.0)


def test_a_plan_with_the_expert_overlap_holds_the_extra_warmup_chunk() -> None:
    """Mixtral 8x7B, TP1 PP4 VPP2 EP8, 32 micro-batches: stage 0 holds 6 + 4 + 1 = 11 chunks
    without the overlap and 12 with it, one more chunk (a quarter of 32 layers / 4 stages / 2)
    of stored activations; nothing else in the memory moves."""
    req = {
        "model": {"preset": "mixtral-8x7b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024, "grad_reduce_in_fp32": True},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "config": {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
    }
    plain = evaluate(EvaluateRequest.model_validate(req)).memory_gib.per_stage[0]
    overlap_req = {**req, "training": {**req["training"], "ep_comm_overlap": True}}
    overlap = evaluate(EvaluateRequest.model_validate(overlap_req)).memory_gib.per_stage[0]
    assert (overlap.weights, overlap.gradients, overlap.optimizer) == (plain.weights, plain.gradients, plain.optimizer)
    # activations = held chunks / vpp x stored + working: one more of 11 chunks
    assert overlap.activations > plain.activations
    per_chunk = overlap.activations - plain.activations
    assert plain.activations > 10 * per_chunk  # 11 chunks' stored plus the working set


def test_the_expert_overlap_hides_nothing_with_one_micro_batch_and_no_pipeline() -> None:
    """Without a pipeline Megatron's combined 1F1B runs the first forward and the last backward
    alone: with one micro-batch the overlap hides none of the all-to-all (the same ep_comm as
    without it), with four it hides three micro-batches' share."""

    def ep_comm(overlap: bool, gbs: int) -> float:
        req = {
            "model": {"preset": "mixtral-8x7b"},
            "training": {"seq_len": 4096, "global_batch_size": gbs, "ep_comm_overlap": overlap},
            "cluster": {"preset": "dgx-h100", "num_gpus": 64},
            "config": {"tp": 1, "pp": 1, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"},
        }
        return evaluate(EvaluateRequest.model_validate(req)).time_breakdown_s.ep_comm

    assert ep_comm(True, 64) == pytest.approx(ep_comm(False, 64), rel=1e-9)
    from optimizer.calibration import DEFAULT

    lost = DEFAULT.ep_comm_overlap_batched * (1 - DEFAULT.overlap_contention)
    per_mb_exposed = ep_comm(False, 256) / 4 * (1 - lost)  # the overlapped share of one micro-batch
    assert ep_comm(True, 256) == pytest.approx(4 * per_mb_exposed + ep_comm(False, 256) / 4 * lost, rel=1e-9)
