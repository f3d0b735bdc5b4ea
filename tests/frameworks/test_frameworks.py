"""Framework profiles: every plan runs, as costed, on the framework it names.

For each framework and jobs drawn from the search tests' generator (and the named jobs below), no
plan uses a combination the framework's profile excludes, its launch arguments are for exactly
the frameworks it lists, and the planner agrees with the brute-force oracle over the restricted
space.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.cost import build_context, resolve_layout
from optimizer.cost.pipeline import even_split
from optimizer.errors import InvalidLayout
from optimizer.framework_targets import candidate_frameworks, framework_job_problem
from optimizer.frameworks import (
    FRAMEWORK_IDS,
    kv_heads_to_split,
    layout_problem,
    load_profiles,
    profile,
    stack_defaults,
)
from optimizer.inert_knobs import layout_facts
from optimizer.launch import MEGATRON_FLAGS
from optimizer.search.brute_force import verify
from optimizer.search.fixed_values import check_named_values
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, JobSpec, PlanRequest
from tests.launch.test_launch import DEEPSPEED_KEYS
from tests.search.test_search import job_from_seed

NAMED_JOBS: dict[str, dict[str, Any]] = {
    "llama3-70b, 1,024 H100": {
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    },
    "llama3-8b, 8 H100": {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 32},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    },
    "mixtral-8x7b, 64 H100": {
        "model": {"preset": "mixtral-8x7b"},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    },
}


def _with_framework(job: dict[str, Any], framework: str | None, top_k: int = 3) -> PlanRequest:
    raw = json.loads(json.dumps(job))
    raw["training"]["framework"] = framework
    search = raw.setdefault("search", {})
    search["top_k"] = top_k
    # the generator's allow lists name cost-model modes; with a framework named they take its names
    search.get("allow", {}).pop("recompute", None)
    search.get("fix", {}).pop("recompute", None)
    return PlanRequest.model_validate(raw)


def _rejected(request: PlanRequest) -> bool:
    """True when ``search.fix`` / ``search.allow`` name values no layout of the framework takes
    (a drawn job can: ZeRO-2/3 only, with blocking collectives), or the named framework runs no job
    of the model (an MoE model on DeepSpeed): the search then raises a 422 at that field instead
    of planning."""
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    try:
        check_named_values(job, request.search)
    except InvalidLayout as err:
        runs_none = framework_job_problem(job.training, job.model, job.gpu_generation)
        assert err.field.startswith("search.") or (runs_none is not None and err.field == runs_none[0]), err
        with pytest.raises(InvalidLayout):
            plan(request)
        return True
    return False


def _check_plans(request: PlanRequest) -> None:
    """Every plan runs on each framework it lists (profile rules), launch arguments for exactly
    those, and Megatron / DeepSpeed arguments that describe the plan."""
    if _rejected(request):
        return
    response = plan(request)
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    named = request.training.framework
    matched = bool(candidate_frameworks(request.training, request.model))
    if not matched and response.plans:  # no framework's stack runs the job's knobs: the answer says so
        assert any("no framework's stack" in w for w in response.warnings), response.warnings
    for p in response.plans:
        config = p.config
        if named is not None:  # back to the cost model's recompute names
            config = config.model_copy(update={"recompute": profile(named).costed_recompute(config.recompute)})
        lay = resolve_layout(job, config)
        # unmatched, a plan lists only frameworks whose stack runs the knobs that act on its layout
        facts = layout_facts(lay, job.model.is_moe, p.placement.get("tp"))
        sized = candidate_frameworks(request.training, request.model, facts=facts)
        assert bool(p.frameworks) or not matched, p.notes
        assert set(p.frameworks) <= {f.id for f in sized}, p.notes
        if named is not None and matched:
            assert p.frameworks == [named]
        for fid in p.frameworks or ([named] if named else []):
            kv = kv_heads_to_split(job.model)
            assert layout_problem(profile(fid), lay, job.model.is_moe, job.training.seq_len, kv) is None
        assert not (lay.pp > 1 and lay.zero_stage >= 2)  # no framework runs it
        fields = {profile(fid).launch_field for fid in p.frameworks}
        assert p.launch is not None
        for name in ("megatron", "torchtitan", "deepspeed", "nemo"):
            assert bool(getattr(p.launch, name)) == (name in fields), name
        if p.launch.megatron:
            args = shlex.split(p.launch.megatron)
            assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS
            assert not (lay.pp > 1 and "--use-megatron-fsdp" in args)
        if p.launch.torchtitan:
            par = tomllib.loads(p.launch.torchtitan)["parallelism"]
            cfg = tomllib.loads(p.launch.torchtitan)
            sizes = (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
                     par["expert_parallel_degree"], par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"])  # fmt: skip
            assert sizes == (lay.tp, lay.pp, lay.cp, lay.ep, lay.dp)
            assert cfg["activation_checkpoint"]["mode"] == {"op": "selective"}.get(lay.recompute, lay.recompute)
            assert lay.recompute in ("none", "op", "full")
        if p.launch.nemo:
            tokens = dict(t.strip('"').split("=", 1) for t in shlex.split(p.launch.nemo))
            assert tokens["model.tensor_model_parallel_size"] == str(lay.tp)
            assert tokens["model.pipeline_model_parallel_size"] == str(lay.pp)
            assert tokens["ddp.use_distributed_optimizer"] == ("true" if lay.zero_stage >= 1 else "false")
            assert not (lay.pp > 1 and "ddp.use_megatron_fsdp" in tokens)
        if p.launch.deepspeed:
            ds = json.loads(p.launch.deepspeed)
            assert set(ds) <= DEEPSPEED_KEYS
            assert ds["train_batch_size"] == request.training.global_batch_size
            assert ds["zero_optimization"]["stage"] == lay.zero_stage
            assert lay.pp == 1 or lay.zero_stage <= 1
            assert lay.cp == 1 and lay.vpp == 1
            assert list(lay.stage_layers) == even_split(sum(lay.stage_layers), lay.pp)


def test_profiles_load_with_a_source_for_every_fact() -> None:
    profiles = load_profiles()
    assert tuple(profiles) == FRAMEWORK_IDS
    for prof in profiles.values():
        assert prof.version and prof.source
        for fact in vars(prof.parallelism).values():
            assert fact.source
        for mode in prof.recompute:
            assert mode.source
        for knob in prof.stack.values():
            assert knob.source and knob.default in knob.runs
    # the facts the planner relies on most
    assert profiles["deepspeed"].parallelism.zero_stages_with_pp.value == (0, 1)
    assert profiles["megatron-lm"].parallelism.zero_stages_with_pp.value == (0, 1)
    assert profiles["torchtitan"].parallelism.zero_stages_with_pp.value == (1,)
    assert profiles["megatron-lm"].costed_recompute("selective") == "core_attn"
    assert profiles["torchtitan"].costed_recompute("selective") == "op"


@pytest.mark.parametrize("framework", [*FRAMEWORK_IDS, None])
@pytest.mark.parametrize("name", sorted(NAMED_JOBS))
def test_named_jobs_run_on_their_frameworks(framework: str | None, name: str) -> None:
    _check_plans(_with_framework(NAMED_JOBS[name], framework))


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), framework=st.sampled_from([*FRAMEWORK_IDS, None]))
def test_drawn_jobs_never_use_an_excluded_combination(seed: int, framework: str | None) -> None:
    _check_plans(_with_framework(job_from_seed(seed), framework))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), framework=st.sampled_from(FRAMEWORK_IDS))
def test_planner_agrees_with_oracle_under_a_framework(seed: int, framework: str) -> None:
    request = _with_framework(job_from_seed(seed), framework)
    if not _rejected(request):
        assert verify(request) == []


def test_explicit_knob_a_framework_does_not_run_is_said() -> None:
    """torchtitan with the fused loss it does not have: planned within torchtitan's layouts, but
    no plan claims to run there as costed, and the answer says why."""
    job = NAMED_JOBS["llama3-8b, 8 H100"]
    req = PlanRequest.model_validate({**job, "training": {**job["training"], "framework": "torchtitan",
                                                          "cross_entropy": "fused"}})  # fmt: skip
    response = plan(req)
    assert response.plans and all(p.frameworks == [] for p in response.plans)
    assert any("no framework's stack" in w for w in response.warnings)
    assert any("training.cross_entropy" in n for n in response.plans[0].notes)


def test_explicit_knobs_override_the_profile() -> None:
    raw = {**NAMED_JOBS["llama3-8b, 8 H100"]}
    req = PlanRequest.model_validate({**raw, "training": {**raw["training"], "framework": "torchtitan"}})
    assert req.training.cross_entropy == "unfused" and req.training.grad_reduce_in_fp32
    assert req.training.attention_kernel == "flash2"
    assert "cross_entropy" not in req.training.model_fields_set
    explicit = {**raw["training"], "framework": "torchtitan", "cross_entropy": "fused"}
    req = PlanRequest.model_validate({**raw, "training": explicit})
    assert req.training.cross_entropy == "fused" and req.training.grad_reduce_in_fp32
    assert stack_defaults("megatron-bridge")["grad_reduce_in_fp32"] is True


def test_torchtitan_8b_costs_its_own_stack() -> None:
    """The Llama 3 8B top plan on 8 H100: on torchtitan's stack (fp32 gradient reduction, fp32
    loss) the same layout needs more memory than on Megatron-LM's, and its plan says so."""
    job = NAMED_JOBS["llama3-8b, 8 H100"]
    mega = plan(_with_framework(job, "megatron-lm", 1)).plans[0]
    titan = plan(_with_framework(job, "torchtitan", 1)).plans[0]
    assert mega.frameworks == ["megatron-lm"] and titan.frameworks == ["torchtitan"]
    same = evaluate(EvaluateRequest.model_validate({**job, "training": {**job["training"], "framework": "torchtitan"},
                                                     "config": {**mega.config.model_dump(exclude={"recompute"}),
                                                                "recompute": "none"}}))  # fmt: skip
    assert titan.memory_gib.total <= titan.memory_gib.capacity
    assert same.memory_gib.gradients >= mega.memory_gib.gradients


def test_megatron_selective_is_megatrons() -> None:
    """``selective`` under megatron-lm costs Megatron-Core's recompute (``core_attn``): the same as
    naming that mode with no framework, and more memory than the cost model's own ``selective``."""
    job = NAMED_JOBS["llama3-70b, 1,024 H100"]
    layout = {"tp": 8, "pp": 4, "vpp": 5, "micro_batch_size": 1, "zero_stage": 1}
    as_megatron = evaluate(EvaluateRequest.model_validate(
        {**job, "training": {**job["training"], "framework": "megatron-lm", "grad_reduce_in_fp32": False},
         "config": {**layout, "recompute": "selective"}}))  # fmt: skip
    megatron_stack = {**job["training"], "tp_dgrad_overlap": True}  # Megatron-Core's default
    core = evaluate(EvaluateRequest.model_validate(
        {**job, "training": megatron_stack, "config": {**layout, "recompute": "core_attn"}}))  # fmt: skip
    legacy = evaluate(EvaluateRequest.model_validate({**job, "config": {**layout, "recompute": "selective"}}))
    assert as_megatron.step_time_s == pytest.approx(core.step_time_s, rel=1e-12)
    assert as_megatron.memory_gib.total == pytest.approx(core.memory_gib.total, rel=1e-12)
    assert as_megatron.memory_gib.activations > legacy.memory_gib.activations
    assert as_megatron.config.recompute == "selective" and as_megatron.frameworks == ["megatron-lm"]


def test_recompute_names_are_the_frameworks() -> None:
    job = NAMED_JOBS["llama3-8b, 8 H100"]
    with pytest.raises(ValueError, match="not a deepspeed recompute mode"):
        EvaluateRequest.model_validate(
            {**job, "training": {**job["training"], "framework": "deepspeed"}, "config": {"recompute": "selective"}}
        )
    with pytest.raises(ValueError, match="search.fix.recompute"):
        PlanRequest.model_validate(
            {**job, "training": {**job["training"], "framework": "torchtitan"}, "search": {"fix": {"recompute": "op"}}}
        )


def test_diverse_top_k_is_one_plan_per_family() -> None:
    job = NAMED_JOBS["llama3-70b, 1,024 H100"]
    raw = {**job, "search": {"top_k": 5}}
    diverse = plan(PlanRequest.model_validate(raw))
    flat = plan(PlanRequest.model_validate({**raw, "search": {"top_k": 5, "diverse": False}}))
    families = [(p.config.tp, p.config.pp, p.config.dp, p.config.cp, p.config.ep) for p in diverse.plans]
    assert len(set(families)) == len(families) == 5
    assert diverse.plans[0].step_time_s == flat.plans[0].step_time_s
    assert [p.step_time_s for p in flat.plans] == sorted(p.step_time_s for p in flat.plans)
    assert diverse.plans[-1].step_time_s >= flat.plans[-1].step_time_s


def test_plans_are_in_their_simplest_form() -> None:
    """No plan keeps a ZeRO stage above one that steps in the same time, fits and runs on the same
    frameworks."""
    for name, job in NAMED_JOBS.items():
        response = plan(PlanRequest.model_validate({**job, "search": {"top_k": 5, "diverse": False}}))
        spec = JobSpec(**{k: job[k] for k in ("model", "training", "cluster")})
        ctx = build_context(spec)
        for p in response.plans:
            for lower in range(p.config.zero_stage):
                config = p.config.model_copy(update={"zero_stage": lower, "placement": None})
                other = evaluate(EvaluateRequest.model_validate({**job, "config": config.model_dump()}))
                same = round(other.step_time_s, 9) == round(p.step_time_s, 9)
                assert not (same and other.fits_memory and set(other.frameworks) >= set(p.frameworks)), (name, lower)
        assert ctx is not None


def _suite_jobs() -> dict[str, dict[str, Any]]:
    """The job sets of the search and cost tests, by name; a job several of them share (the same
    document) once, named after all of them."""
    from tests.cost import test_columns, test_layout_floors
    from tests.search import test_search_bounds, test_search_speed_invariants

    named: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for module in (test_columns, test_layout_floors, test_search_bounds, test_search_speed_invariants):
        for name, job in module.JOBS.items():
            modules, _ = named.setdefault(json.dumps(job, sort_keys=True), ([], job))
            modules.append(f"{module.__name__.rsplit('.', 1)[-1]}: {name}")
    return {" = ".join(modules): job for modules, job in named.values()}


SUITE_JOBS = _suite_jobs()


@pytest.mark.parametrize("framework", [*FRAMEWORK_IDS, None])
@pytest.mark.parametrize("name", sorted(SUITE_JOBS))
def test_suite_jobs_run_on_their_frameworks(framework: str | None, name: str) -> None:
    """Every job of the test suite's job sets, for every framework (and none): no plan uses a
    combination the framework's profile excludes."""
    _check_plans(_with_framework(SUITE_JOBS[name], framework))


def test_framework_names_restrict_the_search() -> None:
    """``search.allow.recompute`` takes the framework's names: torchtitan's ``selective`` is its
    op-level policy, and the plans say ``selective``."""
    job = NAMED_JOBS["llama3-8b, 8 H100"]
    req = PlanRequest.model_validate({**job, "training": {**job["training"], "framework": "torchtitan"},
                                      "search": {"top_k": 3, "allow": {"recompute": ["selective"]}}})  # fmt: skip
    response = plan(req)
    assert response.plans and {p.config.recompute for p in response.plans} == {"selective"}
    core = plan(PlanRequest.model_validate({**job, "search": {"top_k": 1, "fix": {"recompute": "op"}}})).plans[0]
    assert response.plans[0].step_time_s >= core.step_time_s * (1 - 1e-9)  # torchtitan's stack is not faster


def test_named_combination_no_framework_runs_is_searched_and_says_so() -> None:
    """With no framework named, ZeRO-3 with pipelines is searched only when named, and such a plan
    lists no framework, has no launch arguments and a note saying why."""
    job = NAMED_JOBS["llama3-70b, 1,024 H100"]
    req = PlanRequest.model_validate({**job, "search": {"top_k": 1, "fix": {"zero_stage": 3, "pp": 4}}})
    (p,) = plan(req).plans
    assert p.config.zero_stage == 3 and p.config.pp == 4 and p.frameworks == []
    assert p.launch is not None and not any(p.launch.model_dump().values())
    assert any(n.startswith("runs on no framework as costed") for n in p.notes)
    default = plan(PlanRequest.model_validate({**job, "search": {"top_k": 5, "fix": {"pp": 4}}}))
    assert default.plans and all(q.config.zero_stage <= 1 for q in default.plans)
