"""Expert tensor parallelism (``etp``): the collectives Megatron-Core adds when each routed
expert's FFN is split ``etp`` ways.

The expert ranks of a pipeline stage are laid out etp-ep-edp (``parallel_state``'s expert rank
generator): the expert-TP group is the innermost ``etp`` ranks, the EP group strides ``etp``, the
``etp x ep`` block is contiguous (``AxisGroups.etp``, ``.ep``, ``.tp_ep``).

- ``alltoall`` dispatcher (``MoEAlltoAllTokenDispatcher``: "A2A(EP) -> AG(TP) -> experts ->
  RS(TP) -> A2A(EP)"): after the EP all-to-all the rank all-gathers its expert-TP group's
  dispatched tokens and probabilities (each rank then runs its expert shards on ``etp x`` the
  tokens) and, before the combine all-to-all, reduce-scatters the partial expert outputs in the
  probabilities' dtype. Backward mirrors both (the gather's backward is a reduce-scatter, the
  scatter's an all-gather). ``etp_collectives_fwd_s`` is the forward pair.
- flex dispatcher (DeepEP, HybridEP): one fused all-to-all over the ``etp x ep`` block, each
  selected (token, expert rank) sent to all ``etp`` shards, which the combine sums: costed as the
  dispatcher's own transfer of ``etp x`` the tokens over the block (an upper bound: it counts a
  token's ``etp`` copies as distinct destinations).
- ``allgather`` dispatcher: its all-gather and reduce-scatter run over the ``etp x ep`` block.

With ``etp = 1`` none of these exist and the expert terms are the whole-expert ones.
"""

from __future__ import annotations

from optimizer.cost.comm import Level, hierarchical_allgather_time_s, hierarchical_reduce_scatter_time_s

ACT_BYTES = 2.0
PROBS_BYTES = 2.0
"""Bytes of a routing probability, and of an element of the expert output the reduce-scatter
sums (Megatron-Core reduce-scatters in the probabilities' dtype: bf16, the logits' dtype, unless
``--moe-router-dtype fp32``)."""


def etp_collectives_fwd_s(routed: float, hidden: float, etp: int, levels: tuple[Level, ...]) -> float:
    """Forward time of the ``alltoall`` dispatcher's expert-TP all-gather (tokens ``hidden`` wide
    and their probabilities) and reduce-scatter (expert outputs) for ``routed`` token copies this
    rank received from the EP all-to-all, over an expert-TP group of ``etp`` ranks on ``levels``.
    The backward pair moves the same bytes."""
    if etp <= 1 or not levels:
        return 0.0
    gathered = etp * routed  # token copies each rank of the group holds after the all-gather
    gather = hierarchical_allgather_time_s(gathered * (hidden * ACT_BYTES + PROBS_BYTES), levels)
    scatter = hierarchical_reduce_scatter_time_s(gathered * hidden * PROBS_BYTES, levels)
    return float(gather + scatter)
