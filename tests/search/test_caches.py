"""The per-request caches of the cost model and the search (``optimizer.cost.caches``).

A cached function whose key leaves out something it reads returns another layout's numbers.
The check: over a sample of (layout, rank order) pairs that includes, for every sampled layout,
its neighbours in the layout space that differ from it in one field (and a layout with another
layer split), every cache table is filled from empty once per pair by the functions the search
calls, and any two entries filed under one key, from whichever pairs, must be equal. A key that
misses a field the function reads files different numbers under one key and fails it (the last
tests drop one field from a key at a time and see it fail).

Also: every call of ``build_context`` (one per request) gets its own, empty caches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest

import optimizer.cost.layer_memo as layer_memo_module
import optimizer.cost.stage as stage_module
import optimizer.search.comm_floors as comm_floors_module
import optimizer.search.fit_limits as fit_limits_module
import optimizer.search.floors as floors_module
import optimizer.search.lower_bounds as lower_bounds_module
import optimizer.search.split_floors as split_floors_module
from optimizer.cost import best_estimate, build_context, distinct_orders, estimate
from optimizer.cost.caches import MEMOS, Memo
from optimizer.cost.context import JobContext
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import axis_groups, every_order
from optimizer.search.fit_limits import cached_fit_limits, some_split_may_fit
from optimizer.search.floors import step_floor_s
from optimizer.search.lower_bounds import lower_bound_terms
from optimizer.search.planner import Planner
from optimizer.search.space import Reach, enumerate_layouts
from optimizer.search.split_floors import layers_floor_s, split_floor_at_vpp_s, split_floor_s
from optimizer.search.split_mixes import chunk_sum_mixes
from optimizer.specs import JobSpec, PlanRequest
from optimizer.units import GIB

JOB: dict[str, Any] = {
    # 12 layers of two kinds (dense, MoE every second layer) on 32 GPUs: a space of 11,211
    # layouts that varies every field, small enough to recompute every table per layout
    "model": {
        "preset": "mixtral-8x7b",
        "num_layers": 12,
        "moe": {"num_experts": 8, "top_k": 2, "layer_frequency": 2, "first_dense_layers": 1},
    },
    "training": {"seq_len": 4096, "global_batch_size": 32},
    "cluster": {"preset": "dgx-h100", "num_gpus": 32},
    "search": {
        "allow": {
            "vpp": [1, 2, 3],
            "recompute": ["none", "selective", "full"],
            "sequence_parallel": [False, True],
        }
    },
}
STRIDE = 211
"""Sample every STRIDE-th layout of the space, with its one-field neighbours."""
ORDERS_PER_LAYOUT = 3
"""Rank orders per sampled layout: the canonical one, the last distinct one and one between."""
CAP_BYTES = 24 * GIB
"""The memory cap of the fit limits: tight enough that the limits differ between layouts."""
FIELDS = [f.name for f in dataclasses.fields(ResolvedLayout)]

pytestmark = pytest.mark.slow


@cache
def _job() -> tuple[JobSpec, PlanRequest, tuple[ResolvedLayout, ...]]:
    req = PlanRequest.model_validate(JOB)
    job = JobSpec(model=req.model, training=req.training, cluster=req.cluster)
    return job, req, tuple(enumerate_layouts(job, req.search, Reach.ALL))


def _other_split(lay: ResolvedLayout) -> ResolvedLayout | None:
    """``lay`` with one layer moved from its first chunk to its last (None with one chunk)."""
    split = list(lay.stage_layers)
    if len(split) == 1 or split[0] == 1:
        return None
    split[0] -= 1
    split[-1] += 1
    return dataclasses.replace(lay, stage_layers=tuple(split))


def _rest(lay: ResolvedLayout, name: str) -> tuple:
    """Every field of ``lay`` but ``name`` (and the layer split, which follows the depth, with ``vpp``)."""
    left_out = {name, "stage_layers"} if name == "vpp" else {name}
    return tuple(getattr(lay, n) for n in FIELDS if n not in left_out)


@cache
def _sample() -> tuple[ResolvedLayout, ...]:
    """Every STRIDE-th layout; each layout of the space that differs from one of them in a single
    field (the depth with its split); and each with another layer split and, with TP, with
    sequence parallelism switched (the space ties it to tp > 1)."""
    _, _, space = _job()
    by_rest: dict[tuple[str, tuple], list[ResolvedLayout]] = {}
    for lay in space:
        for name in FIELDS:
            by_rest.setdefault((name, _rest(lay, name)), []).append(lay)
    picked: dict[ResolvedLayout, None] = {}
    for lay in space[::STRIDE]:
        picked[lay] = None
        for name in FIELDS:
            picked.update(dict.fromkeys(by_rest[(name, _rest(lay, name))]))
        other = _other_split(lay)
        if other is not None:
            picked[other] = None
        if lay.tp > 1:
            picked[dataclasses.replace(lay, sequence_parallel=not lay.sequence_parallel)] = None
    return tuple(picked)


def _orders(ctx: JobContext, lay: ResolvedLayout) -> list[tuple[str, ...]]:
    # every permutation, not only the orders plans are costed in: a key must tell apart whatever
    # geometry ``estimate`` is given (and the orders plans use give too few distinct dp x cp groups)
    orders = every_order(lay.sizes())
    return list(dict.fromkeys([orders[0], orders[len(orders) // 2], orders[-1]]))[:ORDERS_PER_LAYOUT]


def _exercise(ctx: JobContext, lay: ResolvedLayout, order: tuple[str, ...], flip: bool) -> None:
    """Call what the search calls on one layout and rank order, which fills every cache table.
    Calls that differ only in an argument run in the order ``flip`` picks: the first files its
    value, and a key that missed the argument would give the second the first's value, so only
    another pair's run, in the other order, shows the difference."""
    groups = axis_groups(ctx.topology, order, lay.sizes())
    est = estimate(ctx, lay, order)
    best_estimate(ctx, lay)
    step_floor_s(ctx, lay, groups)
    layers_floor_s(ctx, lay)
    lower_bound_terms(ctx, [lay])
    floors = [lambda: split_floor_s(ctx, lay), lambda: split_floor_at_vpp_s(ctx, lay, lay.vpp + 1)]
    caps = [CAP_BYTES, est.capacity_bytes - est.headroom_bytes]
    for floor, cap in zip(floors[::-1] if flip else floors, caps[::-1] if flip else caps, strict=True):
        floor()
        some_split_may_fit(ctx, lay, cap)
        cached_fit_limits(ctx, lay, groups, cap)
    layers = len(ctx.layer_kind)
    for vpp in (3, 2, 1) if flip else (1, 2, 3):
        if layers - (lay.pp - 1) * vpp >= 0:  # the layers a chunk sum can hold (none left: not asked)
            chunk_sum_mixes(ctx, vpp, layers - (lay.pp - 1) * vpp)


def _same(a: object, b: object) -> bool:
    return a == b or repr(a) == repr(b)  # repr: bit-identical floats, NaN included


def _conflicts(
    sample: tuple[ResolvedLayout, ...], until: Memo[Any, Any] | None = None
) -> tuple[dict[Memo[Any, Any], list[str]], dict[Memo, int]]:
    """Per memo, the keys under which two (layout, order) pairs, each computing from empty
    caches, filed different values; and per memo how many entries repeated a key filed by an
    earlier pair (cache hits across pairs: what makes the check bite). With ``until``: stop at
    the first conflict in that memo."""
    job, _, _ = _job()
    ctx = build_context(job)
    seen: dict[Memo[Any, Any], dict[Any, tuple[Any, ResolvedLayout]]] = {}
    conflicts: dict[Memo[Any, Any], list[str]] = {}
    repeats: dict[Memo, int] = dict.fromkeys(MEMOS, 0)
    runs = 0
    for lay in sample:
        for order in _orders(ctx, lay):
            ctx.caches.clear()
            _exercise(ctx, lay, order, flip=runs % 2 == 1)
            runs += 1
            for memo, table in ctx.caches.items():
                filed = seen.setdefault(memo, {})
                for key, value in table.items():
                    if key not in filed:
                        filed[key] = (value, lay)
                        continue
                    repeats[memo] += 1
                    first, first_lay = filed[key]
                    if not _same(first, value):
                        conflicts.setdefault(memo, []).append(f"{key}: {first_lay} / {lay} {order}")
            if until is not None and until in conflicts:
                return conflicts, repeats
    return conflicts, repeats


@cache
def _unpatched() -> tuple[dict[Memo[Any, Any], list[str]], dict[Memo, int]]:
    return _conflicts(_sample())


def test_the_sample_varies_every_field_alone() -> None:
    """The sample holds, for every layout field, two layouts that differ only in it (the depth
    with its layer split; the fields the rules tie together, such as tp and dp, vary together)."""
    sample = _sample()
    varied = set()
    for name in FIELDS:
        groups: dict[tuple, set] = {}
        for lay in sample:
            groups.setdefault(_rest(lay, name), set()).add(getattr(lay, name))
        if any(len(values) > 1 for values in groups.values()):
            varied.add(name)
    assert len(set(sample)) == len(sample) > 200
    assert varied == {"vpp", "zero_stage", "recompute", "sequence_parallel", "ep", "etp", "stage_layers"}
    for name in ("tp", "pp", "dp", "cp", "micro_batch_size", "num_micro_batches"):  # tied to each other
        assert len({getattr(lay, name) for lay in sample}) >= 3, name


def test_every_memo_is_filled_and_hit_across_layouts() -> None:
    """Every memo declared is filled by ``_exercise`` and files some key from two different
    (layout, order) pairs: the check below compares something for each."""
    _, repeats = _unpatched()
    assert MEMOS, "no memo declared"
    unhit = sorted(m.name for m, n in repeats.items() if n == 0)
    assert unhit == []


def test_one_key_never_holds_two_values() -> None:
    """No cached function's key leaves out something it reads: entries filed under one key by
    different layouts and rank orders, each computed from empty caches, are equal."""
    conflicts, _ = _unpatched()
    assert {m.name: found[:3] for m, found in conflicts.items()} == {}


def _dropping(key_fn: Callable[..., Any], field: str) -> Callable[..., Any]:
    """``key_fn`` with ``field`` of its keys set to None: a key that forgot that field."""

    def forgetful(*args: Any) -> Any:
        return key_fn(*args)._replace(**{field: None})

    return forgetful


DROPPED = [
    (stage_module, "stage_fixed_key", "zero_stage", stage_module.STAGE_FIXED),
    (stage_module, "stage_core_key", "dp_cp_group", stage_module.STAGE_CORE),
    (stage_module, "layer_key", "recompute", stage_module.KIND_COSTS),
    (split_floors_module, "split_floors_key", "vpp", split_floors_module.ORDER_SPLIT_FLOORS),
    (split_floors_module, "family_key", "zero_stage", split_floors_module.SPLIT_FLOOR_INPUTS),
    (floors_module, "kind_floor_key", "sequence_parallel", floors_module.KIND_TIME_FLOOR),
    (floors_module, "slowest_key", "stages", floors_module.SLOWEST_STAGE),
    (lower_bounds_module, "p2p_key", "micro_batch_size", lower_bounds_module.P2P_FLOOR),
    (layer_memo_module, "kind_dims_key", "recompute", layer_memo_module.LAYER_COMPUTE),
    (fit_limits_module, "fit_key", "cap_bytes", fit_limits_module.FIT_LIMITS),
    (layer_memo_module, "kind_dims_key", "etp", layer_memo_module.LAYER_COMPUTE),
    (floors_module, "kind_floor_key", "etp", floors_module.KIND_TIME_FLOOR),
    (split_floors_module, "family_key", "etp", split_floors_module.SPLIT_FLOOR_INPUTS),
    (comm_floors_module, "ep_floor_key", "tokens", comm_floors_module.EP_FLOOR),
    (comm_floors_module, "ep_floor_key", "replayed", comm_floors_module.EP_FLOOR),
    (comm_floors_module, "tp_cp_floor_key", "replays", comm_floors_module.TP_CP_FLOOR),
    (comm_floors_module, "tp_cp_floor_key", "micro_batch_size", comm_floors_module.TP_CP_FLOOR),
]


@pytest.mark.parametrize(("module", "name", "field", "memo"), DROPPED, ids=lambda v: v if isinstance(v, str) else "")
def test_a_key_missing_a_field_is_caught(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, field: str, memo: Memo[Any, Any]
) -> None:
    """The check above fails when a key function leaves out one field its function reads. (Not
    tried on the functions that compute from their key alone, such as ``distinct_stages``,
    ``_min_max_stage_floor_s`` or the LM head's time: they cannot read what their key lacks.)"""
    monkeypatch.setattr(module, name, _dropping(getattr(module, name), field))
    conflicts, _ = _conflicts(_sample(), until=memo)
    assert memo in conflicts, sorted(m.name for m in conflicts)


def _requests() -> Iterator[PlanRequest]:
    yield PlanRequest.model_validate(JOB)
    yield PlanRequest.model_validate({**JOB, "training": {**JOB["training"], "seq_len": 2048}})


def test_each_request_gets_its_own_caches() -> None:
    """Two contexts of one job (two requests) share the job's facts but no cache table: the
    second starts empty after the first filled its tables, and so does another job's."""
    job, _, space = _job()
    first = build_context(job)
    _exercise(first, space[0], distinct_orders(first, space[0])[0][0], flip=False)
    assert first.caches.entries() > 20
    second = build_context(job)
    assert second.caches is not first.caches
    assert second.caches.entries() == 0
    assert second.topology is first.topology  # the facts are computed once per job
    other = build_context(JobSpec.model_validate({k: v for k, v in JOB.items() if k != "search"} | {
        "training": {**JOB["training"], "seq_len": 2048}}))  # fmt: skip
    assert other.caches.entries() == 0 and other.caches is not first.caches


def test_each_search_gets_its_own_caches() -> None:
    """Each search of a request (``Planner``) builds its own context: a second search of the
    same request starts from empty tables, whatever the first left in its own."""
    plans = []
    for req in [*_requests(), next(_requests())]:
        planner = Planner(req, space_memory_bytes=2 * GIB)
        assert planner.ctx.caches.entries() == 0
        planner.run()
        plans.append(planner)
    assert plans[0].ctx.caches.entries() > 0
    assert len({id(p.ctx.caches) for p in plans}) == len(plans)
