"""Generated evaluate requests (hypothesis) and scoring helpers shared by the cost test modules."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, settings
from hypothesis import strategies as st

from optimizer.cost import Estimate, JobContext, best_estimate, build_context, resolve_layout
from optimizer.errors import InvalidLayout
from optimizer.results import Plan
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec, Layout

MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3")
RECOMPUTE_LEVELS = {
    "llama3-8b": ("none", "selective", "full"),
    "llama3-70b": ("none", "selective", "full"),
    "mixtral-8x7b": ("none", "selective", "moe", "full"),  # moe: the whole MoE block recomputed
    "deepseek-v3": ("none", "selective", "moe", "full"),  # MLA: selective also re-makes q, k, v
}
"""Recompute policies in order of increasing recompute, per model."""
NUM_EXPERTS = {"mixtral-8x7b": 8, "deepseek-v3": 256}
CLUSTER_GPUS = {
    "dgx-h100": (8, 16, 32, 64, 128, 256),
    "gb200-nvl72": (8, 16, 32, 64, 72, 144),
}
SETTINGS = settings(max_examples=30, deadline=None)
REL = 1e-9


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request as a plain dict: model, training, cluster and a layout built from divisors."""
    model = draw(st.sampled_from(MODELS))
    cluster = draw(st.sampled_from(sorted(CLUSTER_GPUS)))
    n = draw(st.sampled_from(CLUSTER_GPUS[cluster]))
    tp = draw(st.sampled_from(_divisors(n, 16)))
    pp = draw(st.sampled_from(_divisors(n // tp, 8)))
    cp = draw(st.sampled_from(_divisors(n // (tp * pp), 2)))
    dp = n // (tp * pp * cp)
    ep = 1
    if model in NUM_EXPERTS:
        ep = draw(st.sampled_from([e for e in _divisors(dp * cp, 8) if NUM_EXPERTS[model] % e == 0]))
    mbs = draw(st.sampled_from([1, 2]))
    m = pp * draw(st.sampled_from([1, 2, 4]))  # micro-batches: >= pp and a multiple of pp
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    return {
        "model": {"preset": model},
        "training": {
            "seq_len": draw(st.sampled_from([2048, 4096])),
            "global_batch_size": dp * mbs * m,
            # materialised scores only without context parallelism
            "attention_kernel": draw(st.sampled_from(["flash3", "flash2"] + (["unfused"] if cp == 1 else []))),
            "pp_comm_overlap": draw(st.booleans()),
            "dp_collectives": draw(st.sampled_from(["hierarchical", "flat"])),
            "dp_comm_overlap": draw(st.booleans()),
            "grad_reduce_in_fp32": draw(st.booleans()),
            "cross_entropy": draw(st.sampled_from(["fused", "unfused"])),
        },
        "cluster": {"preset": cluster, "num_gpus": n},
        "config": {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "ep": ep,
            "vpp": vpp,
            "micro_batch_size": mbs,
            "zero_stage": draw(st.sampled_from([0, 1, 2, 3])),
            "recompute": draw(st.sampled_from(RECOMPUTE_LEVELS[model])),
        },
    }


def _scored(
    model: str, cluster: str, num_gpus: int, training: dict[str, Any], cal: Any = None, **layout: Any
) -> tuple[JobContext, Estimate]:
    """A preset model on a preset cluster, one layout scored (its best rank order)."""
    job = JobSpec(model={"preset": model}, training=training, cluster={"preset": cluster, "num_gpus": num_gpus})
    ctx = build_context(job) if cal is None else build_context(job, cal)
    return ctx, best_estimate(ctx, resolve_layout(job, Layout(**layout)))


def _with(req: dict[str, Any], section: str, **changes: Any) -> dict[str, Any]:
    out = {k: dict(v) for k, v in req.items()}
    out[section].update(changes)
    return out


def _evaluate(req: dict[str, Any]) -> Plan:
    try:
        return evaluate(EvaluateRequest(**req))
    except InvalidLayout:
        assume(False)
        raise  # unreachable: assume(False) aborts the example


def _estimate(req: dict[str, Any]) -> Estimate:
    """The estimate ``evaluate`` scores (same context, layout and rank-order choice)."""
    job = JobSpec(model=req["model"], training=req["training"], cluster=req["cluster"])
    try:
        return best_estimate(build_context(job), resolve_layout(job, Layout(**req["config"])))
    except InvalidLayout:
        assume(False)
        raise


def _deepseek_v3_h800(recompute: str, **training: Any) -> tuple[JobContext, Estimate]:
    """DeepSeek-V3's published pre-training layout (report section 3.2: 2,048 H800, PP16, EP64
    over 8 nodes, ZeRO-1 data parallel; 4k sequences, batch 15,360, FP8 GEMMs), with 16-bit
    activations kept for backward."""
    job = JobSpec(
        model={"preset": "deepseek-v3"},
        training={
            "seq_len": 4096,
            "global_batch_size": 15360,
            "precision": "fp8",
            "fp8_saved_inputs": False,
            **training,
        },  # fmt: skip
        cluster={"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
    )
    ctx = build_context(job)
    layout = Layout(tp=1, pp=16, ep=64, micro_batch_size=1, zero_stage=1, recompute=recompute)
    return ctx, best_estimate(ctx, resolve_layout(job, layout))
