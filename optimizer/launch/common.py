"""Batch and pipeline geometry every framework's launch settings share."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.cost.rules import ResolvedLayout
from optimizer.layer_split import even_split
from optimizer.specs import TrainingSpec


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
    etp: int = 1
    """Expert tensor-parallel size (routed experts split ``etp`` ways; 1: whole)."""
    moe: bool = False
    """The model has routed experts (laid out over the ``tp x cp x dp`` ranks as ``etp x ep x edp``)."""

    @property
    def has_dp_group(self) -> bool:
        """A ``dp x cp`` group exists: there are data-parallel collectives."""
        return self.dp * self.cp > 1

    @property
    def has_expert_dp_group(self) -> bool:
        """An expert-data-parallel group exists (``tp x cp x dp / (etp x ep)`` > 1 ranks): the
        routed experts' gradients are reduced even without a ``dp x cp`` group."""
        return self.moe and self.tp * self.cp * self.dp > self.etp * self.ep


def default_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> list[int]:
    """The split used when ``Layout.stage_layers`` is null: the cost model's even split.

    Every one of the ``pp * vpp`` chunks gets ``num_layers // (pp * vpp)`` layers; the remainder
    goes to the chunks nearest the middle, so the first chunk (embedding) and the last (output
    layer and loss) are the ones left with the smaller share.
    """
    return even_split(num_layers, pp * vpp)


def geometry(training: TrainingSpec, layout: ResolvedLayout, moe: bool) -> Geometry:
    """The batch and pipeline geometry of ``layout`` (a valid layout: the rules have derived and
    checked its data-parallel size, micro-batch count and layer split)."""
    assert training.global_batch_size is not None  # set by the spec validators
    return Geometry(
        tp=layout.tp,
        pp=layout.pp,
        cp=layout.cp,
        ep=layout.ep,
        vpp=layout.vpp,
        dp=layout.dp,
        mbs=layout.micro_batch_size,
        nmb=layout.num_micro_batches,
        gbs=training.global_batch_size,
        seq=training.seq_len,
        sp=layout.sequence_parallel,
        chunks=layout.stage_layers,
        etp=layout.etp,
        moe=moe,
    )


def dp_overlapped(training: TrainingSpec, geo: Geometry, zero_stage: int) -> bool:
    """The plan overlaps data-parallel collectives (``training.dp_comm_overlap``) and has them (a
    ``dp x cp`` group, or an expert-data-parallel one), or shards at ZeRO-2/3, where Megatron-FSDP
    asserts the overlap whatever the group sizes (``megatron_fsdp.py@000c4ac2``: ``optim_grads``
    and ``optim_grads_params`` need ``overlap_grad_reduce``)."""
    has_collectives = geo.has_dp_group or geo.has_expert_dp_group or zero_stage >= 2
    return training.dp_comm_overlap and has_collectives
