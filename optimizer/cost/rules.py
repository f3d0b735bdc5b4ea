"""The layout value (``ResolvedLayout``) and the validity rules of a layout for a job.

``resolve`` is the one place the rules live (each failure names the field and the reason) and the
one way to build a ``ResolvedLayout``; ``ResolvedLayout.from_spec`` resolves a request's
``Layout``. What other code needs of a layout is a view of the value: ``dims`` (what a layer's
cost depends on), ``family`` (its parallel sizes), ``sizes()`` (per axis), ``at_depth`` (the same
layout interleaved deeper) and ``to_spec`` (back to the request type)."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.cost.pipeline import even_split
from optimizer.cost.topology import ETP
from optimizer.errors import InvalidLayout
from optimizer.modes import Axis, RecomputeMode
from optimizer.specs import JobSpec, Layout


@dataclass(frozen=True)
class Dims:
    """The layout numbers the per-layer cost depends on (``ResolvedLayout.dims``)."""

    tp: int
    cp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    etp: int = 1
    """Expert tensor-parallel size (each routed expert split ``etp`` ways)."""


@dataclass(frozen=True)
class ResolvedLayout:
    """A valid layout with every derived number filled in: built by ``resolve`` (or
    ``from_spec``), frozen and hashable."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    num_micro_batches: int
    stage_layers: tuple[int, ...]
    """Layers per chunk in schedule order (``pp * vpp`` entries)."""
    etp: int = 1
    """Expert tensor-parallel size: routed experts split ``etp`` ways (1: whole)."""

    @property
    def uniform_split(self) -> bool:
        return len(set(self.stage_layers)) == 1

    def sizes(self) -> dict[str, int]:
        """The size of each parallel axis."""
        return {Axis.TP: self.tp, Axis.CP: self.cp, Axis.DP: self.dp, Axis.PP: self.pp, Axis.EP: self.ep,
                ETP: self.etp}  # fmt: skip

    @property
    def family(self) -> tuple[int, int, int, int, int, int]:
        """The parallel sizes ``(tp, pp, dp, cp, ep, etp)``: the layout's family in the search."""
        return (self.tp, self.pp, self.dp, self.cp, self.ep, self.etp)

    @property
    def dims(self) -> Dims:
        """The numbers the per-layer cost depends on."""
        return Dims(self.tp, self.cp, self.ep, self.micro_batch_size, self.sequence_parallel, self.recompute, self.etp)

    @classmethod
    def from_spec(cls, layout: Layout, job: JobSpec) -> ResolvedLayout:
        """``layout`` checked against ``job``; raises :class:`InvalidLayout` naming the failing field."""
        return resolve(
            job,
            tp=layout.tp,
            pp=layout.pp,
            cp=layout.cp,
            ep=layout.ep,
            vpp=layout.vpp,
            micro_batch_size=layout.micro_batch_size,
            zero_stage=layout.zero_stage,
            recompute=layout.recompute,
            sequence_parallel=bool(layout.sequence_parallel),
            dp=layout.dp,
            num_micro_batches=layout.num_micro_batches,
            stage_layers=layout.stage_layers,
            etp=layout.etp,
        )

    def at_depth(self, job: JobSpec, vpp: int) -> ResolvedLayout:
        """The same layout at interleaving depth ``vpp`` with the even layer split (resolved:
        raises :class:`InvalidLayout` when the rules reject that depth)."""
        return resolve(
            job, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep, vpp=vpp, micro_batch_size=self.micro_batch_size,
            zero_stage=self.zero_stage, recompute=self.recompute, sequence_parallel=self.sequence_parallel,
            etp=self.etp,
        )  # fmt: skip

    def to_spec(self) -> Layout:
        """The request type of this layout (every derived number set; no placement)."""
        return Layout(
            tp=self.tp,
            pp=self.pp,
            dp=self.dp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            vpp=self.vpp,
            micro_batch_size=self.micro_batch_size,
            zero_stage=self.zero_stage,  # type: ignore[arg-type]
            recompute=self.recompute,  # type: ignore[arg-type]
            sequence_parallel=self.sequence_parallel,
            num_micro_batches=self.num_micro_batches,
            stage_layers=list(self.stage_layers),
            placement=None,
        )


def with_knobs(fields: dict, zero_stage: int, recompute: str) -> ResolvedLayout:
    """A resolved layout (``fields``: its ``__dict__``) with another ZeRO stage and recompute mode
    (one the rules accept for the job: ``moe`` only for MoE models).

    Neither changes validity or any derived number, so the fields are copied as they are rather
    than passed through the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per
    field), which was most of the time spent enumerating the larger search spaces.
    """
    lay = object.__new__(ResolvedLayout)
    values = lay.__dict__
    values.update(fields)
    values["zero_stage"] = zero_stage
    values["recompute"] = recompute
    return lay


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending (the sizes a parallel axis of ``n`` ranks can take)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def resolve_layout(job: JobSpec, layout: Layout) -> ResolvedLayout:
    """``ResolvedLayout.from_spec(layout, job)``."""
    return ResolvedLayout.from_spec(layout, job)


def resolve(
    job: JobSpec,
    *,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    vpp: int,
    micro_batch_size: int,
    zero_stage: int,
    recompute: str,
    sequence_parallel: bool,
    dp: int | None = None,
    num_micro_batches: int | None = None,
    stage_layers: list[int] | tuple[int, ...] | None = None,
    etp: int = 1,
) -> ResolvedLayout:
    """The layout rules on plain numbers: the one constructor of a ``ResolvedLayout`` (the search
    calls this directly; ``ResolvedLayout.from_spec`` for a request's ``Layout``)."""
    model = job.model
    n = job.cluster.resolved_num_gpus
    layers = model.num_layers or 0
    gbs = job.training.global_batch_size or 0
    dp = _data_parallel(n, tp, pp, cp, dp)
    _check_tensor_parallel(job, tp)
    _check_experts(job, tp, dp, cp, ep, recompute)
    _check_expert_tensor_parallel(job, tp, dp, cp, ep, etp)
    _check_context_parallel(job, cp)
    mbs = micro_batch_size
    m = _micro_batches(gbs, dp, mbs, num_micro_batches)
    _check_pipeline(layers, pp, vpp, m)
    split = _stage_split(layers, pp * vpp, stage_layers)
    if (reason := sequence_parallel_reason(job, tp, sequence_parallel)) is not None:
        raise InvalidLayout("config.sequence_parallel", reason)
    local = job.training.seq_len // cp
    if sequence_parallel and local % tp:
        raise InvalidLayout(
            "config.sequence_parallel",
            f"sequence parallelism splits each context-parallel rank's {local} tokens over tp ({tp}): they must divide",
        )
    return ResolvedLayout(tp, pp, dp, cp, ep, vpp, mbs, zero_stage, recompute, sequence_parallel, m, tuple(split), etp)


def sequence_parallel_reason(job: JobSpec, tp: int, sp: bool) -> str | None:
    """Why no layout of the job runs ``tp`` with sequence parallelism ``sp`` (None when one can)."""
    if sp and tp == 1:
        return "sequence parallelism splits activations over the tensor-parallel group: it needs tp > 1"
    if sp and job.training.seq_len % tp:
        return f"sequence parallelism splits the sequence over tp: seq_len ({job.training.seq_len}) must divide by tp ({tp})"
    if not sp and tp > 1 and job.model.moe is not None:
        return (
            "an MoE model with tp > 1 runs with sequence parallelism: each tensor-parallel rank routes its own "
            "share of the tokens (Megatron-Core's MoE layer refuses tp > 1 without it in training, "
            "megatron/core/transformer/moe/moe_layer.py)"
        )
    return None


def _data_parallel(n: int, tp: int, pp: int, cp: int, dp: int | None) -> int:
    """The data-parallel size ``n / (tp pp cp)``, checked against a given ``dp``."""
    if n % (tp * pp * cp):
        sizes = {"tp": tp, "pp": pp, "cp": cp}
        # the field at fault: the first that alone does not divide, else the last that makes the product
        at = next((k for k, v in sizes.items() if n % v), None) or [k for k, v in sizes.items() if v > 1][-1]
        raise InvalidLayout(f"config.{at}", f"tp*pp*cp = {tp * pp * cp} does not divide num_gpus = {n}")
    given_dp = dp
    dp = n // (tp * pp * cp)
    if given_dp is not None and given_dp != dp:
        raise InvalidLayout(
            "config.dp", f"tp*pp*dp*cp must equal num_gpus: {tp}*{pp}*{given_dp}*{cp} != {n} (dp would be {dp})"
        )
    return dp


def tensor_parallel_reason(job: JobSpec, tp: int) -> str | None:
    """Why the model's heads or FFN cannot be split ``tp`` ways (None when they can)."""
    model = job.model
    heads = model.num_attention_heads or 0
    kv = model.num_kv_heads or 0
    if heads % tp:
        return f"num_attention_heads ({heads}) is not divisible by tp ({tp})"
    if model.mla is None and kv % tp and tp % kv:
        return f"num_kv_heads ({kv}) and tp ({tp}) must divide one another"
    ffn = model.ffn_hidden_size or 0
    if ffn % tp:
        return f"ffn_hidden_size ({ffn}) is not divisible by tp ({tp})"
    return None


def _check_tensor_parallel(job: JobSpec, tp: int) -> None:
    if (reason := tensor_parallel_reason(job, tp)) is not None:
        raise InvalidLayout("config.tp", reason)


def _check_experts(job: JobSpec, tp: int, dp: int, cp: int, ep: int, recompute: str) -> None:
    model = job.model
    if model.moe is None:
        if ep != 1:
            raise InvalidLayout("config.ep", "ep > 1 needs an MoE model")
        if recompute == RecomputeMode.MOE:
            raise InvalidLayout("config.recompute", "'moe' recomputes MoE blocks and needs an MoE model")
    else:
        if (tp * dp * cp) % ep:
            raise InvalidLayout("config.ep", f"ep ({ep}) must divide tp*dp*cp ({tp * dp * cp})")
        if model.moe.num_experts % ep:
            raise InvalidLayout("config.ep", f"num_experts ({model.moe.num_experts}) is not divisible by ep ({ep})")


def expert_tensor_parallel_reason(job: JobSpec, tp: int, dp: int, cp: int, ep: int, etp: int) -> str | None:
    """Why routed experts cannot be split ``etp`` ways in this layout (None when they can): as
    Megatron-Core builds its expert groups (``parallel_state.initialize_model_parallel``: the
    expert ranks ``etp x ep x edp`` tile each stage's ``tp x cp x dp`` ranks) and splits each
    expert's FFN (``divide(ffn, etp)`` in the grouped linear layers)."""
    if etp < 1:
        return f"etp ({etp}) must be at least 1"
    if etp == 1:
        return None
    moe = job.model.moe
    if moe is None:
        return "etp > 1 splits routed experts and needs an MoE model"
    if (tp * dp * cp) % (etp * ep):
        return f"ep*etp ({ep}*{etp}) must divide tp*dp*cp ({tp * dp * cp})"
    ffn = moe.expert_ffn_hidden_size
    if ffn % etp:
        return f"moe.expert_ffn_hidden_size ({ffn}) is not divisible by etp ({etp})"
    return None


def _check_expert_tensor_parallel(job: JobSpec, tp: int, dp: int, cp: int, ep: int, etp: int) -> None:
    if (reason := expert_tensor_parallel_reason(job, tp, dp, cp, ep, etp)) is not None:
        raise InvalidLayout("config.etp", reason)


def _check_context_parallel(job: JobSpec, cp: int) -> None:
    seq = job.training.seq_len
    if cp > 1 and job.training.attention_kernel == "unfused":
        raise InvalidLayout(
            "config.cp",
            "context parallelism needs a fused attention kernel: training.attention_kernel 'unfused' "
            "materialises the full s x s scores (use flash2 or flash3)",
        )
    if cp > 1 and seq % (2 * cp):
        raise InvalidLayout("config.cp", f"seq_len ({seq}) must be divisible by 2*cp ({2 * cp}) for load-balanced CP")


def _micro_batches(gbs: int, dp: int, mbs: int, num_micro_batches: int | None) -> int:
    """Micro-batches per step, ``gbs / (dp mbs)``, checked against a given count."""
    if gbs % (dp * mbs):
        raise InvalidLayout(
            "config.micro_batch_size",
            f"global_batch_size ({gbs}) is not divisible by dp*micro_batch_size ({dp}*{mbs})",
        )
    m = gbs // (dp * mbs)
    if num_micro_batches is not None and num_micro_batches != m:
        raise InvalidLayout("config.num_micro_batches", f"must be global_batch_size/(dp*micro_batch_size) = {m}")
    return m


def _check_pipeline(layers: int, pp: int, vpp: int, m: int) -> None:
    if pp > layers:
        raise InvalidLayout("config.pp", f"pp ({pp}) exceeds num_layers ({layers})")
    if pp > 1 and m < pp:
        raise InvalidLayout("config.pp", f"number of micro-batches ({m}) must be >= pp ({pp})")
    if vpp > 1:
        if pp == 1:
            raise InvalidLayout("config.vpp", "interleaving (vpp > 1) needs pp > 1")
        if m % pp:
            raise InvalidLayout("config.vpp", f"interleaved schedule needs micro-batches ({m}) divisible by pp ({pp})")


def _stage_split(layers: int, chunks: int, stage_layers: list[int] | tuple[int, ...] | None) -> list[int]:
    """Layers per chunk: the given ``stage_layers`` checked, or an even split."""
    if stage_layers is not None:
        split = list(stage_layers)
        if len(split) != chunks:
            raise InvalidLayout("config.stage_layers", f"needs pp*vpp = {chunks} entries, got {len(split)}")
        if min(split) < 0:
            raise InvalidLayout("config.stage_layers", "layer counts cannot be negative")
        if any(x < 1 for x in split[1:-1]):
            raise InvalidLayout(
                "config.stage_layers",
                "every chunk but the first (embedding) and the last (output layer and loss) needs at least one layer",
            )
        if sum(split) != layers:
            raise InvalidLayout("config.stage_layers", f"sums to {sum(split)}, model has {layers} layers")
    else:
        if chunks > layers:
            raise InvalidLayout(
                "config.vpp",
                f"pp*vpp ({chunks}) exceeds num_layers ({layers}); an embedding-only first chunk and a "
                "loss-only last chunk need an explicit stage_layers",
            )
        split = even_split(layers, chunks)
    return split
