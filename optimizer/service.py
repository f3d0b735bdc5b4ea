"""The one facade that the HTTP API, the CLI and every export call: plan(), evaluate() and compare()."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from optimizer.capacity.annotate import annotate, resolve_inputs
from optimizer.capacity.plans import finish
from optimizer.compare import compare_plans
from optimizer.cost import Estimate, best_estimate, build_context, estimate, resolve_layout
from optimizer.cost.context import attention_kernel_class
from optimizer.cost.flops import MEGATRON_SELECTIVE
from optimizer.cost.layer import expert_gemm_times_s, routed_tokens_per_gpu
from optimizer.cost.memory import StageMemory, shard_group_sizes
from optimizer.cost.num import Num
from optimizer.error_bands import plan_ranges
from optimizer.errors import InvalidLayout
from optimizer.explain import explain
from optimizer.framework_runs import running_frameworks
from optimizer.frameworks import costed_config
from optimizer.frameworks import profile as framework_profile
from optimizer.job_warnings import job_warnings, plan_warnings
from optimizer.launch import build_launch, megatron_recompute_modules
from optimizer.launch.deepspeed import deepspeed_notes
from optimizer.launch.torchtitan import torchtitan_notes
from optimizer.placement.plan import evaluate_on_topology, plan_on_topology
from optimizer.reference import current
from optimizer.results import (
    CompareResponse,
    LaunchArgs,
    MemoryBreakdown,
    Plan,
    PlanResponse,
    StageMemoryGiB,
    TimeBreakdown,
)
from optimizer.search import SearchResult, search
from optimizer.specs import CompareRequest, EvaluateRequest, JobSpec, PlanRequest
from optimizer.units import GIB, TFLOPS, to_gib


def evaluate(request: EvaluateRequest) -> Plan:
    """Score one layout with the cost model. Raises ``InvalidLayout`` for an invalid layout."""
    if request.cluster.topology is not None:
        return evaluate_on_topology(request, _evaluate_placed)
    return _evaluate_placed(request)


def _evaluate_placed(request: EvaluateRequest) -> Plan:
    """``evaluate`` once the job's GPUs (and, with a topology, its nodes) are fixed."""
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    ctx = build_context(job)
    lay = resolve_layout(job, costed_config(job.training, request.config))
    placement = None
    if request.config.placement is not None:
        placement = {k: v for k, v in request.config.placement.model_dump().items() if v is not None}
    est = best_estimate(ctx, lay, placement)
    return annotate(resolve_inputs(request), to_plan(job, est))


def to_plan(job: JobSpec, est: Estimate, launch: bool = True) -> Plan:
    """The contract's ``Plan`` for an estimate (numbers straight from the cost model)."""
    lay = est.layout
    config = lay.to_spec()
    n = job.cluster.resolved_num_gpus
    tokens_per_s = est.tokens_per_step / est.step_time_s
    memory = _memory_breakdown(est)
    ranges = plan_ranges(job, est.step_time_s, tokens_per_s / n)
    notes = _estimate_notes(job, est, ranges.note)
    gpu = current().catalog.gpus[job.cluster.gpu]  # type: ignore[index]
    kernel = attention_kernel_class(job, gpu)
    if kernel != job.training.attention_kernel and "attention_kernel" in job.training.model_fields_set:
        notes.append(
            f"attention_kernel flash3: {gpu.name} ({gpu.generation}) has no FlashAttention-3-class "
            "kernels; attention costed as flash2"
        )
    # launch arguments select the attention backend that was costed
    training = job.training.model_copy(update={"attention_kernel": kernel})
    runs, why_not = running_frameworks(job.training, lay, job.model)
    notes += [f"runs on no framework as costed: {reason}" for reason in why_not]
    fields = tuple(p.launch_field for p in runs)
    launch_args = build_launch(job.model, training, lay, fields) if launch else None
    if "deepspeed" in fields:
        notes += deepspeed_notes(job.training, lay)
    if "torchtitan" in fields:
        notes += torchtitan_notes(lay)
    if job.training.framework is not None:  # the plan speaks the framework's names where it has one
        own = framework_profile(job.training.framework).own_recompute(lay.recompute)
        config = config.model_copy(update={"recompute": own or lay.recompute})
    return Plan(
        config=config,
        placement=est.placement,
        step_time_s=est.step_time_s,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / n,
        tokens_per_s_per_gpu_range=ranges.tokens_per_s_per_gpu,
        step_time_s_range=ranges.step_time_s,
        mfu=est.mfu,
        hfu=est.hfu,
        model_tflops_per_gpu=est.model_flops_per_step / est.step_time_s / n / TFLOPS,
        time_breakdown_s=TimeBreakdown(**est.breakdown_s),
        memory_gib=memory,
        fits_memory=est.fits_memory,
        bottleneck=est.bottleneck,
        launch=launch_args,
        frameworks=[p.id for p in runs],
        notes=notes,
    )


def _memory_breakdown(est: Estimate) -> MemoryBreakdown:
    """The peak stage's memory by category, with every stage's, in GiB."""
    peak = est.memory[est.peak_stage]
    return MemoryBreakdown(
        weights=_gib(peak.weights_bytes),
        gradients=_gib(peak.gradients_bytes),
        optimizer=_gib(peak.optimizer_bytes),
        activations=_gib(peak.activations_bytes),
        buffers=_gib(peak.buffers_bytes),
        total=_gib(peak.total_bytes),
        capacity=est.capacity_bytes / GIB,
        headroom=to_gib(est.headroom_bytes),
        stage=est.peak_stage,
        per_stage_total=[_gib(m.total_bytes) for m in est.memory],
        per_stage=[_stage_memory(m) for m in est.memory],
    )


def _estimate_notes(job: JobSpec, est: Estimate, ranges_note: str | None) -> list[str]:
    """What the estimate assumed for this layout, and what running it differently would take."""
    lay = est.layout
    notes = list(est.notes)
    if not lay.uniform_split:
        notes.append(f"non-uniform layer split per pipeline chunk: {list(lay.stage_layers)}")
    if job.training.precision == "fp4":
        notes.append(
            "fp4: every linear layer's GEMMs at the FP4 rate with the FP8 fraction of peak (no published FP4 "
            "GEMM measurement); recipes that keep some layers in bf16 run slower"
        )
    if lay.recompute == "selective":
        notes += _selective_recompute_note(job, est)
        notes += _recompute_elsewhere_note(
            job, est, "op", "torchtitan runs recompute 'selective' as its op-level checkpointing (recompute 'op')"
        )
    notes += _tp_overlap_note(job, est)
    notes += _dp_overlap_note(job, est)
    notes += _pipeline_zero_note(job, est)
    notes += _host_bound_experts_note(job, est)
    notes += [ranges_note] if ranges_note else []
    if lay.recompute == "op":
        notes.append(
            "recompute 'op' is torchtitan's op-level selective checkpointing; Megatron-LM, Megatron-Bridge and "
            "DeepSpeed have none (their selective recompute re-runs the attention core instead)"
        )
        notes += _recompute_elsewhere_note(
            job, est, MEGATRON_SELECTIVE, "with Megatron-Core's selective recompute (recompute 'core_attn') instead"
        )
    return notes


def _gib(num_bytes: Num) -> float:
    """``to_gib`` of an estimate's memory term: a number on the one-layout path (arrays only in
    ``cost.columns``)."""
    return to_gib(cast(float, num_bytes))


def _stage_memory(mem: StageMemory) -> StageMemoryGiB:
    return StageMemoryGiB(
        weights=_gib(mem.weights_bytes),
        gradients=_gib(mem.gradients_bytes),
        optimizer=_gib(mem.optimizer_bytes),
        activations=_gib(mem.activations_bytes),
        buffers=_gib(mem.buffers_bytes),
        total=_gib(mem.total_bytes),
    )


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


def _dp_overlap_note(job: JobSpec, est: Estimate) -> list[str]:
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
    asks = (
        "DeepSpeed: a stage3_prefetch_bucket_size of one layer, without which each layer's weights are "
        "gathered on demand; Megatron-FSDP and FSDP2 always overlap them"
        if est.layout.zero_stage == 3
        else "Megatron --overlap-grad-reduce --overlap-param-gather, DeepSpeed overlap_comm"
    )
    note = (
        f"{hidden_s:.2f} s of data-parallel communication per step is hidden under compute "
        f"(training.dp_comm_overlap); the launch arguments ask for that overlap ({asks}); without it "
        f"the step takes {blocking.step_time_s:.3f} s ({100 * slower:.0f}% slower)"
    )
    return [note]


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


def plan(request: PlanRequest) -> PlanResponse:
    """Search ranked layouts for a job; plans carry goodput (and time to train), ranked by
    ``search.objective``, with suggested GPU counts (``optimizer.capacity``); the answer says what
    limits the top plan (``why``) and warns about a job that looks wrong."""
    if request.cluster.topology is not None:

        def search_placed(placed: PlanRequest) -> PlanResponse:
            # the free set bounds the GPU count: no suggested counts for a placed job
            quiet = placed.model_copy(update={"search": placed.search.model_copy(update={"suggest": False})})
            return _explained(quiet, finish(quiet, search_plans(quiet), search_plans))

        return plan_on_topology(request, search_placed)
    return _explained(request, finish(request, search_plans(request), search_plans))


def search_plans(request: PlanRequest) -> PlanResponse:
    """The search's answer to ``request`` as a response: its ranked estimates made plans."""
    return response_of(search(request))


def response_of(result: SearchResult) -> PlanResponse:
    """The ``PlanResponse`` of a search's result (``to_plan`` of each ranked estimate)."""
    plans = [to_plan(result.job, est) for est in result.estimates]
    return PlanResponse(
        status=result.status,
        plans=plans,
        solver=result.solver,
        explanation=result.explanation,
        warnings=list(result.warnings),
    )


def _explained(request: PlanRequest, response: PlanResponse) -> PlanResponse:
    """``response`` with ``why`` (and its summary as ``explanation``) and the job's warnings."""
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    warnings = [*response.warnings, *job_warnings(job)]
    if response.plans:
        warnings += plan_warnings(job, response.plans[0])
    update: dict[str, object] = {"warnings": warnings}
    why = explain(job, response.plans, response.solver)
    if why is not None:
        update |= {"why": why, "explanation": why.summary}
    return response.model_copy(update=update)


def compare(request: CompareRequest) -> CompareResponse:
    """Score the job under each layout (``evaluate``) and compare them with the first. Raises
    ``InvalidLayout`` at ``layouts.<i>.<field>`` for an invalid layout."""
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    plans = []
    for i, layout in enumerate(request.layouts):
        try:
            one = EvaluateRequest(model=job.model, training=job.training, cluster=job.cluster, config=layout)
            plans.append(evaluate(one))
        except InvalidLayout as exc:
            if exc.field.split(".")[0] in ("model", "training", "cluster"):
                raise  # the job itself (e.g. training.precision), not the layout
            raise InvalidLayout(f"layouts.{i}.{exc.field.removeprefix('config.')}", exc.reason) from exc
    warnings = job_warnings(job)
    for i, p in enumerate(plans):
        warnings += [f"layout {i}: {w}" for w in plan_warnings(job, p)]
    return CompareResponse(entries=compare_plans(plans), warnings=warnings)


__all__ = ["LaunchArgs", "compare", "evaluate", "plan", "to_plan"]
