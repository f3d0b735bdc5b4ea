"""The regular layout space of a job: every valid combination of the layout knobs. Values are any
divisors (not just powers of two) that satisfy the model's divisibility rules; ``search.fix`` pins
a field and ``search.allow`` restricts it. Each yielded layout passes
``optimizer.cost.rules.resolve_layout`` (the same rules ``/evaluate`` applies)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from enum import Enum
from itertools import product
from typing import NamedTuple

from optimizer.cost.rules import ResolvedLayout, divisors, resolve, sequence_parallel_reason, with_knobs
from optimizer.errors import InvalidLayout, PlannerError
from optimizer.frameworks import partitions
from optimizer.modes import RecomputeMode
from optimizer.search import framework_space
from optimizer.search.framework_space import Targets, block_variants, costed_recompute_choices, space_frameworks
from optimizer.specs import JobSpec, SearchSpec
from optimizer.specs.layout import MAX_MICRO_BATCH_SIZE

MAX_TP = 64
MAX_CP = 64
MIN_CP_CHUNK = 512
MAX_VPP = 8
MAX_MICRO_BATCH = 16
"""The default space's bounds on ``vpp`` and ``micro_batch_size``: search priorities, not rules.
Layouts beyond them form their own blocks (``LayoutBlock.beyond``), searched in bound order like
the rest (``Reach.ALL``); a value ``search.fix`` / ``search.allow`` names is in the default space
whatever its size."""
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = tuple(RecomputeMode)
"""The cost model's recompute modes in search order. The space holds those the target frameworks
run (``framework_space``; ``moe`` only for MoE models), plus, with no framework named, any mode
``search.fix`` / ``search.allow`` names."""


class Reach(Enum):
    """Which layouts ``layout_blocks`` yields: ``DEFAULT``, those within the default space's
    bounds (``MAX_VPP``, ``MAX_MICRO_BATCH``, and named values beyond them); ``ALL``, those and
    the layouts beyond the bounds, in blocks of their own (``LayoutBlock.beyond``)."""

    DEFAULT = "default"
    ALL = "all"


def cp_chunk_too_short(seq_len: int, cp: int) -> bool:
    """``cp`` splits a sequence into ``2*cp`` chunks under ``MIN_CP_CHUNK`` tokens, too short to hide
    the ring exchange behind attention: not searched by default (a request may name it)."""
    return cp > 1 and seq_len // (2 * cp) < MIN_CP_CHUNK


def _named(name: str, search: SearchSpec) -> bool:
    """Whether ``search.fix`` or ``search.allow`` names values of ``name``."""
    return getattr(search.fix, name) is not None or getattr(search.allow, name) is not None


def _choices(name: str, default: list, search: SearchSpec, rule: list | None = None) -> list:
    """The values of ``name`` to search: ``default`` (the default space's), or, when ``search.fix``
    / ``search.allow`` name values, those of ``rule`` (every value the layout rules allow;
    ``default`` when not given) they name."""
    fixed = getattr(search.fix, name)
    allowed = getattr(search.allow, name)
    values = rule if rule is not None and (fixed is not None or allowed is not None) else default
    if allowed is not None:
        admitted = set(allowed)
        values = [v for v in values if v in admitted]
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
                out.append(lay.at_depth(job, vpp))
            except InvalidLayout:
                continue
        return out


class LayoutBlock(NamedTuple):
    """The families that differ only in ZeRO stage and recompute: ``base`` (a resolved layout at
    the block's smallest admitted ``vpp``) in every ``(zero_stage, recompute)`` of ``variants``
    (those of ``product(zero stages, recompute modes)`` a target framework runs on the block's
    sizes: ``framework_space.block_variants``), sharing the
    deeper and the left-out depths. Neither knob changes validity or any derived number, so the
    planner bounds a whole block as arrays (``bounds.space_bounds``) and builds a family's
    layout only when the bound-ordered costing reaches it."""

    base: ResolvedLayout
    variants: tuple[tuple[int, str], ...]
    more_vpps: tuple[int, ...]
    skipped_vpps: tuple[int, ...] = ()
    beyond: bool = False
    """Its layouts lie beyond the default space's bounds (``vpp > MAX_VPP`` or
    ``micro_batch_size > MAX_MICRO_BATCH``, values ``search`` did not name); ``Reach.ALL`` only."""

    def family(self, index: int) -> LayoutFamily:
        """The ``index``-th family of the block (in ``variants`` order)."""
        zero, rc = self.variants[index]
        return LayoutFamily(with_knobs(self.base.__dict__, zero, rc), self.more_vpps, self.skipped_vpps)

    def families(self) -> Iterator[LayoutFamily]:
        for i in range(len(self.variants)):
            yield self.family(i)


def enumerate_layouts(job: JobSpec, search: SearchSpec, reach: Reach = Reach.DEFAULT) -> Iterator[ResolvedLayout]:
    """Every valid layout (uniform layer split) that ``search.fix`` / ``search.allow`` admit
    (``reach``: within the default space's bounds, or all of them, as the planner searches)."""
    for family in layout_families(job, search, reach):
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
and a 1,024-sequence batch adds 28,352 (42,528 with all six recompute modes named); Llama 4
Maverick on 256 H100 with a 512-sequence batch adds 21,400 with 4K sequences and 29,160 with 8K
(``tests/search/test_uneven_interleaving.py`` holds the counts). Models whose MoE layers only
follow a few dense ones (DeepSeek-V3) always have every depth: on 48 DeepSeek-V3-like jobs
(docs/depth_sweep.md) every depth cost at most 5.6 s and gave a faster plan on 36 of the 46 with
a plan, by up to 31.5% (576 GB200). The count is of the whole space, so narrowing other fields (``search.allow.tp``, say)
can bring the uneven depths in and find a plan the wider default request does not; that default
answer then carries the warning and the bound."""


def layout_families(job: JobSpec, search: SearchSpec, reach: Reach = Reach.DEFAULT) -> Iterator[LayoutFamily]:
    """``enumerate_layouts`` grouped by everything but ``vpp``, deeper interleaving unresolved:
    the families of ``layout_blocks``, in order."""
    for block in layout_blocks(job, search, reach):
        yield from block.families()


BLOCK_BYTES = 1_000
"""Memory one ``LayoutBlock`` takes through the search (its resolved layout, its entries in the
bound arrays and queues), per block and ..."""
LAYOUT_BYTES = 120
"""... per layout it holds: measured as the RSS growth of whole searches over spaces of 0.26 to
4.5 million layouts, rounded up (``SpaceBudget``)."""
CHECK_EVERY = 64
"""Blocks enumerated between two looks at the clock."""


class SpaceBudget(NamedTuple):
    """What enumerating one job's space may take: until ``deadline`` (``time.perf_counter()``),
    and at most ``max_bytes`` of memory (estimated per block and per layout)."""

    deadline: float
    max_bytes: float


class SpaceTooLarge(PlannerError):
    """The layout space would take more memory than the search's budget (a 422)."""


class SpaceTimedOut(Exception):
    """The deadline passed while enumerating; ``layouts`` were enumerated by then."""

    def __init__(self, layouts: int) -> None:
        super().__init__(f"{layouts} layouts enumerated")
        self.layouts = layouts


def _within(blocks: Iterable[LayoutBlock], budget: SpaceBudget) -> Iterator[LayoutBlock]:
    """``blocks`` until the budget's deadline (``SpaceTimedOut``) or memory (``SpaceTooLarge``)."""
    used = layouts = 0
    for n, block in enumerate(blocks):
        size = len(block.variants) * (1 + len(block.more_vpps))
        layouts += size
        used += BLOCK_BYTES + LAYOUT_BYTES * size
        if used > budget.max_bytes:
            raise SpaceTooLarge(
                f"search space too large: more than {layouts:,} layouts, over the per-request memory budget "
                f"of {budget.max_bytes / 2**20:,.0f} MiB; narrow search.allow or search.fix"
            )
        if n % CHECK_EVERY == 0 and time.perf_counter() > budget.deadline:
            raise SpaceTimedOut(layouts)
        yield block


def layout_blocks(
    job: JobSpec, search: SearchSpec, reach: Reach = Reach.DEFAULT, budget: SpaceBudget | None = None
) -> Iterator[LayoutBlock]:
    """``layout_families`` grouped by everything but ZeRO stage and recompute.

    Interleaving (``vpp > 1``) needs ``pp > 1``, micro-batches divisible by ``pp`` and at least
    one layer per chunk (``pp * vpp <= num_layers``). Chunks may hold unequal layer counts
    (Megatron's ``--pipeline-model-parallel-layout``, torchtitan's module lists). For models whose
    dense and MoE layers alternate such uneven depths are searched by default only when they add
    at most ``UNEVEN_DEPTHS_DEFAULT_MAX`` layouts, and otherwise only when ``search.allow.vpp`` or
    ``search.fix.vpp`` names them (their chunk-level layer-split models are the slowest the
    planner builds). Each block then lists the depths it leaves out (``skipped_vpps``) so that the
    search can say when one of them might be faster. ``Reach.ALL`` adds the layouts beyond the
    default space's bounds, in blocks of their own (``LayoutBlock.beyond``). With a ``budget``,
    enumeration stops with ``SpaceTimedOut`` or ``SpaceTooLarge`` when it runs out."""
    blocks = blocks_with_uneven_depths_apart(job, search, reach)
    if budget is not None:
        blocks = _within(blocks, budget)
    if not _leaves_uneven_depths_out(job, search):
        yield from blocks
        return
    listed = list(blocks)
    # counted over whole experts (etp 1) only: expert tensor parallelism, which doubles an MoE
    # space, does not push the uneven depths of the etp = 1 layouts out
    if sum(len(b.variants) * len(b.skipped_vpps) for b in listed if b.base.etp == 1) > UNEVEN_DEPTHS_DEFAULT_MAX:
        yield from listed
        return
    for block in listed:
        if block.skipped_vpps:
            deeper = tuple(sorted({*block.more_vpps, *block.skipped_vpps} - {block.base.vpp}))
            yield LayoutBlock(block.base, block.variants, deeper)
        else:
            yield block


def zero_choices(search: SearchSpec) -> list[int]:
    """The ZeRO stages ``search.fix`` / ``search.allow`` admit. Per block of one micro-batch
    without Megatron-FSDP's buffers, ZeRO-1 is dropped where ZeRO-2 is in
    (``framework_space.block_variants``): there ZeRO-2 has ZeRO-1's step time and never more
    memory; plans report the lowest stage that runs at the same step time (``simplify``)."""
    return _choices("zero_stage", list(ZERO_STAGES), search)


def recompute_choices(job: JobSpec, search: SearchSpec) -> list[str]:
    """Cost-model recompute modes to search: those the target frameworks run (with a framework
    named, ``search.fix`` / ``search.allow`` use its names), plus, with none named, any mode they
    name."""
    return costed_recompute_choices(job, search, RECOMPUTE)


def empty_choice(job: JobSpec, search: SearchSpec) -> str | None:
    """The knob that ``search.fix`` / ``search.allow`` leave without a value the space searches
    (ZeRO stage or recompute mode), if any: then no layout is enumerated whatever the sizes."""
    if not zero_choices(search):
        return "zero_stage"
    if not recompute_choices(job, search):
        return "recompute"
    return None


def _leaves_uneven_depths_out(job: JobSpec, search: SearchSpec) -> bool:
    """Whether ``blocks_with_uneven_depths_apart`` lists the uneven depths apart: a model whose
    layer kinds alternate, with no depth named."""
    return job.model.alternates_layer_kinds and search.allow.vpp is None and search.fix.vpp is None


def blocks_with_uneven_depths_apart(
    job: JobSpec, search: SearchSpec, reach: Reach = Reach.DEFAULT
) -> Iterator[LayoutBlock]:
    """``layout_blocks`` with every uneven depth of a model whose layer kinds alternate left out
    (and listed) unless depths are named."""
    model = job.model
    n = job.cluster.resolved_num_gpus
    gbs = job.training.global_batch_size or 0
    seq = job.training.seq_len
    layers = model.num_layers or 0
    heads = model.num_attention_heads or 0
    div_n = divisors(n)
    tp_rule = [d for d in div_n if heads % d == 0]
    tps = _choices("tp", [d for d in tp_rule if d <= MAX_TP], search, tp_rule)
    targets = space_frameworks(job, search)
    even_only = not targets.take_stage_counts  # then only depths whose even split their partition gives
    pps = _choices("pp", [d for d in div_n if d <= layers and (not even_only or partitions(layers, d))], search)
    cp_rule = [d for d in div_n if d == 1 or seq % (2 * d) == 0]
    cps = _choices("cp", [d for d in cp_rule if d <= MAX_CP and not cp_chunk_too_short(seq, d)], search, cp_rule)
    experts = model.moe.num_experts if model.moe else 1
    zeros, rcs = zero_choices(search), recompute_choices(job, search)
    named_vpps = set(search.allow.vpp or ()) | {search.fix.vpp}
    vpp_named, mbs_named = _named("vpp", search), _named("micro_batch_size", search)
    vpp_unbounded = vpp_named or reach is Reach.ALL
    uneven = not (model.alternates_layer_kinds or even_only)  # uneven interleaving searched by default
    leave_out = _leaves_uneven_depths_out(job, search)
    if not zeros or not rcs:
        return
    interleaves = any(p.parallelism.vpp.value for p in targets.profiles)
    needs_vpp = all(p.parallelism.ep_layouts_pp_needs_vpp.value for p in targets.profiles)  # ep > 1: interleaved
    etp_memo: dict[tuple[int, int, int, int], list[tuple[int, Targets]]] = {}
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
        mbs_rule = [d for d in divisors(gbs // dp) if d <= MAX_MICRO_BATCH_SIZE]
        mbs_choices = _choices("micro_batch_size", mbs_rule if reach is Reach.ALL else [
            d for d in mbs_rule if d <= MAX_MICRO_BATCH
        ], search, mbs_rule)  # fmt: skip
        for mbs in mbs_choices:
            m = gbs // (dp * mbs)
            if pp > 1 and m < pp:
                continue
            vpps, skipped = [1], tuple[int, ...]()
            if pp > 1 and m % pp == 0 and interleaves:
                deeper = [v for v in range(2, layers // pp + 1) if v <= MAX_VPP or vpp_unbounded]
                vpps += [v for v in deeper if uneven or layers % (pp * v) == 0 or v in named_vpps]
                if leave_out:
                    skipped = tuple(v for v in deeper if layers % (pp * v) and v <= MAX_VPP)
            vpps = _choices("vpp", vpps, search)
            mbs_beyond = mbs > MAX_MICRO_BATCH and not mbs_named
            parts = [(vpps, (), True)] if mbs_beyond else [(vpps, skipped, False)]
            if not mbs_beyond and not vpp_named:  # the depths beyond MAX_VPP: a block of their own
                parts = [
                    ([v for v in vpps if v <= MAX_VPP], skipped, False),
                    ([v for v in vpps if v > MAX_VPP], (), True),
                ]
            sp_rule = [sp for sp in (False, True) if sequence_parallel_reason(job, tp, sp) is None]
            sps = _choices("sequence_parallel", [tp > 1], search, sp_rule)
            for ep, sp in product(eps, sps):
                if (tp, dp, cp, ep) not in etp_memo:  # the same for every micro-batch size
                    etp_memo[tp, dp, cp, ep] = _etp_choices(job, search, targets, tp=tp, dp=dp, cp=cp, ep=ep)
                for etp, runs in etp_memo[tp, dp, cp, ep]:
                    variants = block_variants(runs, zeros, rcs, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, nmb=m, sp=sp)
                    if not variants:
                        continue
                    for part_vpps, part_skipped, beyond in parts:
                        depths = [v for v in part_vpps if v > 1] if pp > 1 and ep > 1 and needs_vpp else part_vpps
                        block = _block(job, variants, (tp, pp, cp, ep, mbs, sp, etp), depths, part_skipped, beyond)
                        if block is not None:
                            yield block


def _etp_choices(
    job: JobSpec, search: SearchSpec, targets: Targets, *, tp: int, dp: int, cp: int, ep: int
) -> list[tuple[int, Targets]]:
    """The expert tensor-parallel sizes to search with these sizes, each with the target frameworks
    that run it and split ``seq_len`` so: by default 1 and, for an MoE model with ``tp > 1``,
    ``tp``; when ``search.fix`` / ``search.allow`` name values, any the layout rules allow."""
    targets = framework_space.split_targets(targets, job, tp, cp)
    moe = job.model.moe
    if moe is None:
        return [(1, targets)] if _choices("etp", [1], search) else []
    rule = [d for d in divisors(tp * dp * cp // ep) if moe.expert_ffn_hidden_size % d == 0]
    default = [1] + ([tp] if tp > 1 and tp in rule else [])
    out = []
    for etp in _choices("etp", default, search, rule):
        runs = tuple(p for p in targets.profiles if p.etp_problem(tp, cp, dp, ep, etp) is None)
        if runs:
            out.append((etp, targets if etp == 1 else targets._replace(profiles=runs)))
    return out


def _block(
    job: JobSpec,
    variants: tuple[tuple[int, str], ...],
    sizes: tuple[int, int, int, int, int, bool, int],
    vpps: list[int],
    skipped: tuple[int, ...],
    beyond: bool,
) -> LayoutBlock | None:
    """The block of ``sizes`` (tp, pp, cp, ep, micro-batch, sequence parallel, etp) at the depths
    ``vpps``, headed by the first the rules accept; None when they accept none."""
    tp, pp, cp, ep, mbs, sp, etp = sizes
    zero, rc = variants[0]
    for i, vpp in enumerate(vpps):
        try:
            base = resolve(
                job, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, micro_batch_size=mbs, zero_stage=zero, recompute=rc,
                sequence_parallel=sp, etp=etp,
            )  # fmt: skip
        except InvalidLayout as err:
            if err.field == "config.vpp":
                continue
            return None  # invalid whatever the depth
        # ZeRO stage and recompute never change validity: vary them on the resolved layout
        return LayoutBlock(base, variants, tuple(vpps[i + 1 :]), skipped, beyond)
    return None
