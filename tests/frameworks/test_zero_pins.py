"""Pinned sizes and ZeRO stages a named framework runs with no layout are 422s at the field to
blame, and never when some layout of the pins runs: checked against every concrete layout."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.errors import InvalidLayout
from optimizer.framework_targets import as_run_for
from optimizer.frameworks import profile
from optimizer.search.fixed_values import check_named_values
from optimizer.specs import JobSpec, PlanRequest

FRAMEWORKS = ("megatron-lm", "megatron-bridge", "torchtitan", "deepspeed")
SIZES = ("tp", "pp", "cp", "dp")


def _request(framework: str, num_gpus: int, fix: dict[str, int], fp32_grads: bool) -> PlanRequest:
    return PlanRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 1536, "framework": framework,
                     "grad_reduce_in_fp32": fp32_grads},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
        "search": {"fix": fix},
    })  # fmt: skip


def _some_layout_runs(request: PlanRequest) -> bool:
    """Whether any (tp, pp, cp, dp) of the pins, with any allowed stage, passes the framework's
    ZeRO rules: every concrete split of num_gpus, not the check's 1-or-above abstraction."""
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    prof = as_run_for(profile(request.training.framework or ""), job.training, job.model)
    fix, n = request.search.fix, job.cluster.resolved_num_gpus
    stages = [fix.zero_stage] if fix.zero_stage is not None else [0, 1, 2, 3]
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for tp, pp, cp in itertools.product(*([getattr(fix, a)] if getattr(fix, a) else divisors for a in SIZES[:3])):
        if n % (tp * pp * cp) or fix.dp not in (None, n // (tp * pp * cp)):
            continue
        if (fix.vpp or 1) > 1 and pp == 1:  # interleaving needs a pipeline
            continue
        if any(prof.zero_problem(pp, n // (tp * pp * cp), tp, cp, 1, 1, z) is None for z in stages):
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(
    framework=st.sampled_from(FRAMEWORKS),
    num_gpus=st.sampled_from([8, 16, 24, 64]),
    pins=st.dictionaries(st.sampled_from(SIZES), st.sampled_from([1, 2, 4, 8]), max_size=3),
    zero=st.none() | st.integers(0, 3),
    vpp=st.sampled_from([None, 2]),
    fp32_grads=st.booleans(),
)
def test_a_zero_rule_422_means_no_layout_of_the_pins_runs(
    framework: str, num_gpus: int, pins: dict[str, int], zero: int | None, vpp: int | None, fp32_grads: bool
) -> None:
    fix = {**pins, **({} if zero is None else {"zero_stage": zero}), **({} if vpp is None else {"vpp": vpp})}
    request = _request(framework, num_gpus, fix, fp32_grads)
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    runs = _some_layout_runs(request)
    try:
        check_named_values(job, request.search)
    except InvalidLayout as err:
        if "zero_stage" in err.reason:  # a framework ZeRO rule, not a divisibility or other rule
            assert not runs, (fix, err.field, err.reason)
        return
    # and the converse: a pinned stage no split of the pins runs is refused (when some split of
    # them exists at all: vpp 2 needs a pipeline the pins may leave no room for)
    divides = num_gpus % math.prod(pins.values()) == 0
    room = vpp is None or "pp" in pins or num_gpus // math.prod(pins.values()) > 1
    assert runs or zero is None or not divides or not room, (fix, "accepted")


def test_the_pin_to_blame_is_named() -> None:
    def field(framework: str, fix: dict[str, int], fp32_grads: bool = False) -> str:
        request = _request(framework, 16, fix, fp32_grads)
        job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
        try:
            check_named_values(job, request.search)
        except InvalidLayout as err:
            return err.field
        return "accepted"

    assert field("deepspeed", {"pp": 2}) == "search.fix.pp"  # 16-bit gradients: no stage pipelines
    assert field("deepspeed", {"pp": 2, "zero_stage": 3}) == "search.fix.pp"
    assert field("deepspeed", {"pp": 2, "zero_stage": 3}, fp32_grads=True) == "search.fix.zero_stage"
    assert field("deepspeed", {"pp": 2, "zero_stage": 1}, fp32_grads=True) == "accepted"
    assert field("megatron-lm", {"pp": 2, "zero_stage": 2}) == "search.fix.zero_stage"
    assert field("torchtitan", {"tp": 8, "zero_stage": 0}) == "search.fix.zero_stage"  # DDP runs alone
    assert field("torchtitan", {"tp": 8, "dp": 2, "zero_stage": 3}) == "accepted"
    assert field("megatron-lm", {"vpp": 2, "zero_stage": 3}) == "search.fix.zero_stage"  # vpp needs pp > 1
    assert field("deepspeed", {"pp": 2, "zero_stage": 0}) == "search.fix.zero_stage"  # both at fault


def test_allowed_depths_a_framework_runs_no_stage_at_are_a_422_at_the_list() -> None:
    """DeepSpeed with 16-bit gradients has no pipeline engine stage: allow.pp [2, 4] is refused at
    the list, as fix.pp 2 is at the pin; [1, 2] still plans (pp 1 runs)."""
    import pytest

    def _allow(pps: list[int]) -> PlanRequest:
        raw = _request("deepspeed", 64, {}, False).model_dump(exclude_none=True)
        return PlanRequest.model_validate({**raw, "search": {"allow": {"pp": pps}}})

    refused = _allow([2, 4])
    job = JobSpec(model=refused.model, training=refused.training, cluster=refused.cluster)
    with pytest.raises(InvalidLayout) as err:
        check_named_values(job, refused.search)
    assert err.value.field == "search.allow.pp" and "DeepSpeed runs no zero_stage with pp > 1" in err.value.reason
    ok = _allow([1, 2])
    check_named_values(JobSpec(model=ok.model, training=ok.training, cluster=ok.cluster), ok.search)
