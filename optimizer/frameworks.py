"""Training-framework profiles: which layouts each framework runs, its recompute modes under its
own names, and its stack (the ``training.*`` knobs it runs).

The facts live in ``optimizer/data/frameworks.toml``, each with its source; this module loads
them into frozen dataclasses and answers two questions for the planner: does a framework run
a layout as the cost model costs it (``layout_problem``), and does it run a job's stack
(``stack_problem``). Which frameworks run a job, each narrowed by its rules for the job, is
``optimizer/framework_targets.py``. It imports nothing from the request types, so ``specs``
may use it.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from optimizer.framework_conditions import When, condition_text, parse_when
from optimizer.inert_knobs import ANY_LAYOUT, LayoutFacts, inert_knobs
from optimizer.inert_knobs import MOE_KNOBS as MOE_KNOBS  # re-exported: the stack rules' knob groups
from optimizer.inert_knobs import PP_KNOBS as PP_KNOBS
from optimizer.inert_knobs import TP_KNOBS as TP_KNOBS
from optimizer.layer_split import even_split, is_uneven

FrameworkId = Literal["megatron-lm", "megatron-bridge", "torchtitan", "deepspeed"]
FRAMEWORK_IDS: tuple[str, ...] = ("megatron-lm", "megatron-bridge", "torchtitan", "deepspeed")
STACK_KNOBS: tuple[str, ...] = (
    "grad_reduce_in_fp32", "cross_entropy", "attention_kernel", "fused_kernels", "tp_comm_overlap", "tp_dgrad_overlap",
    "pp_comm_overlap", "dp_comm_overlap", "ep_comm_overlap", "expert_gemm_host_splits", "dp_collectives",
    "fp8_saved_inputs", "fsdp_buffers", "kv_expanded",
)  # fmt: skip
"""The ``TrainingSpec`` knobs a profile sets when the job leaves them out."""


@dataclass(frozen=True)
class Fact:
    value: Any
    source: str


@dataclass(frozen=True)
class RecomputeMode:
    name: str
    """The framework's own name (what plans and ``/evaluate`` use when the framework is named)."""
    costed_as: str
    """The cost model's mode."""
    moe_only: bool
    source: str


@dataclass(frozen=True)
class StackKnob:
    default: Any
    runs: tuple[Any, ...]
    source: str


@dataclass(frozen=True)
class Parallelism:
    zero_stages_without_pp: Fact
    zero_stages_with_pp: Fact
    cp: Fact
    ep: Fact
    vpp: Fact
    uneven_stage_layers: Fact
    sequence_parallel_optional: Fact
    ddp_only_without_other_parallelism: Fact
    sharded_below_zero3_needs_one_micro_batch: Fact
    zero_stages_always_overlapped: Fact
    """ZeRO stages whose data-parallel collectives it overlaps whatever it is told."""
    ep_multiple_of_tp_cp: Fact
    ep_divides_dp_cp: Fact
    """ep > 1 only when cp divides ep and ep divides dp x cp (EP borrows CP and data-parallel ranks)."""
    etp: Fact
    """Expert tensor-parallel sizes it runs: ``any`` (every size the layout rules allow),
    ``one_or_tp`` (1 or the dense tp), ``tp`` (experts split over the dense TP group), ``one``
    (experts whole)."""
    ep_layouts_pp_needs_vpp: Fact = Fact(False, "frameworks.toml: set only by a job's [[when]] rule")
    """Layouts with ep > 1 and pp > 1 only interleaved (set for a job by a ``when`` rule)."""
    p2p_overlap_needs_vpp: Fact = Fact(False, "frameworks.toml")
    """Pipeline sends overlap compute (``training.pp_comm_overlap``) only in interleaved schedules."""
    ep_layouts_zero_stages: Fact = Fact((0, 1, 2, 3), "frameworks.toml: narrowed only by a job's [[when]] rule")
    """ZeRO stages it runs on layouts with ep > 1 (narrowed by a ``when`` rule)."""
    pp_inside_dp: Fact = Fact("never", "frameworks.toml")
    """Rank orders with pipeline stages inside data parallelism it runs (``optimizer/rank_orders.py``)."""
    ep_group_sizes: Fact = Fact((), "frameworks.toml: set only by a job's [[when]] rule")
    """Expert groups (``ep x etp`` > 1 ranks) it runs; empty: any (set by a ``when`` rule)."""
    ep_layouts_excluded_recompute: Fact = Fact((), "frameworks.toml: set only by a job's [[when]] rule")
    """Cost-model recompute modes it does not run on layouts with ep > 1 (set by a ``when`` rule)."""
    tensor_parallel: Fact = Fact(True, "frameworks.toml: cleared only by a job's [[when]] rule")
    """Whether it runs tp > 1 (cleared for a job by a ``when`` rule)."""
    tp_divides_kv_heads: Fact = Fact(False, "frameworks.toml: the layout rules' head checks only")
    """tp divides ``num_kv_heads`` (the layout rules also allow key/value heads replicated over TP)."""
    fsdp_unit_scales_with_layers: Fact = Fact(True, "frameworks.toml")
    """Megatron-FSDP's communication unit (``fsdp_buffers`` megatron-fsdp) is at least twice the
    average layer (else a fixed 1e9 elements)."""
    dropout: Fact = Fact(True, "frameworks.toml")
    """Whether its models run dropout (``model.dropout`` above 0)."""
    deepep_gpu_generations: Fact = Fact("any", "frameworks.toml")
    """GPU generations it runs the DeepEP dispatcher on (``training.moe_dispatcher`` deepep):
    ``any``, or a list of catalog generations."""
    seq_len_multiple_of_tp_2cp: Fact = Fact(False, "frameworks.toml: the layout rules' seq_len checks only")
    """``seq_len`` a multiple of ``tp x 2 cp`` (beyond the layout rules' ``2 cp`` and, with sequence
    parallelism, ``tp`` dividing each context-parallel rank's tokens)."""


@dataclass(frozen=True)
class FrameworkProfile:
    id: str
    name: str
    version: str
    launch_field: str
    """The ``LaunchArgs`` field holding its arguments."""
    source: str
    parallelism: Parallelism
    recompute: tuple[RecomputeMode, ...]
    stack: dict[str, StackKnob] = field(compare=False)
    conditions: tuple[When, ...] = field(default=(), compare=False)
    """Rules for some jobs only (``framework_conditions``): applied by ``stack_problem`` and
    ``framework_targets.as_run_for``."""

    @functools.cached_property
    def _hash(self) -> int:
        return hash(
            (self.id, self.name, self.version, self.launch_field, self.source, self.parallelism, self.recompute)
        )

    def __hash__(self) -> int:
        """The compared fields' hash, computed once: the search keys caches on tuples of profiles
        (``framework_space._variants``), and hashing the nested facts each time was measurable."""
        return self._hash

    def costed_recompute(self, name: str) -> str | None:
        """The cost model's mode for the framework's recompute ``name`` (None: it has none)."""
        return next((m.costed_as for m in self.recompute if m.name == name), None)

    def own_recompute(self, costed_as: str) -> str | None:
        """The framework's name for the cost model's mode ``costed_as`` (None: it does not run it)."""
        return next((m.name for m in self.recompute if m.costed_as == costed_as), None)

    def costed_modes(self, is_moe: bool) -> tuple[str, ...]:
        return tuple(m.costed_as for m in self.recompute if is_moe or not m.moe_only)

    def zero_problem(self, pp: int, dp: int, tp: int, cp: int, ep: int, nmb: int, zero: int) -> str | None:
        """Why the framework does not run ZeRO stage ``zero`` on this layout as costed (None: it does)."""
        par = self.parallelism
        allowed = par.zero_stages_with_pp if pp > 1 else par.zero_stages_without_pp
        if zero not in allowed.value:
            stages = f"zero_stage {list(allowed.value)}" if allowed.value else "no zero_stage"
            return f"{self.name} runs {stages} with pp {'> 1' if pp > 1 else '= 1'} ({allowed.source})"
        if ep > 1 and zero not in par.ep_layouts_zero_stages.value:
            return f"{self.name} runs zero_stage {list(par.ep_layouts_zero_stages.value)} with ep > 1 ({par.ep_layouts_zero_stages.source})"
        if zero == 0 and par.ddp_only_without_other_parallelism.value and (cp > 1 or dp > 1 and max(tp, pp, ep) > 1):
            return f"{self.name} runs zero_stage 0 only with data parallelism alone ({par.ddp_only_without_other_parallelism.source})"
        if pp == 1 and zero in (1, 2) and nmb > 1 and par.sharded_below_zero3_needs_one_micro_batch.value:
            return (f"{self.name} runs zero_stage {zero} only with one micro-batch a step "
                    f"({par.sharded_below_zero3_needs_one_micro_batch.source})")  # fmt: skip
        return None

    def ep_recompute_problem(self, ep: int, recompute: str) -> str | None:
        """Why it does not run cost-model mode ``recompute`` on an expert-parallel layout (None: it does)."""
        fact = self.parallelism.ep_layouts_excluded_recompute
        if ep > 1 and recompute in fact.value:
            return f"{self.name} runs no recompute {recompute!r} on this job's expert-parallel layouts ({fact.source})"
        return None

    def takes_stage_counts(self, stage_layers: tuple[int, ...] | list[int]) -> bool:
        """Whether running ``stage_layers`` takes per-stage layer counts: a split other than the
        even one; for a framework without them (``uneven_stage_layers`` false) also an even split
        its balanced partition does not give (``partitions``)."""
        if self.parallelism.uneven_stage_layers.value:
            return is_uneven(stage_layers)
        return is_uneven(stage_layers) or not partitions(sum(stage_layers), len(stage_layers))

    def sizes_problem(self, tp: int, pp: int, cp: int, ep: int, vpp: int, uneven: bool, sp: bool) -> str | None:
        """Why the framework does not run these sizes (None: it does)."""
        par = self.parallelism
        if cp > 1 and not par.cp.value:
            return f"{self.name} has no context parallelism ({par.cp.source})"
        if ep > 1 and not par.ep.value:
            return f"{self.name} has no expert parallelism ({par.ep.source})"
        if ep > 1 and par.ep_multiple_of_tp_cp.value and ep % (tp * cp):
            return f"{self.name} needs ep a multiple of tp x cp = {tp * cp} ({par.ep_multiple_of_tp_cp.source})"
        if vpp > 1 and not par.vpp.value:
            return f"{self.name} has no interleaved pipeline schedule ({par.vpp.source})"
        if ep > 1 and pp > 1 and vpp == 1 and par.ep_layouts_pp_needs_vpp.value:
            return f"{self.name} runs this job's expert-parallel pipelines only interleaved ({par.ep_layouts_pp_needs_vpp.source})"
        if tp > 1 and not par.tensor_parallel.value:
            return f"{self.name} runs this job without tensor parallelism only ({par.tensor_parallel.source})"
        if uneven and not par.uneven_stage_layers.value:
            return (
                f"{self.name} runs equal stages only, or the first and last one layer lighter "
                f"({par.uneven_stage_layers.source})"
            )
        if tp > 1 and not sp and not par.sequence_parallel_optional.value:
            return f"{self.name} always runs sequence parallelism with TP ({par.sequence_parallel_optional.source})"
        return None

    def seq_problem(self, seq_len: int, tp: int, cp: int) -> str | None:
        """Why the framework does not split ``seq_len`` tokens over these sizes (None: it does)."""
        fact = self.parallelism.seq_len_multiple_of_tp_2cp
        if fact.value and seq_len % (tp * 2 * cp):
            return f"{self.name} needs seq_len ({seq_len}) a multiple of tp x 2 cp = {tp * 2 * cp} ({fact.source})"
        return None

    def heads_problem(self, kv_heads: int | None, tp: int) -> str | None:
        """Why the framework does not split ``kv_heads`` key/value heads (None: MLA) ``tp`` ways."""
        fact = self.parallelism.tp_divides_kv_heads
        if fact.value and kv_heads is not None and kv_heads % tp:
            return f"{self.name} needs tp ({tp}) to divide num_kv_heads ({kv_heads}) ({fact.source})"
        return None

    def split_problem(self, seq_len: int, kv_heads: int | None, tp: int, cp: int) -> str | None:
        """Why the framework does not split the job's sequence and heads over ``tp`` and ``cp``."""
        return self.seq_problem(seq_len, tp, cp) or self.heads_problem(kv_heads, tp)

    def etp_problem(self, tp: int, cp: int, dp: int, ep: int, etp: int) -> str | None:
        """Why the framework does not lay experts out this way: split ``etp`` ways, over ``ep``
        ranks (None: it does)."""
        par = self.parallelism
        if ep > 1 and par.ep_divides_dp_cp.value and (ep % cp or (dp * cp) % ep):
            return f"{self.name} needs cp ({cp}) to divide ep ({ep}) and ep to divide dp x cp ({dp * cp}) ({par.ep_divides_dp_cp.source})"
        group = par.ep_group_sizes
        if ep * etp > 1 and group.value and ep * etp not in group.value:
            return f"{self.name} runs expert groups (ep x etp) of {list(group.value)} ranks here ({group.source})"
        fact = par.etp
        if fact.value == "tp":
            return (
                None
                if etp == tp
                else f"{self.name} splits routed experts over tensor parallelism: etp = tp ({tp}) only ({fact.source})"
            )
        if etp == 1 or fact.value == "any":
            return None
        if fact.value == "one":
            return f"{self.name} keeps routed experts whole: etp 1 only ({fact.source})"
        if etp != tp:
            return f"{self.name} runs etp 1 or tp ({tp}) only ({fact.source})"
        if dp % ep or cp > 1:
            return f"{self.name} needs ep ({ep}) to divide dp ({dp}) with expert tensor parallelism ({fact.source})"
        return None

    def stack_problem(
        self, training: Any, model: Any, facts: LayoutFacts = ANY_LAYOUT, generation: str | None = None
    ) -> str | None:
        """The first ``training`` knob whose value the framework does not run (on GPUs of
        ``generation``, when known), or the first rule that excludes the job (None: it runs the
        job's stack); knobs that do nothing for this job on a layout of ``facts`` (``inert_knobs``:
        the TP knobs at tp 1, ZeRO-2/3's buffers below ZeRO-2, ...) are not checked, nor rules on
        such a knob (each rule's knobs act together)."""
        inert = inert_knobs(training, model, facts)
        if "moe_dispatcher" not in inert and (problem := dispatcher_gpu_problem(self, training, model, generation)):
            return problem
        if getattr(model, "dropout", 0.0) > 0 and not self.parallelism.dropout.value:
            return f"{self.name} runs no model.dropout: its models have none ({self.parallelism.dropout.source})"
        for rule in self.conditions:
            if rule.involves(inert):  # a rule on a knob that does nothing here
                continue
            if rule.excluded and rule.matches(training, model):
                return f"{self.name} does not run {condition_text(rule)}: {rule.excluded} ({rule.source})"
        for knob, spec in self.stack.items():
            value = getattr(training, knob)
            if knob in inert or value is None:  # does nothing here, or left to the framework
                continue
            if value not in spec.runs:
                return f"{self.name} runs training.{knob} {list(spec.runs)}, the job has {value!r} ({spec.source})"
        return None


def balanced_partitions(layers: int, pp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two splits of ``layers`` over ``pp`` stages with the smallest bottleneck: every stage but
    the last takes ``ceil(units / pp)`` units and the last the rest, with the transformer layers
    as the units, and with the embedding and output layers counted as a unit each at the two
    ends. Where ``even_split`` is one of them, it is what DeepSpeed's ``partition_balanced`` of
    equal weights gives (``partition_method='type:...'``), with the same units (a one-off comparison
    with that algorithm, outside the test suite, found no exception for 2 <= pp <= layers < 200;
    other splits it may place differently)."""
    c = -(-layers // pp)
    only = (c,) * (pp - 1) + (layers - (pp - 1) * c,)
    u = -(-(layers + 2) // pp)
    ends = (layers,) if pp == 1 else (u - 1,) + (u,) * (pp - 2) + (layers + 1 - (pp - 1) * u,)
    return only, ends


def partitions(layers: int, pp: int) -> bool:
    """Whether ``even_split`` of ``layers`` over ``pp`` stages is a ``balanced_partitions`` split."""
    return tuple(even_split(layers, pp)) in balanced_partitions(layers, pp)


def kv_heads_to_split(model: Any) -> int | None:
    """The key/value heads tensor parallelism splits (None for MLA models, which have none)."""
    return None if model.mla is not None else model.num_kv_heads


def layout_problem(
    profile: FrameworkProfile, lay: Any, is_moe: bool, seq_len: int | None = None, kv_heads: int | None = None
) -> str | None:
    """Why ``profile`` does not run ``lay`` (a resolved layout, cost-model recompute names) as
    costed for a job of ``seq_len`` tokens a sequence and ``kv_heads`` key/value heads (None: not
    checked); None when it does."""
    if lay.recompute not in profile.costed_modes(is_moe):
        return f"{profile.name} has no recompute costed as {lay.recompute!r}"
    uneven = profile.takes_stage_counts(lay.stage_layers)
    return (
        profile.ep_recompute_problem(lay.ep, lay.recompute)
        or profile.sizes_problem(lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, uneven, lay.sequence_parallel)
        or (profile.seq_problem(seq_len, lay.tp, lay.cp) if seq_len is not None else None)
        or profile.heads_problem(kv_heads, lay.tp)
        or (profile.etp_problem(lay.tp, lay.cp, lay.dp, lay.ep, getattr(lay, "etp", 1)) if is_moe else None)
        or profile.zero_problem(lay.pp, lay.dp, lay.tp, lay.cp, lay.ep, lay.num_micro_batches, lay.zero_stage)
    )


def dispatcher_gpu_problem(prof: FrameworkProfile, training: Any, model: Any, generation: str | None) -> str | None:
    """Why ``prof`` does not run the job's token dispatcher on GPUs of ``generation`` (None: it
    does, or the generation is not known)."""
    fact = prof.parallelism.deepep_gpu_generations
    if generation is None or fact.value == "any" or not model.is_moe:
        return None
    if getattr(training, "moe_dispatcher", None) != "deepep" or generation in fact.value:
        return None
    return f"{prof.name} runs moe_dispatcher 'deepep' on {' and '.join(fact.value)} GPUs only ({fact.source})"


def _fact(raw: dict, key: str) -> Fact:
    item = raw[key]
    return Fact(tuple(item["value"]) if isinstance(item["value"], list) else item["value"], item["source"])


def _profile(fid: str, raw: dict) -> FrameworkProfile:
    par = raw["parallelism"]
    parallelism = Parallelism(**{name: _fact(par, name) for name in Parallelism.__dataclass_fields__ if name in par})
    modes = tuple(
        RecomputeMode(name, m["costed_as"], bool(m.get("moe_only", False)), m["source"])
        for name, m in raw["recompute"].items()
    )
    stack = {k: StackKnob(raw["stack"][k]["default"], tuple(raw["stack"][k]["runs"]), raw["stack"][k]["source"])
             for k in STACK_KNOBS}  # fmt: skip
    for knob in stack.values():
        if knob.default not in knob.runs:
            raise ValueError(f"frameworks.toml {fid}: default {knob.default!r} not among runs {knob.runs}")
    conditions = tuple(parse_when(fid, rule) for rule in raw.get("when", ()))
    return FrameworkProfile(
        fid, raw["name"], raw["version"], raw["launch_field"], raw["source"], parallelism, modes, stack, conditions
    )


@functools.cache
def load_profiles() -> dict[str, FrameworkProfile]:
    """Every profile of ``optimizer/data/frameworks.toml``, by id (checked at load)."""
    text = resources.files("optimizer").joinpath("data/frameworks.toml").read_text(encoding="utf-8")
    doc = tomllib.loads(text)
    if tuple(doc) != FRAMEWORK_IDS:
        raise ValueError(f"frameworks.toml must list {FRAMEWORK_IDS}, has {tuple(doc)}")
    return {fid: _profile(fid, raw) for fid, raw in doc.items()}


def profile(fid: str) -> FrameworkProfile:
    return load_profiles()[fid]


def stack_defaults(fid: str) -> dict[str, Any]:
    """The ``training.*`` values the framework runs when the job leaves them out."""
    return {k: knob.default for k, knob in profile(fid).stack.items()}


def costed_config(training: Any, config: Any) -> Any:
    """``config`` (a ``Layout``) with its recompute in the cost model's names: the named
    framework's own name mapped to its mode (``config`` itself with no framework named)."""
    named = getattr(training, "framework", None)
    if named is None:
        return config
    return config.model_copy(update={"recompute": profile(named).costed_recompute(config.recompute)})


__all__ = ["FRAMEWORK_IDS", "Fact", "FrameworkId", "FrameworkProfile", "costed_config", "layout_problem", "load_profiles",
           "profile", "stack_defaults"]  # fmt: skip
