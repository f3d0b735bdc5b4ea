"""Exact step time and peak memory of many layouts at once, as numpy columns.

A batch is the layouts that share their parallel sizes (``tp, pp, dp, cp, ep``) and differ in
micro-batch size, sequence parallelism, recompute and interleaving depth (uniform layer split);
it is costed under several rank orders and ZeRO stages at once. The per-kind layer costs and the
LM head's time come from the scalar functions (``stage.kind_costs``,
``head.head_time_at_s``: a few per batch, memoised per job); the stage sums, data-parallel exposure, stage memory and pipeline composition are
``estimate``'s own functions (``stage_fixed_terms``, ``dp_exposed_s``, ``stage_memory``,
``step_breakdown``, ``pp_comm_s``) run on arrays of shape (layouts, stages). There is no second
copy of a formula: the floats equal ``estimate(ctx, layout, order)``'s, which a test checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import cast

import numpy as np

from optimizer.cost.context import JobContext
from optimizer.cost.dp_comm import dp_exposed_s
from optimizer.cost.estimate import pp_comm_s, step_breakdown, unoverlapped_ep_share
from optimizer.cost.head import head_time_at_s
from optimizer.cost.layer import Dims, LayerCost
from optimizer.cost.memory import memory_signature, stage_memory
from optimizer.cost.pipeline import even_split
from optimizer.cost.rules import ResolvedLayout, resolve
from optimizer.cost.stage import (
    StageTerms,
    kind_costs,
    split_kind_counts,
    stage_fixed_terms,
)
from optimizer.cost.topology import AxisGroups
from optimizer.specs import JobSpec

_LAYER_FIELDS = tuple(f.name for f in fields(LayerCost) if f.name != "tp_wgrad_windows_s")  # the numbers


@dataclass(frozen=True)
class LayoutColumns:
    """A batch of layouts: the ``ResolvedLayout`` fields the stage arithmetic reads.

    The sizes and the ZeRO stage are numbers; the rest are arrays of shape (layouts, 1), so that a
    stage axis broadcasts against them. Every layout has the uniform layer split of its depth.
    """

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    zero_stage: int
    micro_batch_size: np.ndarray
    sequence_parallel: np.ndarray
    recompute: tuple[str, ...]
    """One mode per layout: read only here (through the layer costs), never by the shared stage
    arithmetic, which takes the layer costs instead."""
    vpp: np.ndarray
    num_micro_batches: np.ndarray
    etp: int = 1
    """Expert tensor-parallel size (the search's batches keep experts whole)."""

    @classmethod
    def of(
        cls,
        sizes: tuple[int, int, int, int, int] | tuple[int, int, int, int, int, int],
        zero_stage: int,
        micro_batch_size: Sequence[int],
        sequence_parallel: Sequence[bool],
        recompute: Sequence[str],
        vpp: Sequence[int],
        num_micro_batches: Sequence[int],
    ) -> LayoutColumns:
        """From ``(tp, pp, dp, cp, ep[, etp])``, the ZeRO stage and one value per layout of the rest."""
        tp, pp, dp, cp, ep = sizes[:5]
        etp = sizes[5] if len(sizes) > 5 else 1

        def column(values: Sequence, dtype: type) -> np.ndarray:
            return np.asarray(values, dtype=dtype).reshape(-1, 1)

        return cls(tp, pp, dp, cp, ep, zero_stage, column(micro_batch_size, np.int64),
                   column(sequence_parallel, bool), tuple(recompute), column(vpp, np.int64),
                   column(num_micro_batches, np.int64), etp)  # fmt: skip

    @classmethod
    def of_layouts(cls, layouts: Sequence[ResolvedLayout]) -> LayoutColumns:
        """The columns of ``layouts`` (one family at one ZeRO stage, uniform layer splits): the
        one conversion from layout values; ``layout_at`` converts a row back."""
        first = layouts[0]
        if any(x.family != first.family or x.zero_stage != first.zero_stage for x in layouts):
            raise ValueError("a batch of layouts shares its parallel sizes and ZeRO stage")
        return cls.of(
            first.family, first.zero_stage, [x.micro_batch_size for x in layouts],
            [x.sequence_parallel for x in layouts], [x.recompute for x in layouts], [x.vpp for x in layouts],
            [x.num_micro_batches for x in layouts],
        )  # fmt: skip

    def layout_at(self, job: JobSpec, row: int, zero_stage: int | None = None) -> ResolvedLayout:
        """Row ``row`` as a layout value (at ``zero_stage``, default the batch's), resolved for ``job``."""
        return resolve(
            job, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, vpp=int(self.vpp[row, 0]),
            micro_batch_size=int(self.micro_batch_size[row, 0]),
            zero_stage=self.zero_stage if zero_stage is None else zero_stage, recompute=self.recompute[row],
            sequence_parallel=bool(self.sequence_parallel[row, 0]), dp=self.dp,
            num_micro_batches=int(self.num_micro_batches[row, 0]), etp=self.etp,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.recompute)


@dataclass(frozen=True)
class ColumnCosts:
    """Per layout of a batch, under one rank order: what ``estimate`` gives for it."""

    step_time_s: np.ndarray
    """Read-only (a broadcast view for single-stage batches)."""
    peak_memory_bytes: np.ndarray


def _rows_of(keys: list) -> tuple[list, np.ndarray]:
    """The distinct ``keys`` in order of first appearance, and each key's index among them."""
    distinct = list(dict.fromkeys(keys))
    position = {k: i for i, k in enumerate(distinct)}
    return distinct, np.fromiter((position[k] for k in keys), dtype=np.int64, count=len(keys))


def _dims_rows(cols: LayoutColumns) -> tuple[list[Dims], np.ndarray]:
    """The distinct ``Dims`` of the batch's layouts (what their layer costs depend on besides the
    rank order), and each layout's index among them."""
    mbs = cols.micro_batch_size[:, 0].tolist()
    sp = cols.sequence_parallel[:, 0].tolist()
    distinct, index = _rows_of(list(zip(mbs, sp, cols.recompute, strict=True)))
    return [Dims(cols.tp, cols.cp, cols.ep, b, s, r, cols.etp) for b, s, r in distinct], index


def _layer_columns(ctx: JobContext, dims_rows: tuple[list[Dims], np.ndarray], groups: AxisGroups) -> list[LayerCost]:
    """Per layer kind, a ``LayerCost`` whose fields are (layouts, 1) columns (``dims_rows``:
    ``_dims_rows`` of the batch)."""
    distinct, index = dims_rows
    tables = [kind_costs(ctx, dims, groups) for dims in distinct]
    out = []
    for k in range(len(ctx.kinds)):
        values = np.array([[getattr(t[k], f) for f in _LAYER_FIELDS] for t in tables])  # distinct x field
        out.append(LayerCost(*(values[index, i][:, None] for i in range(len(_LAYER_FIELDS)))))
    return out


def _count_columns(ctx: JobContext, cols: LayoutColumns) -> list[np.ndarray]:
    """Per layer kind, the layers of that kind on each stage: (layouts, pp) arrays."""
    layers = ctx.job.model.num_layers or 0
    distinct, index = _rows_of(cols.vpp[:, 0].tolist())
    by_depth = np.array(
        [split_kind_counts(ctx, cols.pp, tuple(even_split(layers, cols.pp * v))) for v in distinct], dtype=np.int64
    )  # depth x stage x kind
    return [by_depth[index, :, k] for k in range(by_depth.shape[2])]


def cost_columns(
    ctx: JobContext, cols: LayoutColumns, orders: Sequence[AxisGroups], zero_stages: Sequence[int] | None = None
) -> list[list[ColumnCosts]]:
    """``estimate(ctx, layout, order)``'s step time and peak memory for every layout of ``cols``
    under each rank order of ``orders`` (the groups of rank orders of the batch's sizes), at each
    ZeRO stage of ``zero_stages`` (default the batch's): ``[zero stage][order]``.

    As in ``estimate``'s memo keys, the layer costs depend on the order only through the TP / CP /
    EP geometries, and everything of a stage but its exposed data-parallel time also through
    ``memory_signature``, so orders that share them share that work (and ZeRO stages share the
    layer costs); each order adds its data-parallel and pipeline communication and the
    composition.
    """
    zeros = [cols.zero_stage] if zero_stages is None else list(zero_stages)
    pp = cols.pp
    counts = _count_columns(ctx, cols)
    mbs_distinct, mbs_index = _rows_of(cols.micro_batch_size[:, 0].tolist())
    head = np.array([head_time_at_s(ctx, cols.tp, cols.cp, b) for b in mbs_distinct])[mbs_index][:, None]
    stage = np.arange(pp)[None, :]
    first, last = (stage == 0).astype(float), (stage == pp - 1).astype(float)
    dims_rows = _dims_rows(cols)
    rows = np.arange(len(cols))
    layers: dict[tuple, list[LayerCost]] = {}
    out: list[list[ColumnCosts]] = []
    for zero in zeros:
        at_zero = replace(cols, zero_stage=zero)
        fixed: dict[tuple, tuple] = {}
        out.append([])
        for groups in orders:
            geometry = (groups.tp, groups.cp, groups.ep)
            signature = memory_signature(groups)
            key = (geometry, signature)
            if key not in fixed:
                if geometry not in layers:
                    layers[geometry] = _layer_columns(ctx, dims_rows, groups)
                t, stored, grads, dp_inputs = stage_fixed_terms(
                    ctx, at_zero, sum(signature), layers[geometry], counts, first, last, head
                )
                memory = stage_memory(ctx, at_zero, stage, t.memory, stored, grads)
                shape = cast(np.ndarray, t.compute_s).shape  # arrays here (layouts x stages)
                # the slowest stage and the largest optimizer step do not depend on the order's
                # data-parallel and pipeline groups: once per key, as compose_step takes them
                slow = np.argmax(t.time_s, axis=1)
                fwd, bwd, compute, tp, cp, ep = (
                    np.broadcast_to(x, shape)[rows, slow][:, None] for x in (t.fwd_s, t.bwd_s, t.compute_s, t.tp_s,
                                                                              t.cp_s, t.ep_s)
                )  # fmt: skip
                slowest = StageTerms(fwd, bwd, compute, tp, cp, ep, 0.0, 0.0, t.memory)
                optimizer = np.broadcast_to(t.optimizer_s, shape).max(axis=1, keepdims=True)
                fixed[key] = (slowest, optimizer, dp_inputs, shape, cast(np.ndarray, memory.total_bytes).max(axis=1))
            slowest, optimizer, dp_inputs, shape, peak = fixed[key]
            dp_exposed = np.broadcast_to(dp_exposed_s(ctx, at_zero, groups, *dp_inputs), shape)
            breakdown = step_breakdown(at_zero, slowest, dp_exposed.max(axis=1, keepdims=True), optimizer,
                                       pp_comm_s(ctx, at_zero, groups), unoverlapped_ep_share(ctx, at_zero))  # fmt: skip
            step = np.broadcast_to(sum(breakdown.values()), (len(cols), 1))[:, 0]
            out[-1].append(ColumnCosts(step, peak))
    return out
