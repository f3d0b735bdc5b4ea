"""``layer_compute`` memoised per layer kind and ``Dims``: every rank order of a layout, and the
search's bounds, share one layer's compute, activation memory and parameters."""

from __future__ import annotations

from typing import NamedTuple

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.layer import Dims, LayerCompute, layer_compute


class KindDimsKey(NamedTuple):
    """What ``layer_compute`` reads: the layer kind (its index in ``ctx.kinds``) and the ``Dims``
    fields (no group geometry: communication is not part of it)."""

    kind: int
    tp: int
    cp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    etp: int


def kind_dims_key(kind: int, dims: Dims) -> KindDimsKey:
    return tuple.__new__(KindDimsKey, (kind, dims.tp, dims.cp, dims.ep, dims.micro_batch_size, dims.sequence_parallel,
                                       dims.recompute, dims.etp))  # fmt: skip


LAYER_COMPUTE = Memo[KindDimsKey, LayerCompute]("layer_compute")


def kind_compute(ctx: JobContext, kind: int, dims: Dims) -> LayerCompute:
    """``layer_compute`` of ``ctx.kinds[kind]`` under ``dims``, memoised per ``KindDimsKey``."""
    key = kind_dims_key(kind, dims)
    table = ctx.caches[LAYER_COMPUTE]
    c = table.get(key)
    if c is None:
        c = table[key] = layer_compute(ctx, ctx.kinds[kind], dims)
    return c
