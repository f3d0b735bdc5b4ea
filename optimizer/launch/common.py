"""Batch and pipeline geometry every framework's launch settings share."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.layer_split import even_split
from optimizer.specs import Layout, ModelSpec, TrainingSpec


@dataclass(frozen=True)
class Geometry:
    """Batch and pipeline geometry shared by every framework."""

    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    dp: int
    mbs: int
    nmb: int
    gbs: int
    seq: int
    sp: bool
    chunks: tuple[int, ...]
    """Layers per pipeline chunk in schedule (model) order; chunk i runs on rank i % pp."""

    @property
    def has_dp_group(self) -> bool:
        """A ``dp x cp`` group exists: there are data-parallel collectives."""
        return self.dp * self.cp > 1


def default_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> list[int]:
    """The split used when ``Layout.stage_layers`` is null: the cost model's even split.

    Every one of the ``pp * vpp`` chunks gets ``num_layers // (pp * vpp)`` layers; the remainder
    goes to the chunks nearest the middle, so the first chunk (embedding) and the last (output
    layer and loss) are the ones left with the smaller share.
    """
    return even_split(num_layers, pp * vpp)


def geometry(model: ModelSpec, training: TrainingSpec, layout: Layout) -> Geometry:
    if layout.dp is None:
        raise ValueError("layout.dp must be set before building launch settings")
    gbs = training.global_batch_size
    assert gbs is not None and model.num_layers is not None  # set by the spec validators
    nmb = layout.num_micro_batches
    if nmb is None:
        nmb = gbs // (layout.dp * layout.micro_batch_size)
    if layout.micro_batch_size * nmb * layout.dp != gbs:
        raise ValueError(
            f"micro_batch_size ({layout.micro_batch_size}) * num_micro_batches ({nmb}) * dp "
            f"({layout.dp}) != global_batch_size ({gbs})"
        )
    n = layout.pp * layout.vpp
    if layout.stage_layers is None:
        chunks = default_stage_layers(model.num_layers, layout.pp, layout.vpp)
    else:
        chunks = list(layout.stage_layers)
        if len(chunks) != n or sum(chunks) != model.num_layers or min(chunks) < 0:
            raise ValueError(
                f"stage_layers {chunks} must have pp*vpp = {n} non-negative entries summing to "
                f"num_layers = {model.num_layers}"
            )
    return Geometry(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        ep=layout.ep,
        vpp=layout.vpp,
        dp=layout.dp,
        mbs=layout.micro_batch_size,
        nmb=nmb,
        gbs=gbs,
        seq=training.seq_len,
        sp=bool(layout.sequence_parallel) and layout.tp > 1,
        chunks=tuple(chunks),
    )


def dp_overlapped(training: TrainingSpec, geo: Geometry) -> bool:
    """The plan overlaps data-parallel collectives (``training.dp_comm_overlap``) and has them
    (a ``dp x cp`` group)."""
    return training.dp_comm_overlap and geo.has_dp_group
