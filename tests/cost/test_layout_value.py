"""The layout value (``ResolvedLayout``): frozen and hashable, built only by the layout rules,
and every view of it (``dims``, ``family``, ``sizes()``, ``at_depth``, ``to_spec``, the launch
geometry, the numpy columns and their rows) equal to the field-by-field construction it replaces."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer import service
from optimizer.cost import build_context, distinct_orders, estimate
from optimizer.cost.columns import LayoutColumns, cost_columns
from optimizer.cost.layer import Dims
from optimizer.cost.rules import ResolvedLayout, resolve, resolve_layout, tensor_parallel_reason, with_knobs
from optimizer.errors import InvalidLayout
from optimizer.launch.common import Geometry, geometry
from optimizer.layer_split import even_split
from optimizer.search.fixed_values import CHECKS
from optimizer.search.ranking import family_key
from optimizer.search.space import enumerate_layouts
from optimizer.specs import EvaluateRequest, JobSpec, Layout, PlanRequest

ROOT = Path(__file__).resolve().parents[2]


def _job(model: dict[str, Any], num_gpus: int, gbs: int, seq: int = 4096) -> tuple[JobSpec, PlanRequest]:
    req = PlanRequest.model_validate({
        "model": model,
        "training": {"seq_len": seq, "global_batch_size": gbs},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
    })  # fmt: skip
    return JobSpec(model=req.model, training=req.training, cluster=req.cluster), req


DENSE, DENSE_REQ = _job({"preset": "llama3-8b"}, 8, 64)
MOE, MOE_REQ = _job({"preset": "mixtral-8x7b"}, 16, 64)
DENSE_LAYOUTS = list(enumerate_layouts(DENSE, DENSE_REQ.search))
MOE_LAYOUTS = list(enumerate_layouts(MOE, MOE_REQ.search))


def test_the_value_is_frozen_and_hashable() -> None:
    lay = ResolvedLayout.from_spec(Layout(tp=2, pp=2, micro_batch_size=2), DENSE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.tp = 4  # type: ignore[misc]
    again = resolve(DENSE, tp=2, pp=2, cp=1, ep=1, vpp=1, micro_batch_size=2, zero_stage=1, recompute="none",
                    sequence_parallel=True)  # fmt: skip
    assert again == lay and hash(again) == hash(lay)
    assert {lay: 1}[again] == 1
    assert (lay.dp, lay.num_micro_batches, lay.stage_layers) == (2, 16, (16, 16))
    assert resolve_layout(DENSE, Layout(tp=2, pp=2, micro_batch_size=2)) == lay


INVALID = [
    # (job, layout, field, message): the messages the rules have always given
    (DENSE, {"tp": 3}, "config.tp", "tp*pp*cp = 3 does not divide num_gpus = 8"),
    (DENSE, {"dp": 4}, "config.dp", "tp*pp*dp*cp must equal num_gpus: 1*1*4*1 != 8 (dp would be 8)"),
    (DENSE, {"ep": 2}, "config.ep", "ep > 1 needs an MoE model"),
    (DENSE, {"recompute": "moe"}, "config.recompute", "'moe' recomputes MoE blocks and needs an MoE model"),
    (DENSE, {"micro_batch_size": 3}, "config.micro_batch_size",
     "global_batch_size (64) is not divisible by dp*micro_batch_size (8*3)"),
    (DENSE, {"num_micro_batches": 7}, "config.num_micro_batches",
     "must be global_batch_size/(dp*micro_batch_size) = 8"),
    (DENSE, {"vpp": 2}, "config.vpp", "interleaving (vpp > 1) needs pp > 1"),
    (DENSE, {"pp": 8, "micro_batch_size": 16}, "config.pp", "number of micro-batches (4) must be >= pp (8)"),
    (DENSE, {"pp": 2, "stage_layers": [16, 15]}, "config.stage_layers", "sums to 31, model has 32 layers"),
    (DENSE, {"pp": 2, "stage_layers": [32]}, "config.stage_layers", "needs pp*vpp = 2 entries, got 1"),
    (MOE, {"ep": 16}, "config.ep", "num_experts (8) is not divisible by ep (16)"),
]  # fmt: skip


@pytest.mark.parametrize(("job", "fields", "field", "message"), INVALID, ids=[f"{c[2]}-{i}" for i, c in
                                                                             enumerate(INVALID)])  # fmt: skip
def test_from_spec_rejects_each_invalid_combination(job: JobSpec, fields: dict, field: str, message: str) -> None:
    with pytest.raises(InvalidLayout) as err:
        ResolvedLayout.from_spec(Layout(**fields), job)
    assert (err.value.field, err.value.reason) == (field, message)


def test_named_tp_values_give_the_rules_reason() -> None:
    """``search.fix.tp`` checks the heads and FFN with the rules' own words."""
    job, _ = _job({"preset": "llama3-8b"}, 24, 48)
    assert tensor_parallel_reason(job, 3) == "num_attention_heads (32) is not divisible by tp (3)"
    assert CHECKS["tp"](job, 3) == tensor_parallel_reason(job, 3)
    with pytest.raises(InvalidLayout, match=r"num_attention_heads \(32\) is not divisible by tp \(3\)"):
        ResolvedLayout.from_spec(Layout(tp=3), job)
    assert CHECKS["tp"](job, 8) is None and tensor_parallel_reason(job, 8) is None


def _old_spec(lay: ResolvedLayout) -> Layout:
    """The request type as ``service.to_plan`` built it field by field."""
    return Layout(tp=lay.tp, pp=lay.pp, dp=lay.dp, cp=lay.cp, ep=lay.ep, vpp=lay.vpp,
                  micro_batch_size=lay.micro_batch_size, zero_stage=lay.zero_stage,  # type: ignore[arg-type]
                  recompute=lay.recompute,  # type: ignore[arg-type]
                  sequence_parallel=lay.sequence_parallel, num_micro_batches=lay.num_micro_batches,
                  stage_layers=list(lay.stage_layers), placement=None, etp=lay.etp)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([(DENSE, lay) for lay in DENSE_LAYOUTS] + [(MOE, lay) for lay in MOE_LAYOUTS]))
def test_views_equal_the_field_by_field_construction(case: tuple[JobSpec, ResolvedLayout]) -> None:
    job, lay = case
    assert lay.dims == Dims(lay.tp, lay.cp, lay.ep, lay.micro_batch_size, lay.sequence_parallel, lay.recompute, lay.etp)
    assert lay.family == family_key(lay) == (lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.etp)
    assert lay.sizes() == {"tp": lay.tp, "cp": lay.cp, "dp": lay.dp, "pp": lay.pp, "ep": lay.ep, "etp": lay.etp}
    knobs = with_knobs(lay.__dict__, 0, "full")
    assert knobs == dataclasses.replace(lay, zero_stage=0, recompute="full")
    assert knobs.dims == dataclasses.replace(lay.dims, recompute="full")
    spec = lay.to_spec()
    assert spec == _old_spec(lay)
    assert geometry(job.training, lay, job.model.is_moe) == Geometry(
        tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, vpp=lay.vpp, dp=lay.dp, mbs=lay.micro_batch_size,
        nmb=(job.training.global_batch_size or 0) // (lay.dp * lay.micro_batch_size), gbs=job.training.global_batch_size,
        seq=job.training.seq_len, sp=lay.sequence_parallel and lay.tp > 1,
        chunks=tuple(even_split(job.model.num_layers or 0, lay.pp * lay.vpp)), etp=lay.etp, moe=job.model.is_moe,
    )  # fmt: skip
    assert ResolvedLayout.from_spec(spec, job) == lay
    for vpp in (1, 2, 4):
        try:
            old = resolve(job, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, vpp=vpp,
                          micro_batch_size=lay.micro_batch_size, zero_stage=lay.zero_stage, recompute=lay.recompute,
                          sequence_parallel=lay.sequence_parallel, etp=lay.etp)  # fmt: skip
        except InvalidLayout as err:
            with pytest.raises(InvalidLayout) as again:
                lay.at_depth(job, vpp)
            assert (again.value.field, again.value.reason) == (err.field, err.reason)
            continue
        assert lay.at_depth(job, vpp) == old


@pytest.mark.parametrize(("job", "layouts"), [(DENSE, DENSE_LAYOUTS), (MOE, MOE_LAYOUTS)], ids=["dense", "moe"])
def test_columns_round_trip_and_cost_as_the_values(job: JobSpec, layouts: list[ResolvedLayout]) -> None:
    """``LayoutColumns.of_layouts`` keeps each layout on its row, ``layout_at`` gives it back, and
    the columns cost as ``estimate`` costs the values."""
    ctx = build_context(job)
    families: dict[tuple, list[ResolvedLayout]] = {}
    for lay in layouts:
        families.setdefault((lay.family, lay.zero_stage), []).append(lay)
    checked = 0
    for rows in list(families.values())[::7]:
        cols = LayoutColumns.of_layouts(rows)
        assert len(cols) == len(rows)
        assert [cols.layout_at(job, i) for i in range(len(rows))] == rows
        order, groups = distinct_orders(ctx, rows[0])[-1]
        (cost,) = cost_columns(ctx, cols, [groups])[0]
        for i, lay in enumerate(rows):
            assert cost.step_time_s[i] == estimate(ctx, lay, order, None, groups).step_time_s
            checked += 1
    assert checked > 20
    with pytest.raises(ValueError, match="shares its parallel sizes"):
        LayoutColumns.of_layouts([layouts[0], next(x for x in layouts if x.family != layouts[0].family)])


EVALUATE_EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("evaluate-*.yaml"))


@pytest.mark.parametrize("name", EVALUATE_EXAMPLES)
def test_evaluate_on_a_plans_own_config_gives_identical_json(name: str) -> None:
    """The layout value's spec (``to_spec``, the plan's ``config``) resolves to the same value:
    evaluating the plan's own config gives the same JSON, byte for byte."""
    raw = yaml.safe_load((ROOT / "examples" / name).read_text(encoding="utf-8"))
    first = service.evaluate(EvaluateRequest.model_validate(raw))
    again = service.evaluate(EvaluateRequest.model_validate({**raw, "config": first.config.model_dump()}))
    assert json.dumps(again.model_dump(mode="json")) == json.dumps(first.model_dump(mode="json"))
