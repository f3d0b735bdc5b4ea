"""MoE token dispatchers: the time of one dispatch (or combine) of an MoE layer's tokens.

``training.moe_dispatcher`` names the stack's dispatcher (Megatron-Core's names):

- ``alltoall``: ``MoEAlltoAllTokenDispatcher``. Tokens are permuted into expert order and every
  routed copy (``top_k`` of each token) goes to its expert's rank through one NCCL all-to-all on
  the compute stream: nothing of it overlaps the same micro-batch's compute.
- ``allgather``: ``MoEAllGatherTokenDispatcher``. Every rank all-gathers the expert-parallel
  group's tokens and keeps its experts' ones; the combine is the mirror reduce-scatter. No
  overlap within a micro-batch either.
- ``deepep``: the flex dispatcher with DeepEP (NVLink inside a node, RDMA across nodes). A token
  goes once to each rank that holds one of its experts, and once to each other node (to the
  rank on its own rail, which forwards it over NVLink): the per-node de-duplication of DeepEP's
  ``get_dispatch_layout`` (``is_token_in_rank``, ``num_tokens_per_rdma_rank``). It moves fewer
  bytes; like the others it does not overlap the same micro-batch's compute in Megatron-Core
  (``fused_a2a.py`` dispatches with ``async_finish`` off: the compute stream waits). DeepEP can
  dispatch FP8 rows, but Megatron-Core (0.14.0 and 000c4ac2) hands it the bf16 hidden states in FP8 training too
  (``fused_a2a.py`` ``buffer.dispatch(x, ...)``, no FP8 path at 000c4ac2): every dispatch is bf16.
- ``hybridep``: the flex dispatcher's HybridEP backend (NVL72 racks: TMA copies within the
  NVLink domain, RDMA across). Costed as DeepEP: the same de-duplication (no separate bandwidth
  measurement is published).

Every dispatcher's time is exposed unless the job overlaps one micro-batch's dispatch with
another's compute (``training.ep_comm_overlap``: ``layer.ep_comm_s``).

Routing is taken as balanced (the published runs force-balance it), with each of a token's
``top_k`` experts on a uniformly random rank; expected distinct destinations follow from that.
"""

from __future__ import annotations

from dataclasses import replace

from optimizer.cost.comm import Level, all_to_all_time_s, hierarchical_allgather_time_s

DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
DEDUPLICATING_DISPATCHERS = frozenset({"deepep", "hybridep"})
"""Dispatchers that send a token once per destination rank and node."""
ACT_BYTES = 2.0
"""Bytes per element of a dispatched or combined row (bf16, whatever the GEMM precision)."""


def distinct_other_groups(top_k: int, groups: int) -> float:
    """Expected number of groups other than the token's own (of ``groups`` equal ones) that hold at
    least one of its ``top_k`` experts, each expert on a uniformly random group:
    ``(groups - 1) * (1 - (1 - 1/groups) ** top_k)``; never more than the ``top_k (groups-1)/groups``
    copies an undeduplicated dispatch sends."""
    if groups <= 1:
        return 0.0
    return (groups - 1) * (1.0 - (1.0 - 1.0 / groups) ** top_k)


def scale_out_derated(levels: tuple[Level, ...], efficiency: float) -> tuple[Level, ...]:
    """``levels`` with the scale-out ones (those sharing the rank's NIC) at ``efficiency`` of their
    bandwidth: what an all-to-all's many-peer traffic across nodes gets of it
    (``Calibration.scale_out_all_to_all_efficiency``)."""
    if efficiency == 1.0:
        return levels
    return tuple(
        lv if lv.own_links else replace(lv, beta_bytes_per_s=lv.beta_bytes_per_s * efficiency) for lv in levels
    )


def dispatch_time_s(
    dispatcher: str,
    tokens: float,
    hidden: float,
    top_k: int,
    levels: tuple[Level, ...],
    imbalance: float = 1.0,
    scale_out_efficiency: float = 1.0,
) -> tuple[float, float]:
    """(dispatch, combine) time of one MoE layer's ``tokens`` (this rank's, ``hidden`` wide) over an
    expert-parallel group spread over ``levels`` (innermost first). ``imbalance``: busiest rank's volume / mean.
    ``scale_out_efficiency``: the share of a scale-out level's bandwidth the all-to-all dispatchers
    get (``scale_out_derated``; the all-gather dispatcher's collectives run at the full rate)."""
    ranks = 1
    for lv in levels:
        ranks *= lv.ranks
    if ranks <= 1:
        return 0.0, 0.0
    row = tokens * hidden * imbalance  # elements of this rank's tokens
    if dispatcher != "allgather":
        levels = scale_out_derated(levels, scale_out_efficiency)
    if dispatcher == "alltoall":
        one = all_to_all_time_s(row * top_k * ACT_BYTES * (ranks - 1) / ranks, levels)
        return one, one
    if dispatcher == "allgather":
        one = hierarchical_allgather_time_s(row * ACT_BYTES * ranks, levels)
        return one, one
    if dispatcher not in DEDUPLICATING_DISPATCHERS:
        raise ValueError(f"unknown MoE dispatcher {dispatcher!r}")
    one = _deduplicated_s(row * ACT_BYTES, top_k, levels, ranks)
    return one, one


def _deduplicated_s(row_bytes: float, top_k: int, levels: tuple[Level, ...], ranks: int) -> float:
    """DeepEP-style transfer of ``row_bytes`` per token row: once per distinct destination rank over
    the scale-up level, once per distinct other node over the scale-out levels, the two stages
    pipelined (the slower one sets the time)."""
    inner = levels[0] if levels[0].own_links else None
    local = inner.ranks if inner is not None else 1
    nodes = ranks // local
    other_ranks = distinct_other_groups(top_k, ranks)
    if nodes <= 1:
        return all_to_all_time_s(row_bytes * other_ranks, levels)
    # over NVLink: the copies for ranks of this node, and forwarding what arrives for other ranks
    # of the destination node (all but the rail rank's share)
    local_share = (local - 1) / (ranks - 1) + (ranks - local) / (ranks - 1) * (local - 1) / local
    t_inner = all_to_all_time_s(row_bytes * other_ranks * local_share, levels[:1]) if inner is not None else 0.0
    outer = levels[1:] if inner is not None else levels
    t_outer = all_to_all_time_s(row_bytes * distinct_other_groups(top_k, nodes), outer)
    return max(t_inner, t_outer)
