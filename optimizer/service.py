"""The one facade that the HTTP API, the CLI and every export call: plan(), evaluate() and compare()."""

from __future__ import annotations

from typing import cast

from optimizer.capacity.annotate import annotate, resolve_inputs
from optimizer.capacity.plans import finish, reranked
from optimizer.compare import compare_plans
from optimizer.cost import Estimate, best_estimate, build_context, resolve_layout
from optimizer.cost.context import attention_kernel_class
from optimizer.cost.memory import StageMemory
from optimizer.cost.num import Num
from optimizer.error_bands import plan_ranges
from optimizer.errors import InvalidLayout
from optimizer.explain import explain
from optimizer.framework_runs import running_frameworks
from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import costed_config
from optimizer.frameworks import profile as framework_profile
from optimizer.job_warnings import inert_settings_note, job_warnings, plan_warnings
from optimizer.launch import build_launch
from optimizer.launch.bridge_sections import recipe_has_section
from optimizer.launch.deepspeed import deepspeed_notes
from optimizer.launch.nemo import NEMO_COMM_OVERLAP_NOTE
from optimizer.launch.torchtitan import torchtitan_notes
from optimizer.params import count_params
from optimizer.placement.plan import evaluate_on_topology, plan_on_topology
from optimizer.plan_notes import estimate_notes, tp_overlap_unapplied
from optimizer.rank_orders import is_pp_inside_dp
from optimizer.reference import current
from optimizer.results import (
    CompareResponse,
    LaunchArgs,
    MemoryBreakdown,
    Plan,
    PlannedJob,
    PlanResponse,
    SolverInfo,
    StageMemoryGiB,
    TimeBreakdown,
)
from optimizer.search import SearchResult, search
from optimizer.specs import CompareRequest, EvaluateRequest, JobSpec, Layout, PlanRequest
from optimizer.units import GIB, TFLOPS, to_gib


def evaluate(request: EvaluateRequest) -> Plan:
    """Score one layout with the cost model. Raises ``InvalidLayout`` for an invalid layout."""
    if request.cluster.topology is not None:
        return evaluate_on_topology(request, _evaluate_placed)
    return _evaluate_placed(request)


def _evaluate_placed(request: EvaluateRequest) -> Plan:
    """``evaluate`` once the job's GPUs (and, with a topology, its nodes) are fixed."""
    job = request.job_spec()
    ctx = build_context(job)
    lay = resolve_layout(job, costed_config(job.training, request.config))
    placement = None
    if request.config.placement is not None:
        placement = {k: v for k, v in request.config.placement.model_dump().items() if v is not None}
    headroom = None if request.memory_headroom_gib is None else request.memory_headroom_gib * GIB
    est = best_estimate(ctx, lay, placement, headroom)
    plan = annotate(resolve_inputs(request), to_plan(job, est))
    inert = inert_settings_note(job)
    return plan if inert is None else plan.model_copy(update={"notes": [*plan.notes, inert]})


def to_plan(job: JobSpec, est: Estimate) -> Plan:
    """The contract's ``Plan`` for an estimate (numbers straight from the cost model)."""
    lay = est.layout
    config = lay.to_spec()
    n = job.cluster.resolved_num_gpus
    tokens_per_s = est.tokens_per_step / est.step_time_s
    memory = _memory_breakdown(est)
    ranges = plan_ranges(job, est.step_time_s, tokens_per_s / n)
    gpu = current().catalog.gpus[job.cluster.gpu]  # type: ignore[index]
    kernel = attention_kernel_class(job, gpu)  # the frameworks must run, and launch, the kernel costed
    costed = job.training.model_copy(update={"attention_kernel": kernel})
    runs, why_not = running_frameworks(costed, lay, job.model, est.order, est.placement.get("tp"), gpu.generation)
    notes = estimate_notes(job, est, ranges.note, [p.id for p in runs])
    if kernel != job.training.attention_kernel and "attention_kernel" in job.training.model_fields_set:
        notes.append(
            f"attention_kernel flash3: {gpu.name} ({gpu.generation}) has no FlashAttention-3-class "
            "kernels; attention costed as flash2"
        )
    # launch arguments select the attention backend and the TP overlap that were costed
    unapplied = {"tp_comm_overlap": False} if tp_overlap_unapplied(job, est) else {}
    training = costed.model_copy(update=unapplied) if unapplied else costed
    if why_not:  # one line: each framework's reason (a layout rule's with its source)
        notes.append("runs on no framework as costed: " + "; ".join(why_not))
    fields = tuple(p.launch_field for p in runs)
    launch_args = build_launch(job.model, training, lay, fields, is_pp_inside_dp(est.order, lay.sizes()))
    if "deepspeed" in fields:
        notes += deepspeed_notes(job.training, lay)
    if "torchtitan" in fields:
        notes += torchtitan_notes(lay)
    if "comm_overlap." in launch_args.nemo and recipe_has_section(job.model) is None:
        notes.append(NEMO_COMM_OVERLAP_NOTE)
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
        optimizer_step=_gib(peak.optimizer_step_bytes),
        total=_gib(peak.total_bytes),
        capacity=est.capacity_bytes / GIB,
        headroom=to_gib(est.headroom_bytes),
        stage=est.peak_stage,
        per_stage_total=[_gib(m.total_bytes) for m in est.memory],
        per_stage=[_stage_memory(m) for m in est.memory],
    )


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
        optimizer_step=_gib(mem.optimizer_step_bytes),
        total=_gib(mem.total_bytes),
    )


def plan(request: PlanRequest) -> PlanResponse:
    """Search ranked layouts for a job; plans carry goodput (and time to train), ranked by
    ``search.objective``, with suggested GPU counts (``optimizer.capacity``); the answer says what
    limits the top plan (``why``), warns about a job that looks wrong and says what was planned."""
    return _plan(request).model_copy(update={"planned": planned_job(request.job_spec())})


def planned_job(job: JobSpec) -> PlannedJob:
    """The job as the planner resolved it: the model's name and parameters, GPUs, precision."""
    params = count_params(job.model)
    return PlannedJob(
        model=job.model.name or job.model.preset or "custom",
        total_params=params.total,
        active_params=params.active,
        gpu=job.cluster.gpu or "",
        num_gpus=job.cluster.num_gpus,
        precision=job.training.precision,
        framework=job.training.framework,
    )


def _plan(request: PlanRequest) -> PlanResponse:
    if (topology := request.cluster.topology) is not None:
        request, cut_note = _assignments_bounded(request)
        chosen = request.cluster.num_gpus is None and topology.assignment is None

        def search_placed(placed: PlanRequest) -> PlanResponse:
            # the free set bounds the GPU count: no suggested counts for a placed job
            quiet = placed.model_copy(update={"search": placed.search.model_copy(update={"suggest": False})})
            try:
                return _explained(quiet, finish(quiet, search_plans(reranked(quiet)), search_plans))
            except InvalidLayout as err:
                if not (chosen and err.field.startswith("search.")):
                    raise
                # a pin this GPU count cannot take, where the planner picked the count: no layout here
                return PlanResponse(status="infeasible", plans=[], solver=SolverInfo(), explanation=str(err))

        answer = plan_on_topology(request, search_placed)
        if cut_note and answer.plans:
            return answer.model_copy(update={"warnings": [*answer.warnings, cut_note]})
        return answer
    return _explained(request, finish(request, search_plans(reranked(request)), search_plans))


MAX_ASSIGNED_NODES_PER_ANSWER = 32_768
"""Most node entries the plans of one answer list in their ``assignment`` (each plan lists its
nodes in several forms, about 400 bytes a node): bounds the answer's size and assembly time."""


def _assignments_bounded(request: PlanRequest) -> tuple[PlanRequest, str | None]:
    """``request`` with ``search.top_k`` cut so its plans' assignments list at most
    ``MAX_ASSIGNED_NODES_PER_ANSWER`` nodes, and the warning that says so (None: not cut)."""
    nodes = len(request.cluster.topology.nodes) if request.cluster.topology is not None else 0
    used = min(nodes, request.cluster.num_gpus or nodes)  # a plan's nodes: at most one a GPU
    cap = max(1, MAX_ASSIGNED_NODES_PER_ANSWER // max(used, 1))
    if request.search.top_k <= cap:
        return request, None
    note = (
        f"search.top_k {request.search.top_k} cut to {cap}: each plan lists its node assignment (up to {used:,} "
        f"nodes), and an answer lists at most {MAX_ASSIGNED_NODES_PER_ANSWER:,} node entries"
    )
    return request.model_copy(update={"search": request.search.model_copy(update={"top_k": cap})}), note


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
    job = request.job_spec()
    warnings = [*response.warnings, *job_warnings(job)]
    if response.plans:
        warnings += plan_warnings(job, response.plans[0])
    update: dict[str, object] = {"warnings": warnings}
    why = explain(job, response.plans, response.solver)
    if why is not None:
        update |= {"why": why, "explanation": why.summary}
    return response.model_copy(update=update)


def _layout_error(job: JobSpec, exc: InvalidLayout, i: int) -> InvalidLayout:
    """``exc`` of layout ``i`` of a comparison, at ``layouts.<i>.<field>`` (or the job's field)."""
    reason = exc.reason.replace("config.", f"layouts.{i}.")
    if exc.field == "cluster.num_gpus" and job.cluster.num_gpus is None:  # the layout sized the job
        return InvalidLayout(f"layouts.{i}.dp", reason)
    if exc.field.split(".")[0] in ("model", "training", "cluster"):
        return InvalidLayout(exc.field, reason)  # the job itself, not the layout
    return InvalidLayout(f"layouts.{i}.{exc.field.removeprefix('config.')}", reason)


def _checked_off_topology(job: JobSpec, layout: Layout, i: int) -> None:
    """Layout ``i``'s rules on the job's GPU count without its nodes (choosing nodes takes seconds
    on a large topology): a layout that breaks them raises before any node choice."""
    size = job.cluster.num_gpus or layout.stated_gpus
    if not size:
        return  # the node choice says what is missing
    flat = job.model_copy(update={"cluster": job.cluster.model_copy(update={"topology": None, "num_gpus": size})})
    try:
        resolve_layout(flat, costed_config(job.training, layout))
    except InvalidLayout as exc:
        raise _layout_error(job, exc, i) from exc


def compare(request: CompareRequest) -> CompareResponse:
    """Score the job under each layout (``evaluate``) and compare them with the first. Raises
    ``InvalidLayout`` at ``layouts.<i>.<field>`` for an invalid layout."""
    job = request.job_spec()
    if job.cluster.topology is not None:  # every layout's arithmetic before any layout's node choice
        for i, layout in enumerate(request.layouts):
            _checked_off_topology(job, layout, i)
    plans = []
    for i, layout in enumerate(request.layouts):
        try:
            one = EvaluateRequest(**dict(job), config=layout, memory_headroom_gib=request.memory_headroom_gib)
            plans.append(evaluate(one))
        except InvalidLayout as exc:
            raise _layout_error(job, exc, i) from exc
    warnings = job_warnings(_sized(job, plans[0]))
    if not candidate_frameworks(job.training, job.model, generation=job.gpu_generation):  # as /plan warns
        warnings.append(
            "no framework's stack runs the job's model and training.* knobs at every layout size (docs/frameworks.md: each "
            "profile's [stack]): a layout lists only a framework whose stack runs the knobs at its sizes, and one "
            "that lists none says why in its notes"
        )
    for i, p in enumerate(plans):
        sized = _sized(job, p)
        if sized.cluster.num_gpus != _plan_gpus(plans[0]):  # on a topology each layout sizes the job
            warnings += [f"layout {i}: {w}" for w in job_warnings(sized)]
        warnings += [f"layout {i}: {w}" for w in plan_warnings(sized, p, "the layout")]
    return CompareResponse(entries=compare_plans(plans), warnings=warnings)


def _plan_gpus(p: Plan) -> int:
    """How many GPUs a plan's layout takes."""
    return p.config.tp * p.config.pp * p.config.cp * (p.config.dp or 1)  # set in every plan


def _sized(job: JobSpec, p: Plan) -> JobSpec:
    """The job at the plan's GPU count: a job on a topology may leave ``num_gpus`` to the layout."""
    if job.cluster.num_gpus is not None:
        return job
    return job.model_copy(update={"cluster": job.cluster.model_copy(update={"num_gpus": _plan_gpus(p)})})


__all__ = ["LaunchArgs", "compare", "evaluate", "plan", "to_plan"]
