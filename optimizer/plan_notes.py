"""What a plan's notes say about its estimate: what it assumed, and what running it differently
(another recompute, no overlap, another framework's settings) would take."""

from __future__ import annotations

from dataclasses import replace

from optimizer.cost import Estimate, build_context, estimate
from optimizer.cost.flops import MEGATRON_SELECTIVE
from optimizer.cost.gpu_rates import catalog_gemm_efficiency
from optimizer.cost.layer import expert_gemm_times_s, routed_tokens_per_gpu
from optimizer.cost.memory import shard_group_sizes
from optimizer.launch import megatron_recompute_modules
from optimizer.launch.bridge_sections import recipe_has_section
from optimizer.launch.environment import bridge_fsdp_connections_note, unordered_tp_overlap_note
from optimizer.launch.megatron import delayed_wgrad_te_note
from optimizer.launch.nemo import bridge_delayed_wgrad_te_note, first_last_bf16_note, tp_overlap_left_to_recipe_note
from optimizer.modes import is_low_bit
from optimizer.reference import current
from optimizer.specs import JobSpec
from optimizer.specs.search import MAX_MEMORY_HEADROOM_GIB
from optimizer.units import GIB, to_gib

MEGATRON_IDS = ("megatron-lm", "megatron-bridge")
MEMORY_MEDIAN_ERROR = 0.051
"""The memory model's median |error| against published peak memory (``benchmarks/memory_check.py``,
docs/memory_check.md; a test holds the two equal): a plan with less free memory than this share of
its peak may not fit as run."""
MEMORY_WORST_UNDER = 0.15
"""The furthest the model fell under a published peak there (same source)."""


def estimate_notes(job: JobSpec, est: Estimate, ranges_note: str | None, frameworks: list[str]) -> list[str]:
    """What the estimate assumed for this layout, and what running it differently would take
    (``frameworks``: those that run it as costed, whose settings the notes name)."""
    lay = est.layout
    notes = list(est.notes)
    if not lay.uniform_split:
        notes.append(f"non-uniform layer split per pipeline chunk: {list(lay.stage_layers)}")
    if job.training.precision == "fp4":
        fraction = "the given fraction" if job.cluster.gemm_efficiency is not None else "the FP8 fraction"
        notes.append(
            f"fp4: every linear layer's GEMMs at the FP4 rate with {fraction} of peak (no published FP4 "
            "GEMM measurement); recipes that keep some layers in bf16 run slower"
        )
    portable = job.training.framework is None  # what the other frameworks' recompute would take
    if lay.recompute == "selective" and portable:
        notes += _selective_recompute_note(job, est)
        notes += _recompute_elsewhere_note(
            job, est, "op", "torchtitan runs recompute 'selective' as its op-level checkpointing (recompute 'op')"
        )
    unapplied = _tp_overlap_note(job, est)
    notes += unapplied
    if "megatron-bridge" in frameworks:  # costed without TP overlap: the recipe's may turn it on
        costed = job.training.model_copy(update={"tp_comm_overlap": False}) if unapplied else job.training
        inside = lay.sequence_parallel and est.placement.get("tp") == "nvlink"  # where the overlap applies
        notes += tp_overlap_left_to_recipe_note(job.model, costed, lay, can_overlap=inside)
        notes += bridge_delayed_wgrad_te_note(job.model, job.training, lay)
        notes += first_last_bf16_note(job.model, job.training, lay)
        if recipe_has_section(job.model) is not False:  # Bridge sets the variable with a comm_overlap section
            notes += bridge_fsdp_connections_note(job.training, lay, job.gpu_generation)
    if "megatron-lm" in frameworks:
        notes += delayed_wgrad_te_note(job.model, job.training, lay)
        notes += unordered_tp_overlap_note(job.model, job.training, lay, job.gpu_generation)
    notes += _dp_overlap_note(job, est, frameworks)
    notes += _pipeline_zero_note(job, est)
    notes += _blocking_sends_note(job, est, frameworks) + _p2p_overlap_kept_note(job, est, frameworks)
    notes += _host_bound_experts_note(job, est)
    notes += _memory_margin_note(est)
    notes += [ranges_note] if ranges_note else []
    notes += _unmeasured_gemm_note(job)
    if lay.recompute == "op" and portable:
        notes.append(
            "recompute 'op' is torchtitan's op-level selective checkpointing; Megatron-LM, Megatron-Bridge and "
            "DeepSpeed have none (their selective recompute re-runs the attention core instead)"
        )
        notes += _recompute_elsewhere_note(
            job, est, MEGATRON_SELECTIVE, "with Megatron-Core's selective recompute (recompute 'core_attn') instead"
        )
    return notes


def _selective_recompute_note(job: JobSpec, est: Estimate) -> list[str]:
    """What the plan's ``selective`` recompute assumes that Megatron-Core's selective recompute
    does not do, and the memory that costs. The cost model re-runs the norms and activation
    functions in backward (their outputs not kept), as torchtitan's op-level checkpointing does;
    with the modules the Megatron and Bridge arguments name (``core_attn``, plus ``mla_up_proj``
    on MLA models) Megatron-Core and Transformer Engine keep those outputs. The same layout,
    order and split costed with that recompute (``MEGATRON_SELECTIVE``) gives the memory."""
    megatron = _costed_again(job, est, recompute=MEGATRON_SELECTIVE)
    extra = megatron.peak_memory_bytes - est.peak_memory_bytes
    if extra < NOTE_MIN_EXTRA_BYTES:
        return []
    verdict = "still fits" if megatron.fits_memory else "does not fit"
    modules = ", ".join(megatron_recompute_modules(job.model, "selective") or (MEGATRON_SELECTIVE,))
    note = (
        "recompute 'selective' is costed with the norm and activation-function outputs re-made in "
        "backward (as torchtitan's op-level checkpointing does); Megatron-Core's selective recompute "
        f"with the modules the launch arguments name ({modules}) keeps them under Transformer Engine: "
        f"{to_gib(extra):.1f} GiB more on the peak stage, {to_gib(megatron.peak_memory_bytes):.1f} GiB of "
        f"{to_gib(est.usable_bytes):.1f} GiB usable ({verdict})"
    )
    return [note]


def _costed_again(job: JobSpec, est: Estimate, **layout_changes: object) -> Estimate:
    """The plan's layout (with ``layout_changes``), rank order and split costed for ``job``: what
    the notes compare the plan with."""
    layout = replace(est.layout, **layout_changes) if layout_changes else est.layout  # type: ignore[arg-type]  # callers name ResolvedLayout fields
    return estimate(build_context(job), layout, est.order, headroom_bytes=est.headroom_bytes)


NOTE_MIN_EXTRA_BYTES = 0.05 * GIB
"""Memory another way of running the plan must add before a note gives it."""


def _recompute_elsewhere_note(job: JobSpec, est: Estimate, recompute: str, who: str) -> list[str]:
    """The peak memory of the same layout, order and split with the recompute another framework
    runs for the plan's (``who``), when that needs ``NOTE_MIN_EXTRA_BYTES`` or more than the plan."""
    other = _costed_again(job, est, recompute=recompute)
    extra = other.peak_memory_bytes - est.peak_memory_bytes
    if extra < NOTE_MIN_EXTRA_BYTES:
        return []
    verdict = "fits" if other.fits_memory else "does not fit"
    note = (
        f"{who}, which keeps {to_gib(extra):.1f} GiB more on the peak stage: "
        f"{to_gib(other.peak_memory_bytes):.1f} GiB of {to_gib(est.usable_bytes):.1f} GiB usable ({verdict})"
    )
    return [note]


DP_OVERLAP_NOTE_MIN = 0.05
"""Relative slow-down from blocking data-parallel collectives above which a plan says so."""


def tp_overlap_unapplied(job: JobSpec, est: Estimate) -> bool:
    """Whether ``training.tp_comm_overlap`` is asked for on a layout it does not apply to, which
    is costed without it (and launched without it)."""
    return bool(_tp_overlap_note(job, est))


def _tp_overlap_note(job: JobSpec, est: Estimate) -> list[str]:
    """``training.tp_comm_overlap`` asked for on a layout the overlap does not apply to (it needs
    sequence parallelism and the TP group inside one NVLink domain): costed without it."""
    lay = est.layout
    if not job.training.tp_comm_overlap or lay.tp == 1:
        return []
    if not lay.sequence_parallel:
        why = "this layout runs TP without sequence parallelism"
    elif est.placement.get("tp") != "nvlink":
        why = f"this layout's TP group spans the {est.placement.get('tp')} tier, beyond one NVLink domain"
    else:
        return []
    return [
        f"training.tp_comm_overlap is not applied: {why} (the overlap needs sequence parallelism inside one NVLink domain)"
    ]


def _dp_overlap_note(job: JobSpec, est: Estimate, frameworks: list[str]) -> list[str]:
    """How much of the plan's step rests on hiding data-parallel collectives under compute: the
    same layout, order and split costed with ``training.dp_comm_overlap`` false. Said when that is
    at least ``DP_OVERLAP_NOTE_MIN`` slower, so that a stack run without the overlap flags the
    launch arguments set is not a surprise."""
    if not job.training.dp_comm_overlap or est.layout.dp * est.layout.cp == 1:
        return []
    blocking_job = job.model_copy(update={"training": job.training.model_copy(update={"dp_comm_overlap": False})})
    blocking = _costed_again(blocking_job, est)
    slower = blocking.step_time_s / est.step_time_s - 1.0
    if slower < DP_OVERLAP_NOTE_MIN:
        return []
    hidden_s = blocking.breakdown_s["dp_comm"] - est.breakdown_s["dp_comm"]
    zero = est.layout.zero_stage
    texts = DP_OVERLAP_ZERO3 if zero == 3 else DP_OVERLAP_FLAGS if zero >= 1 else DP_OVERLAP_FLAGS_ZERO0
    asks = "; ".join(dict.fromkeys(texts[f] for f in frameworks))
    how = f"the launch arguments ask for that overlap ({asks})" if asks else "the stack must overlap it"
    note = (
        f"{hidden_s:.2f} s of data-parallel communication per step is hidden under compute "
        f"(training.dp_comm_overlap); {how}; without it "
        f"the step takes {blocking.step_time_s:.3f} s ({100 * slower:.0f}% slower)"
    )
    return [note]


DP_OVERLAP_FLAGS = {
    "megatron-lm": "Megatron --overlap-grad-reduce --overlap-param-gather",
    "megatron-bridge": "Megatron-Bridge ddp.overlap_grad_reduce and ddp.overlap_param_gather",
    "torchtitan": "torchtitan's DDP and FSDP2 always overlap them",
    "deepspeed": "DeepSpeed overlap_comm",
}
"""What each framework's launch sets (or does always) to overlap ZeRO-1/2 data-parallel collectives."""
DP_OVERLAP_FLAGS_ZERO0 = {
    **DP_OVERLAP_FLAGS,
    "megatron-lm": "Megatron --overlap-grad-reduce",  # --overlap-param-gather needs the distributed optimizer
    "megatron-bridge": "Megatron-Bridge ddp.overlap_grad_reduce",
}
"""The same without ZeRO: no sharded weights to gather."""
DP_OVERLAP_ZERO3 = {
    "megatron-lm": "Megatron-FSDP always overlaps them",
    "megatron-bridge": "Megatron-FSDP always overlaps them",
    "torchtitan": "FSDP2 always prefetches them",
    "deepspeed": "DeepSpeed: a stage3_prefetch_bucket_size of one layer, without which each layer's weights are "
    "gathered on demand",
}
"""The same for ZeRO-3's weight gathers."""


def _host_bound_experts_note(job: JobSpec, est: Estimate) -> list[str]:
    """When the plan's routed-expert GEMMs are host bound (``layer.expert_gemm_times_s``): how
    small they are and what the step would take if the host kept out of the loop (the same
    layout, order and split costed with ``training.expert_gemm_host_splits`` false), since that
    depends on the stack (CUDA graphs, device-initiated grouped GEMMs)."""
    if job.model.moe is None:
        return []
    ctx = build_context(job)
    kind = next((k for k in ctx.kinds if k.is_moe), None)
    if kind is None:  # every layer dense (moe.first_dense_layers = num_layers)
        return []
    lay = est.layout
    d = lay.dims
    gpu_s, host_s = expert_gemm_times_s(ctx, kind, d)
    if host_s <= gpu_s:
        return []
    device_splits = job.training.model_copy(update={"expert_gemm_host_splits": False})
    free = _costed_again(job.model_copy(update={"training": device_splits}), est)
    local = job.model.moe.num_experts // lay.ep
    per_expert = routed_tokens_per_gpu(ctx, d) / local
    note = (
        f"expert GEMMs are host bound: each of the {local} local experts gets about {per_expert:,.0f} tokens per "
        f"micro-batch, {1e3 * gpu_s:.2f} ms of GPU work per MoE layer forward against {1e3 * host_s:.2f} ms for "
        "the host to issue the GEMMs once the router's token counts are read back; a stack that keeps the host "
        "out of the loop (CUDA graphs over the experts, a device-side grouped GEMM: "
        f"training.expert_gemm_host_splits false) would take {free.step_time_s:.3f} s a step instead of "
        f"{est.step_time_s:.3f} s; a larger ep or micro-batch also helps"
    )
    return [note]


def _pipeline_zero_note(job: JobSpec, est: Estimate) -> list[str]:
    """With pipeline parallelism the frameworks the launch arguments target run ZeRO-1 at most:
    Megatron-LM shards gradients and weights only through Megatron-FSDP, whose documented
    compatibility leaves out pipeline parallelism; torchtitan's pipeline schedule keeps FSDP2
    weights gathered and gradients unsharded all step; DeepSpeed's pipeline engine takes ZeRO 0
    or 1. For a ZeRO-2/3 plan with pp > 1, the same layout, order and split costed as ZeRO-1."""
    lay = est.layout
    if lay.pp == 1 or lay.zero_stage < 2 or shard_group_sizes(lay.dp, lay.cp, lay.tp, lay.ep) == (1, 1):
        return []  # (expert state shards over tp x dp x cp / ep even without data parallelism)
    zero1 = _costed_again(job, est, zero_stage=1)
    verdict = "fits" if zero1.fits_memory else "does not fit"
    note = (
        f"zero_stage {lay.zero_stage} with pipeline parallelism: Megatron-LM shards gradients only through "
        "Megatron-FSDP, whose documented compatibility leaves out pipeline parallelism, torchtitan's "
        "pipeline schedule keeps FSDP2 weights and gradients whole all step, and DeepSpeed's pipeline "
        f"engine takes ZeRO 0 or 1; run as ZeRO-1 this layout needs {to_gib(zero1.peak_memory_bytes):.1f} GiB "
        f"of {to_gib(est.usable_bytes):.1f} GiB usable ({verdict}) and steps in {zero1.step_time_s:.3f} s "
        "(search.allow.zero_stage [0, 1] plans for those frameworks)"
    )
    return [note]


def _blocking_sends_note(job: JobSpec, est: Estimate, frameworks: list[str]) -> list[str]:
    """A non-interleaved pipeline costed with blocking sends although the job overlaps them
    (``JobContext.p2p_blocks_without_vpp``): the Megatron frameworks among its targets overlap
    sends only interleaved, or no framework runs the job's stack and the larger time is charged."""
    lay = est.layout
    if lay.pp == 1 or lay.vpp > 1 or not job.training.pp_comm_overlap:
        return []
    if not build_context(job).p2p_blocks_without_vpp:
        return []
    lead = f"pipeline sends costed as blocking ({est.breakdown_s['pp_comm']:.3f} s a step)"
    if job.training.framework not in (None, *MEGATRON_IDS):
        return [f"{lead}: no framework runs this job's stack as costed, so the larger time is charged"]
    faster = "; torchtitan overlaps them (faster than planned)" if "torchtitan" in frameworks else ""
    return [f"{lead}: Megatron-LM and Megatron-Bridge overlap them only in interleaved schedules (vpp > 1){faster}"]


def _p2p_overlap_kept_note(job: JobSpec, est: Estimate, frameworks: list[str]) -> list[str]:
    """``pp_comm_overlap`` false on an interleaved two-stage pipeline: without the overlap Megatron-
    Core's interleaved schedule would send and receive twice between the same two ranks in one
    communication batch (Megatron-LM's ``validate_args`` refuses it; Megatron-Bridge does not check),
    so the launches leave it on and the plan's blocking sends are an upper bound."""
    lay = est.layout
    where = {"megatron-lm": "Megatron-LM", "megatron-bridge": "Megatron-Bridge"}
    megatron = [where[f] for f in frameworks if f in where]
    if job.training.pp_comm_overlap or lay.pp != 2 or lay.vpp == 1 or not megatron:
        return []
    return [
        f"training.pp_comm_overlap false is not applied on {' and '.join(megatron)}: with 2 stages the interleaved "
        "schedule without the p2p overlap would send and receive twice between the same two ranks in one batch "
        f"(Megatron-LM refuses it), so the sends overlap ({est.breakdown_s['pp_comm']:.3f} s a step costed blocking)"
    ]


def _unmeasured_gemm_note(job: JobSpec) -> list[str]:
    """The GEMM efficiency every compute time rests on, where it is not the catalog's measurement
    on this GPU: given by the request (``cluster.gemm_efficiency``), or carried over from another
    part or precision (the catalog's ``kind``)."""
    gpu = current().catalog.gpus[job.cluster.gpu or ""]
    low_bit = is_low_bit(job.training.precision)
    catalog = catalog_gemm_efficiency(gpu, low_bit)
    given = job.cluster.gemm_efficiency
    if given is not None:
        return [
            f"GEMMs costed at cluster.gemm_efficiency {given:.3f} of the {job.training.precision} peak as given "
            f"(the catalog's for {job.cluster.gpu}: {catalog.value:.3f}, {catalog.kind}"
            f"{' at fp8' if job.training.precision == 'fp4' else ''})"
        ]
    if low_bit and catalog is catalog_gemm_efficiency(gpu, low_bit=False):
        return [
            f"{job.cluster.gpu} has no measured low-precision GEMM efficiency: its {job.training.precision} GEMMs "
            f"run at its bf16 fraction of peak ({catalog.value:.3f})"
        ]
    if catalog.kind == "measured":
        return []
    return [
        f"{job.cluster.gpu}'s GEMM efficiency ({catalog.value:.3f} of peak) is {catalog.kind}, not measured: "
        f"{catalog.note or catalog.source}"
    ]


def _memory_margin_note(est: Estimate) -> list[str]:
    """A plan that fits with less free memory than the memory model's median error: say so, and
    what ``search.memory_headroom_gib`` would plan with that margin."""
    peak, capacity = est.peak_memory_bytes, est.capacity_bytes
    if not est.fits_memory or capacity - peak >= MEMORY_MEDIAN_ERROR * peak:
        return []
    headroom = min(-(-(MEMORY_MEDIAN_ERROR * capacity) // GIB), MAX_MEMORY_HEADROOM_GIB)
    return [
        f"memory: {to_gib(peak):.1f} of the GPU's {to_gib(capacity):.1f} GiB leaves less free than the memory "
        f"model's median error against published peaks ({MEMORY_MEDIAN_ERROR:.1%}; up to {MEMORY_WORST_UNDER:.0%} "
        f"under: docs/memory_check.md); search.memory_headroom_gib {headroom:.0f} plans with that margin"
    ]
