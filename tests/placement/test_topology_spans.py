"""Tier spans of a node set (``node_tiers.level_spans``): hypothesis invariants."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.cost.node_tiers import level_spans
from optimizer.placement.select import rank_order
from optimizer.topology_spec import ClusterTopology

HOST = "kubernetes.io/hostname"


@st.composite
def node_sets(draw):
    racks = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    nodes = []
    for r, count in enumerate(racks):
        for k in range(count):
            nodes.append({"name": f"n{r}-{k}", "labels": {"block": f"b{r % 2}", "rack": f"r{r}"}, "free_gpus": 8})
    topo = ClusterTopology.model_validate({"levels": ["block", "rack", HOST], "nodes": nodes})
    order = draw(st.permutations(topo.nodes))
    return topo, list(order)


@settings(max_examples=200, deadline=None)
@given(node_sets(), st.sampled_from([1, 4, 8]))
def test_sorted_spans_are_gcds_of_domain_shares(case, g: int) -> None:
    topo, nodes = case
    ordered = rank_order(topo, nodes)
    spans = level_spans(topo, ordered, g)
    for depth, span in enumerate(spans):
        counts = Counter(topo.path(n)[: depth + 1] for n in ordered)
        assert span == math.gcd(*counts.values()) * g


@settings(max_examples=200, deadline=None)
@given(node_sets(), st.sampled_from([1, 8]))
def test_every_aligned_block_lies_in_one_domain(case, g: int) -> None:
    """In any rank order, every aligned block of a level's span holds one domain of it, and the
    spans nest (each divides the coarser one and the job)."""
    topo, nodes = case
    spans = level_spans(topo, nodes, g)
    n = len(nodes)
    for depth, span in enumerate(spans):
        b = span // g
        assert n % b == 0
        for i in range(0, n, b):
            assert len({topo.path(x)[: depth + 1] for x in nodes[i : i + b]}) == 1
        if depth:
            assert spans[depth - 1] % span == 0
