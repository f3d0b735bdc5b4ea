"""Properties the cost model must satisfy on every valid layout (hypothesis).

Layouts are drawn from divisors of the GPU count for real presets (llama3-8b, llama3-70b,
mixtral-8x7b on dgx-h100 and gb200-nvl72); layouts the validity rules reject are skipped.
Every property goes through ``optimizer.service.evaluate``, the entry point clients use, except
where a per-stage number is needed that a ``Plan`` does not carry (then the same cost-model
path ``evaluate`` takes is used).
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import assume, example, given

from optimizer.cost.context import clear_context_cache
from optimizer.cost.topology import clear_geometry_cache
from tests.cost.cost_helpers import RECOMPUTE_LEVELS, REL, SETTINGS, _estimate, _evaluate, _with, requests

# --------------------------------------------------------------------------- (a) bandwidth


@SETTINGS
@given(requests())
def test_more_network_bandwidth_never_slows_a_step(req):
    """The same layout on the same cluster with XDR 800G instead of NDR 400G NICs."""
    slow = _evaluate(_with(req, "cluster", network="ib-ndr-400"))
    fast = _evaluate(_with(req, "cluster", network="ib-xdr-800"))
    assert fast.step_time_s <= slow.step_time_s * (1 + REL)


# --------------------------------------------------------------------------- (b) ZeRO


def _request(model: str, num_gpus: int, seq: int, gbs: int, **config: Any) -> dict[str, Any]:
    return {
        "model": {"preset": model},
        "training": {"seq_len": seq, "global_batch_size": gbs},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "config": {"zero_stage": 0, "recompute": "selective", **config},
    }


@SETTINGS
@given(requests())
# No data-parallel ranks to shard over (dp * cp = 1): ZeRO-3 must not add gather buffers.
@example(req=_request("llama3-8b", 8, 2048, 2, tp=4, pp=2))
# MoE with ep = dp * cp and tp = 1: expert weights are not sharded by ZeRO-3 at all.
@example(req=_request("mixtral-8x7b", 8, 4096, 16, tp=1, pp=4, ep=2))
def test_higher_zero_stage_never_raises_memory(req):
    """With FSDP2's / DeepSpeed's buffers (``fsdp_buffers: layer``); Megatron-FSDP's queue of up
    to 1e9 unsharded gradient elements can outweigh what ZeRO-2 shards of a small model."""
    req = _with(req, "training", fsdp_buffers="layer")
    totals = [_evaluate(_with(req, "config", zero_stage=z)).memory_gib.total for z in (0, 1, 2, 3)]
    for lower, higher in itertools.pairwise(totals):
        assert higher <= lower * (1 + REL), totals


@SETTINGS
@given(requests())
# A stage whose gradients fit in one bucket (dp 2): FSDP2's two buckets are the stage's gradients once.
@example(req=_request("llama3-8b", 128, 2048, 8, tp=16, pp=4))
def test_megatron_fsdp_buffers_never_below_fsdp2s(req):
    """Megatron-FSDP holds at least what FSDP2 does beside the shards, at every ZeRO stage."""
    for z in (0, 1, 2, 3):
        at_z = _with(req, "config", zero_stage=z)
        megatron = _evaluate(_with(at_z, "training", fsdp_buffers="megatron-fsdp")).memory_gib.total
        layer = _evaluate(_with(at_z, "training", fsdp_buffers="layer")).memory_gib.total
        assert megatron >= layer * (1 - REL), (z, megatron, layer)


# --------------------------------------------------------------------------- (c) recompute


@SETTINGS
@given(requests())
def test_more_recompute_never_raises_activations_nor_lowers_hardware_work(req):
    """none -> selective -> (moe, MoE models) -> full: activations per stage never grow; hardware
    FLOPs never shrink.

    Activations are compared stage by stage (the ``Plan`` reports only the peak stage, which can
    change with the recompute policy). ``hfu * step_time_s`` is hardware FLOPs / (GPUs * peak).
    """
    levels = RECOMPUTE_LEVELS[req["model"]["preset"]]
    plans = [_evaluate(_with(req, "config", recompute=r)) for r in levels]
    work = [p.hfu * p.step_time_s for p in plans]
    acts = [[m.activations_bytes for m in _estimate(_with(req, "config", recompute=r)).memory] for r in levels]
    for i in range(len(levels) - 1):
        assert work[i + 1] >= work[i] * (1 - REL), (levels[i], levels[i + 1], work)
        for stage, (before, after) in enumerate(zip(acts[i], acts[i + 1], strict=False)):
            assert after <= before * (1 + REL), (levels[i], levels[i + 1], stage, before, after)


@SETTINGS
@given(requests())
def test_op_level_recompute_sits_between_none_and_full(req):
    """torchtitan's op-level policy keeps more than full recompute and, without tensor
    parallelism, less than no recompute (with it, the full-width partial sums it saves can exceed
    what no recompute keeps); its hardware work lies between theirs."""
    levels = ("none", "op", "full")
    plans = [_evaluate(_with(req, "config", recompute=r)) for r in levels]
    work = [p.hfu * p.step_time_s for p in plans]
    acts = [[m.activations_bytes for m in _estimate(_with(req, "config", recompute=r)).memory] for r in levels]
    for i in range(len(levels) - 1):
        assert work[i + 1] >= work[i] * (1 - REL), (levels, work)
        if i == 0 and req["config"]["tp"] > 1:
            continue
        for stage, (before, after) in enumerate(zip(acts[i], acts[i + 1], strict=False)):
            assert after <= before * (1 + REL), (levels[i], levels[i + 1], stage, before, after)


# --------------------------------------------------------------------------- (d) weak scaling


@SETTINGS
@given(requests())
def test_doubling_gpus_and_batch_never_grows_compute(req):
    """Double num_gpus and the global batch (so dp doubles): per-GPU work is unchanged. With an
    uneven layer split the breakdown's compute is the critical stage's, and which stage is
    critical can change with the rank order (TP over a slower tier makes an 11-layer stage
    critical instead of the 10-layer one with the output layer), so the split is even here."""
    base = _evaluate(req)
    assume(len(set(base.config.stage_layers or [0])) == 1)
    doubled = _with(req, "cluster", num_gpus=2 * req["cluster"]["num_gpus"])
    doubled["training"]["global_batch_size"] = 2 * req["training"]["global_batch_size"]
    big = _evaluate(doubled)
    assert big.config.dp == 2 * base.config.dp
    assert big.config.num_micro_batches == base.config.num_micro_batches
    assert big.time_breakdown_s.compute <= base.time_breakdown_s.compute * (1 + REL)


# --------------------------------------------------------------------------- (e) - (g)


@SETTINGS
@given(requests())
def test_step_time_is_the_sum_of_its_breakdown(req):
    plan = _evaluate(req)
    total = sum(plan.time_breakdown_s.model_dump().values())
    assert abs(plan.step_time_s - total) <= REL * plan.step_time_s


@SETTINGS
@given(requests())
def test_mfu_and_hfu_are_ordered_fractions(req):
    plan = _evaluate(req)
    assert 0 < plan.mfu <= plan.hfu < 1


@SETTINGS
@given(requests())
def test_evaluate_is_deterministic(req):
    first = _evaluate(req).model_dump_json()
    clear_context_cache()  # recompute everything from scratch the second time
    clear_geometry_cache()
    assert _evaluate(req).model_dump_json() == first
