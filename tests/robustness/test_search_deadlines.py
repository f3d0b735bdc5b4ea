"""The phases of the search that reach past the default space's bounds stop at the deadline:
bounding a group of micro-batches beyond the bound when the costing reaches it
(``search.steps.expand_group``), and the smallest bound of those groups reported with the plans
(``beyond.smallest_bound``)."""

from __future__ import annotations

import math
import time

import pytest

from optimizer.cost import build_context
from optimizer.search.beyond import smallest_bound
from optimizer.search.space import Reach, layout_blocks
from optimizer.search.steps import bound_space, expand_group
from optimizer.specs import JobSpec, PlanRequest

REQUEST = PlanRequest.model_validate({
    "model": {"preset": "llama3-70b"},
    "training": {"seq_len": 4096, "global_batch_size": 65536},
    "cluster": {"preset": "dgx-h100", "num_gpus": 2048},
})  # fmt: skip
"""Micro-batches up to 32 a replica: groups of blocks beyond the bound of 16."""


@pytest.fixture(scope="module")
def space():
    job = JobSpec(model=REQUEST.model, training=REQUEST.training, cluster=REQUEST.cluster)
    ctx = build_context(job)
    usable = ctx.usable_bytes(None)
    blocks = list(layout_blocks(job, REQUEST.search, Reach.ALL))
    _, groups = bound_space(ctx, blocks, usable, math.inf)
    assert len(groups) > 1
    return job, ctx, usable, groups


def test_a_group_reached_after_the_deadline_goes_back_unexpanded(space) -> None:
    job, ctx, usable, groups = space
    for group in sorted(groups, key=lambda g: g.bound):
        queue: list = []
        assert expand_group(ctx, job, group, usable, math.inf, queue, 7, time.perf_counter() - 1) == 8
        assert queue == [(group.bound, 7, group)]
        # before the deadline the group is bounded and its layouts that may fit are queued
        expanded: list = []
        seq = expand_group(ctx, job, group, usable, math.inf, expanded, 7, time.perf_counter() + 60)
        assert seq - 7 == len(expanded)
        assert all(bound >= group.bound for bound, _, _ in expanded)
        if expanded:
            return
    pytest.fail("no group holds a layout that may fit")


def test_the_smallest_bound_past_the_deadline_is_the_smallest_group_bound(space) -> None:
    _, ctx, usable, groups = space
    loosest = min(g.bound for g in groups)
    assert smallest_bound(ctx, groups, usable, math.inf, time.perf_counter() - 1) == loosest
    exact = smallest_bound(ctx, groups, usable, math.inf)
    assert exact > loosest  # bounding the blocks tightens it; the deadline only loosens, never raises it
