"""The regular layout space of a job: every valid combination of the layout knobs.

Values are any divisors (not just powers of two) that satisfy the model's divisibility rules;
``search.fix`` pins a field and ``search.allow`` restricts it. Each yielded layout passes
``optimizer.cost.rules.resolve_layout`` (the same rules ``/evaluate`` applies).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields as dataclass_fields
from itertools import product
from typing import NamedTuple

from optimizer.cost.rules import ResolvedLayout, divisors, resolve
from optimizer.errors import InvalidLayout
from optimizer.specs import JobSpec, SearchSpec

MAX_TP = 64
MAX_CP = 64
MIN_CP_CHUNK = 512
"""Context parallelism splits each sequence into ``2*cp`` chunks; below this many tokens per chunk
the ring exchange cannot hide behind attention, so such ``cp`` values are not searched
(``/evaluate`` still scores them)."""
MAX_VPP = 8
MAX_MICRO_BATCH = 16
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "moe", "full")
"""``moe`` only for MoE models (on a dense model it is ``selective``). ``op`` (torchtitan's
op-level policy) only when ``search.allow`` or ``search.fix`` names it: no other stack runs it."""


def astuple_shallow(lay: ResolvedLayout) -> tuple:
    """The layout's fields in declaration order (no deep copy, unlike ``dataclasses.astuple``)."""
    return tuple(getattr(lay, f.name) for f in dataclass_fields(lay))


def _variant(base: dict, zero_stage: int, recompute: str) -> ResolvedLayout:
    """``base`` (a resolved layout's ``__dict__``) with another ZeRO stage and recompute.

    Neither changes validity or any derived number, so the fields are copied as they are rather
    than passed through the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per
    field), which was most of the time spent enumerating the larger spaces.
    """
    lay = object.__new__(ResolvedLayout)
    fields = lay.__dict__
    fields.update(base)
    fields["zero_stage"] = zero_stage
    fields["recompute"] = recompute
    return lay


def _choices(name: str, default: list, search: SearchSpec) -> list:
    fixed = getattr(search.fix, name)
    allowed = getattr(search.allow, name)
    values = default
    if allowed is not None:
        values = [v for v in values if v in set(allowed)]
    if fixed is not None:
        values = [v for v in values if v == fixed]
    return values


class LayoutFamily(NamedTuple):
    """Layouts that differ only in their interleaving depth: ``first`` (resolved, the smallest
    admitted ``vpp``) and the other admitted ``vpp`` values, ascending, resolved on demand
    (``expand``). The search bounds the deeper members from ``first``'s bound terms
    (``lower_bounds.bound_at_vpp``) and resolves them only if the bound-ordered costing reaches them.
    A named tuple: the planner builds one per regular layout up to ``vpp``."""

    first: ResolvedLayout
    more_vpps: tuple[int, ...]
    skipped_vpps: tuple[int, ...] = ()
    """Depths left out by default (uneven chunks of a model whose layer kinds alternate, none
    named, more than ``UNEVEN_DEPTHS_DEFAULT_MAX`` such layouts in all): never resolved or costed;
    the search bounds them only to say whether one might be faster."""

    def expand(self, job: JobSpec) -> list[ResolvedLayout]:
        """The family's other layouts (those ``resolve`` accepts), in ``more_vpps`` order."""
        out = []
        lay = self.first
        for vpp in self.more_vpps:
            try:
                out.append(resolve(
                    job, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, vpp=vpp, micro_batch_size=lay.micro_batch_size,
                    zero_stage=lay.zero_stage, recompute=lay.recompute, sequence_parallel=lay.sequence_parallel,
                ))  # fmt: skip
            except InvalidLayout:
                continue
        return out


class LayoutBlock(NamedTuple):
    """The families that differ only in ZeRO stage and recompute: ``base`` (a resolved layout at
    the block's smallest admitted ``vpp``) in every ``(zero_stage, recompute)`` of ``variants``
    (``product(zero stages, recompute modes)``, the same for every block of a job), sharing the
    deeper and the left-out depths. Neither knob changes validity or any derived number, so the
    planner bounds a whole block as arrays (``bounds.space_bounds``) and builds a family's
    layout only when the bound-ordered costing reaches it."""

    base: ResolvedLayout
    variants: tuple[tuple[int, str], ...]
    more_vpps: tuple[int, ...]
    skipped_vpps: tuple[int, ...] = ()

    def family(self, index: int) -> LayoutFamily:
        """The ``index``-th family of the block (in ``variants`` order)."""
        zero, rc = self.variants[index]
        return LayoutFamily(_variant(self.base.__dict__, zero, rc), self.more_vpps, self.skipped_vpps)

    def families(self) -> Iterator[LayoutFamily]:
        for i in range(len(self.variants)):
            yield self.family(i)


def enumerate_layouts(job: JobSpec, search: SearchSpec) -> Iterator[ResolvedLayout]:
    """Every valid layout (uniform layer split) that ``search.fix`` / ``search.allow`` admit."""
    for family in layout_families(job, search):
        yield family.first
        yield from family.expand(job)


def count_layouts(blocks: list[LayoutBlock]) -> int:
    """How many layouts ``blocks`` hold (what ``enumerate_layouts`` would yield, up to layouts
    whose deeper interleaving ``resolve`` rejects)."""
    return sum(len(b.variants) * (1 + len(b.more_vpps)) for b in blocks)


UNEVEN_DEPTHS_DEFAULT_MAX = 40_000
"""Models whose dense and MoE layers alternate (an MoE layer frequency above 1): uneven
interleaving depths are in the default space when they add at most this many layouts. A chunk's
mix of layer kinds then depends on where it starts, and their chunk-level split models are the
slowest the planner builds: a Mixtral-8x22B variant with MoE on every second layer on 256 H100
adds 47,280 (about 5 s without them, about 8 s with, a 0.5% better plan); Llama 4 Maverick on
256 H100 adds 32,100 with 4K sequences and a 512-sequence batch (about 0.8 s either way), 43,740
with 8K sequences. Models whose MoE layers only follow a few dense ones (DeepSeek-V3) always
have every depth: on 48 DeepSeek-V3-like jobs (``benchmarks/depth_sweep.py``) every depth cost
at most 3.0 s and gave a faster plan on 23 of the 46 with a plan, by up to 7.5% (19% on 9,216
GB200). The count is of the whole space, so narrowing other fields (``search.allow.tp``, say)
can bring the uneven depths in and find a plan the wider default request does not; that default
answer then carries the warning and the bound."""


def layout_families(job: JobSpec, search: SearchSpec) -> Iterator[LayoutFamily]:
    """``enumerate_layouts`` grouped by everything but ``vpp``, deeper interleaving unresolved:
    the families of ``layout_blocks``, in order."""
    for block in layout_blocks(job, search):
        yield from block.families()


def layout_blocks(job: JobSpec, search: SearchSpec) -> Iterator[LayoutBlock]:
    """``layout_families`` grouped by everything but ZeRO stage and recompute.

    Interleaving (``vpp > 1``) needs ``pp > 1``, micro-batches divisible by ``pp`` and at least
    one layer per chunk (``pp * vpp <= num_layers``). Chunks may hold unequal layer counts
    (Megatron's ``--pipeline-model-parallel-layout``, torchtitan's module lists). For models whose
    dense and MoE layers alternate such uneven depths are searched by default only when they add
    at most ``UNEVEN_DEPTHS_DEFAULT_MAX`` layouts, and otherwise only when ``search.allow.vpp`` or
    ``search.fix.vpp`` names them (their chunk-level layer-split models are the slowest the
    planner builds). Each block then lists the depths it leaves out (``skipped_vpps``) so that the
    search can say when one of them might be faster."""
    blocks = blocks_with_uneven_depths_apart(job, search)
    if not _leaves_uneven_depths_out(job, search):
        yield from blocks
        return
    blocks = list(blocks)
    if sum(len(b.variants) * len(b.skipped_vpps) for b in blocks) > UNEVEN_DEPTHS_DEFAULT_MAX:
        yield from blocks
        return
    for block in blocks:
        if block.skipped_vpps:
            deeper = tuple(sorted({*block.more_vpps, *block.skipped_vpps} - {block.base.vpp}))
            yield LayoutBlock(block.base, block.variants, deeper)
        else:
            yield block


def _zero_choices(search: SearchSpec) -> list[int]:
    zeros = _choices("zero_stage", list(ZERO_STAGES), search)
    if 1 in zeros and 2 in zeros:
        # ZeRO-2 (gradients sharded too) has ZeRO-1's communication and step time and never more
        # memory, so ZeRO-1 is dominated; ask for it with search.fix / search.allow.
        zeros.remove(1)
    return zeros


def _recompute_choices(job: JobSpec, search: SearchSpec) -> list[str]:
    named = set(search.allow.recompute or ()) | {search.fix.recompute}
    return _choices(
        "recompute",
        [r for r in RECOMPUTE if r != "moe" or job.model.moe is not None] + (["op"] if "op" in named else []),
        search,
    )


def empty_choice(job: JobSpec, search: SearchSpec) -> str | None:
    """The knob that ``search.fix`` / ``search.allow`` leave without a value the space searches
    (ZeRO stage or recompute mode), if any: then no layout is enumerated whatever the sizes."""
    if not _zero_choices(search):
        return "zero_stage"
    if not _recompute_choices(job, search):
        return "recompute"
    return None


def _leaves_uneven_depths_out(job: JobSpec, search: SearchSpec) -> bool:
    """Whether ``blocks_with_uneven_depths_apart`` lists the uneven depths apart: a model whose
    layer kinds alternate, with no depth named."""
    return job.model.alternates_layer_kinds and search.allow.vpp is None and search.fix.vpp is None


def blocks_with_uneven_depths_apart(job: JobSpec, search: SearchSpec) -> Iterator[LayoutBlock]:
    """``layout_blocks`` with every uneven depth of a model whose layer kinds alternate left out
    (and listed) unless depths are named."""
    model = job.model
    n = job.cluster.num_gpus
    gbs = job.training.global_batch_size or 0
    seq = job.training.seq_len
    layers = model.num_layers or 0
    heads = model.num_attention_heads or 0
    div_n = divisors(n)
    tps = _choices("tp", [d for d in div_n if d <= MAX_TP and heads % d == 0], search)
    pps = _choices("pp", [d for d in div_n if d <= layers], search)
    cps = _choices(
        "cp",
        [d for d in div_n if d <= MAX_CP and (d == 1 or (seq % (2 * d) == 0 and seq // (2 * d) >= MIN_CP_CHUNK))],
        search,
    )
    experts = model.moe.num_experts if model.moe else 1
    zeros, rcs = _zero_choices(search), _recompute_choices(job, search)
    named_vpps = set(search.allow.vpp or ()) | {search.fix.vpp}
    uneven = not model.alternates_layer_kinds  # uneven interleaving searched by default
    leave_out = _leaves_uneven_depths_out(job, search)
    variants = tuple(product(zeros, rcs))
    if not variants:
        return
    for tp, pp, cp in product(tps, pps, cps):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        if search.fix.dp is not None and dp != search.fix.dp:
            continue
        if search.allow.dp is not None and dp not in search.allow.dp:
            continue
        eps = _choices("ep", [d for d in divisors(tp * dp * cp) if experts % d == 0] if model.moe else [1], search)
        if gbs % dp:
            continue
        mbs_all = [d for d in divisors(gbs // dp) if d <= MAX_MICRO_BATCH]
        for mbs in _choices("micro_batch_size", mbs_all, search):
            m = gbs // (dp * mbs)
            if pp > 1 and m < pp:
                continue
            vpps, skipped = [1], ()
            if pp > 1 and m % pp == 0:
                deeper = [v for v in range(2, MAX_VPP + 1) if pp * v <= layers]
                vpps += [v for v in deeper if uneven or layers % (pp * v) == 0 or v in named_vpps]
                if leave_out:
                    skipped = tuple(v for v in deeper if layers % (pp * v))
            vpps = _choices("vpp", vpps, search)
            for ep, sp in product(eps, _choices("sequence_parallel", [tp > 1], search)):
                for i, vpp in enumerate(vpps):  # the first vpp the rules accept heads the family
                    try:
                        base = resolve(
                            job, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, micro_batch_size=mbs,
                            zero_stage=zeros[0], recompute=rcs[0],
                            sequence_parallel=sp,
                        )  # fmt: skip
                    except InvalidLayout as err:
                        if err.field == "config.vpp":
                            continue
                        break  # invalid whatever the depth
                    # ZeRO stage and recompute never change validity: vary them on the resolved layout
                    yield LayoutBlock(base, variants, tuple(vpps[i + 1 :]), skipped)
                    break
