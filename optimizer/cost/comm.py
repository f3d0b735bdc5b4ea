"""Alpha-beta collective costs (seed-notes section 2).

``T(n) = alpha + n / beta``. ``beta`` is the achievable per-direction bandwidth of the link a rank
drives (bytes/s), ``alpha`` the effective per-step latency including the software stack (s).
Every function here is a pure formula on one homogeneous level; ``hierarchical_*`` compose levels
the way NCCL's tree/hierarchical algorithms and the seed text's worked examples do. Byte counts
may be numpy arrays (the planner bounds whole blocks of layouts at once): the arithmetic is the
same, and so are the floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from optimizer.cost.num import Num


@dataclass(frozen=True)
class Level:
    """One level of a collective: ``ranks`` peers joined by links of ``beta_bytes_per_s``."""

    ranks: int
    beta_bytes_per_s: float
    alpha_s: float
    own_links: bool = True
    """Scale-up level: each rank has its own links, separate from the NIC that outer levels share."""


@overload
def p2p_time_s(num_bytes: float, beta_bytes_per_s: float, alpha_s: float) -> float: ...
@overload
def p2p_time_s(num_bytes: np.ndarray, beta_bytes_per_s: float, alpha_s: float) -> np.ndarray: ...
def p2p_time_s(num_bytes: Num, beta_bytes_per_s: float, alpha_s: float) -> Num:
    """Point-to-point transfer: ``alpha + n / beta``."""
    return alpha_s + num_bytes / beta_bytes_per_s


def ring_allreduce_time_s(num_bytes: Num, ranks: int, beta_bytes_per_s: float, alpha_s: float) -> Num:
    """Ring all-reduce: ``2(N-1)/N * M/beta + 2(N-1) * alpha``."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * num_bytes / beta_bytes_per_s + 2 * (ranks - 1) * alpha_s


def ring_reduce_scatter_time_s(num_bytes: Num, ranks: int, beta_bytes_per_s: float, alpha_s: float) -> Num:
    """Ring reduce-scatter of an ``M``-byte buffer: ``(N-1)/N * M/beta + (N-1) * alpha``.

    All-gather producing an ``M``-byte buffer costs the same.
    """
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * num_bytes / beta_bytes_per_s + (ranks - 1) * alpha_s


ring_allgather_time_s = ring_reduce_scatter_time_s


def hierarchical_allreduce_time_s(num_bytes: Num, levels: Sequence[Level]) -> Num:
    """All-reduce over nested levels, innermost first.

    Reduce-scatter inside each level on the way out (each level works on the shard the level
    below left, ``M / prod(inner ranks)``), all-reduce at the outermost level, all-gather back.
    With one level this is the ring all-reduce. Seed worked example: 140 GB of gradients on
    16 nodes x 8 GPUs (NVLink 450 GB/s, NDR 50 GB/s) -> ~1.2 s, against ~5.56 s for a flat ring.
    """
    active = [lv for lv in levels if lv.ranks > 1]
    if not active:
        return 0.0
    total: Num = 0.0
    shard = num_bytes * 1.0  # a number, or a numpy array of them
    for lv in active[:-1]:
        total += 2 * ring_reduce_scatter_time_s(shard, lv.ranks, lv.beta_bytes_per_s, lv.alpha_s)
        shard /= lv.ranks
    last = active[-1]
    return total + ring_allreduce_time_s(shard, last.ranks, last.beta_bytes_per_s, last.alpha_s)


@overload
def hierarchical_reduce_scatter_time_s(num_bytes: float, levels: Sequence[Level]) -> float: ...
@overload
def hierarchical_reduce_scatter_time_s(num_bytes: np.ndarray, levels: Sequence[Level]) -> Num: ...
def hierarchical_reduce_scatter_time_s(num_bytes: Num, levels: Sequence[Level]) -> Num:
    """Reduce-scatter over nested levels (innermost first); all-gather costs the same."""
    total: Num = 0.0
    shard = num_bytes * 1.0  # a number, or a numpy array of them
    for lv in levels:
        if lv.ranks > 1:
            total += ring_reduce_scatter_time_s(shard, lv.ranks, lv.beta_bytes_per_s, lv.alpha_s)
            shard /= lv.ranks
    return total


hierarchical_allgather_time_s = hierarchical_reduce_scatter_time_s


def flat_ring_levels(levels: tuple[Level, ...]) -> tuple[Level, ...]:
    """The same ranks as one flat ring: every hop at the slowest level's bandwidth and latency.

    This is the seed's "flat ring over IB" (70B BF16 gradients on 16 nodes x 8 GPUs: ~5,557 ms,
    against ~1,200.8 ms hierarchical): each rank's scale-out link carries the whole ring's traffic
    instead of sharing it with the other GPUs of its node. Never cheaper than the hierarchical
    levels (the per-level shares of ``M (N-1)/N`` add up to at most that over the slowest link, and
    ``sum(r_i - 1) <= prod(r_i) - 1`` latency steps).
    """
    active = [lv for lv in levels if lv.ranks > 1]
    if len(active) <= 1:
        return tuple(active)
    ranks = math.prod(lv.ranks for lv in active)
    beta = min(lv.beta_bytes_per_s for lv in active)
    alpha = max(lv.alpha_s for lv in active)
    return (Level(ranks, beta, alpha, own_links=False),)


def all_to_all_time_s(bytes_per_rank: float, levels: Sequence[Level]) -> float:
    """All-to-all where each rank sends ``bytes_per_rank`` spread evenly over the other ranks.

    Traffic to peers outside a level leaves through that level's link. Transfers to all peers
    run concurrently, so the time is one alpha plus the most loaded link's bytes over its
    bandwidth (the seed's "~8 us if all 7 run in parallel" case when every peer has its own link).
    """
    ranks = 1
    for lv in levels:
        ranks *= lv.ranks
    if ranks <= 1:
        return 0.0
    per_peer = bytes_per_rank / (ranks - 1)
    inner_time = 0.0  # an innermost scale-up level has its own links
    outer_time = 0.0  # scale-out levels share the rank's NIC, so their times add up
    inside = 1
    alpha = 0.0
    for i, lv in enumerate(levels):
        if lv.ranks <= 1:
            continue
        peers_here = inside * lv.ranks - inside  # reachable here but not in the levels below
        t = peers_here * per_peer / lv.beta_bytes_per_s
        if i == 0 and lv.own_links:
            inner_time = t
        else:
            outer_time += t
        alpha = max(alpha, lv.alpha_s)
        inside *= lv.ranks
    return alpha + max(inner_time, outer_time)
