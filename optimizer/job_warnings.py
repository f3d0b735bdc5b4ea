"""Warnings for jobs that look wrong: a global batch that looks like tokens, GPUs that are not
whole nodes, a batch too small for the GPU count, fewer micro-batches than the top plan's
pipeline wants, a predicted MFU above the best published for that GPU and precision (for an MoE
model: for its shape).

The reference numbers (largest published batch, best published MFU) are data with sources:
``optimizer/data/job_checks.toml``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from optimizer.inert_knobs import MOE_KNOBS
from optimizer.model_mfu import best_for_model
from optimizer.reference import current
from optimizer.results import Plan
from optimizer.specs import JobSpec

DATA_PATH = Path(__file__).resolve().parent / "data" / "job_checks.toml"
MICRO_BATCHES_PER_STAGE = 2
"""A pipelined top plan with fewer micro-batches than this many per stage gets a warning."""

MFU_OPENING = "predicted MFU"
"""How the warning of an MFU above the best published opens: then the MFU in percent."""
_MFU_WARNING = re.compile(rf"^{MFU_OPENING} (\d+(?:\.\d+)?)% ")


def split_mfu_warning(warning: str) -> tuple[float, str] | None:
    """The MFU in percent and the rest of an MFU-above-published warning (the part two plans of
    one job share); None for any other warning."""
    match = _MFU_WARNING.match(warning)
    return None if match is None else (float(match.group(1)), warning[match.end() :])


@dataclass(frozen=True)
class BestMfu:
    gpus: tuple[str, ...]
    precision: str
    mfu: float
    kind: str
    run: str
    cite: str
    source: str


@dataclass(frozen=True)
class JobChecks:
    largest_batch_tokens: int
    batch_factor: float
    batch_source: str
    best_mfu: tuple[BestMfu, ...]

    def best_for(self, gpu: str, precision: str) -> BestMfu | None:
        key = "16-bit" if precision in ("bf16", "fp16") else precision
        return next((b for b in self.best_mfu if gpu in b.gpus and b.precision == key), None)

    def best_among(self, gpus: frozenset[str], precision: str) -> BestMfu | None:
        """The highest best-published MFU on any of ``gpus`` at ``precision``."""
        found = [b for g in gpus if (b := self.best_for(g, precision)) is not None]
        return max(found, key=lambda b: b.mfu, default=None)


@lru_cache(maxsize=1)
def load_job_checks(path: Path = DATA_PATH) -> JobChecks:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    batch = data["largest_batch"]
    best = tuple(
        BestMfu(tuple(b["gpus"]), b["precision"], float(b["mfu"]), b["kind"], b["run"], b["cite"], b["source"])
        for b in data["best"]
    )
    return JobChecks(int(batch["tokens"]), float(batch["factor"]), batch["source"], best)


def job_warnings(job: JobSpec) -> list[str]:
    """Warnings about the job itself (before any plan)."""
    checks = (_tokens_like_batch, _partial_nodes, _small_batch, _inert_settings, _preset_gpu_swapped, _small_cliques)
    return [w for w in (check(job) for check in checks) if w]


def plan_warnings(job: JobSpec, plan: Plan, subject: str = "the top plan") -> list[str]:
    """Warnings about a plan of the job (``subject``: how they name it)."""
    return [w for w in (_few_micro_batches(plan, subject), _mfu_above_published(job, plan)) if w]


def shared_nodes_warning(taken_per_node: int, gpus_per_node: int, nodes: int) -> str | None:
    """A plan placed on free nodes that takes only some GPUs of each (its ``assignment``)."""
    if taken_per_node >= gpus_per_node:
        return None
    return (
        f"the plan takes {taken_per_node} of the {gpus_per_node} GPUs on each of its {nodes} nodes: they share "
        "their node (NVLink domain, NICs) with other jobs, which the plans do not cost"
    )


def _tokens_like_batch(job: JobSpec) -> str | None:
    checks = load_job_checks()
    t = job.training
    gbs, seq = t.global_batch_size or 0, t.seq_len
    tokens = gbs * seq
    if tokens <= checks.batch_factor * checks.largest_batch_tokens:
        return None
    hint = f"; as global_batch_tokens it would be {gbs // seq:,} sequences of {seq:,}" if gbs % seq == 0 else ""
    return (
        f"global_batch_size is {gbs:,} sequences of {seq:,} tokens, {tokens:,} tokens a step: more than "
        f"{checks.batch_factor:g} times the largest published pre-training batch ({checks.largest_batch_tokens:,} "
        f"tokens, DeepSeek-V3); global_batch_size counts sequences: was a token count meant{hint}?"
    )


def _preset_gpu_swapped(job: JobSpec) -> str | None:
    """``cluster.gpu`` given with a preset of another GPU keeps the preset's node size and NVLink
    domain (an explicit field overrides only itself): say so where the GPU comes in other ones
    (a catalog preset built on it, else its catalog NVLink domain) and the request did not set them."""
    c, cat = job.cluster, current().catalog
    if c.preset is None or "gpu" not in c.given_fields or c.gpu == cat.clusters[c.preset].gpu:
        return None
    home = next((p for p in cat.clusters.values() if p.gpu == c.gpu), None)  # a preset built on the GPU
    domain = home.nvlink_domain_size if home else cat.gpus[c.gpu or ""].default_nvlink_domain_size
    node = home.gpus_per_node if home else min(8, domain)
    kept = []
    if "nvlink_domain_size" not in c.given_fields and c.nvlink_domain_size != domain:
        kept.append((f"{c.nvlink_domain_size}-GPU NVLink domains", f"{domain}", "nvlink_domain_size"))
    if "gpus_per_node" not in c.given_fields and c.gpus_per_node != node:
        kept.append((f"{c.gpus_per_node} GPUs a node", f"{node}", "gpus_per_node"))
    if not kept:
        return None
    return (
        f"cluster.gpu {c.gpu} replaces preset {c.preset}'s {cat.clusters[c.preset].gpu} and keeps the preset's "
        f"{' and '.join(k[0] for k in kept)}, where {c.gpu} comes with {' and '.join(k[1] for k in kept)}: set "
        f"{' and '.join('cluster.' + k[2] for k in kept)} if the cluster differs"
    )


def _small_cliques(job: JobSpec) -> str | None:
    """A topology whose NVLink domains (``nvlink_level``) hold fewer GPUs than the cluster's
    ``nvlink_domain_size``: NVLink beyond them is costed as the network (GB200 racks given as
    Slurm blocks, or a provider's clique label, without ``nvlink_level``)."""
    c = job.cluster
    topo = c.topology
    if topo is None or not c.gpus_per_node or not c.nvlink_domain_size:
        return None
    largest = topo.largest_nvlink_domain()[1] * c.gpus_per_node
    if largest >= min(c.nvlink_domain_size, c.num_gpus or c.nvlink_domain_size):  # the job's nodes may be a part
        return None
    return (
        f"cluster.topology's NVLink domains ({topo.nvlink_level}) hold at most {largest} GPUs, but the cluster's are "
        f"{c.nvlink_domain_size} (nvlink_domain_size): NVLink between them is costed as the network; set "
        "topology.nvlink_level to the level of the NVLink domains (pplan topology ... --nvlink-level)"
    )


def _partial_nodes(job: JobSpec) -> str | None:
    """A GPU count that leaves a node partly used. With ``cluster.topology`` the plan's
    ``assignment`` says which nodes it takes and how many GPUs of each: said from it instead
    (``shared_nodes_warning``)."""
    n, per_node = job.cluster.resolved_num_gpus, job.cluster.gpus_per_node or 1
    if job.cluster.topology is not None or n % per_node == 0 or (n < per_node and per_node % n == 0):
        return None
    return (
        f"num_gpus ({n:,}) is not a whole number of {per_node}-GPU nodes ({n // per_node:,} nodes and {n % per_node} "
        "GPUs): the partial node's GPUs share their node (NVLink domain, NICs) with another job, which the plans "
        "do not cost"
    )


def _small_batch(job: JobSpec) -> str | None:
    """Fewer sequences than node count: every data-parallel replica spans more than a node."""
    n, per_node = job.cluster.resolved_num_gpus, job.cluster.gpus_per_node or 1
    gbs = job.training.global_batch_size or 0
    if gbs * per_node >= n:
        return None
    span = -(-n // gbs)
    return (
        f"global_batch_size ({gbs:,}) is small for {n:,} GPUs: at most {gbs:,} data-parallel replicas, so each spans "
        f"at least {span:,} GPUs (tp*pp*cp >= {span:,}, more than one {per_node}-GPU node) with "
        f"{gbs * job.training.seq_len / n:,.0f} tokens a GPU a step"
    )


MOE_TRAINING_FIELDS = ("moe_dispatcher", "moe_capacity_factor", *MOE_KNOBS)
"""``training`` fields that act on MoE layers only (the stack knobs among them: ``MOE_KNOBS``)."""


def inert_settings_note(job: JobSpec) -> str | None:
    """``_inert_settings`` worded for one scored layout (``/evaluate``'s notes)."""
    warning = _inert_settings(job)
    return None if warning is None else warning.replace("the plans ignore them", "the score ignores them")


def _inert_settings(job: JobSpec) -> str | None:
    """Fields the job gives that change nothing for its model (kept, not an error: a job file may
    be shared between models)."""
    inert = []
    if job.model.moe is None:
        given = job.training.model_fields_set
        inert += [f"training.{f}" for f in MOE_TRAINING_FIELDS if f in given]
    if job.model.sliding_window is None and job.model.sliding_window_every != 1:
        inert.append("model.sliding_window_every (no model.sliding_window)")
    if not inert:
        return None
    return f"{', '.join(inert)} {'has' if len(inert) == 1 else 'have'} no effect on this model: the plans ignore them"


def _few_micro_batches(plan: Plan, subject: str) -> str | None:
    c = plan.config
    m = c.num_micro_batches or 1
    if c.pp == 1 or m >= MICRO_BATCHES_PER_STAGE * c.pp:
        return None
    bubble = plan.time_breakdown_s.pp_bubble
    return (
        f"{subject} runs {m} micro-batches through {c.pp} pipeline stages (fewer than "
        f"{MICRO_BATCHES_PER_STAGE} a stage): its bubble takes {bubble:.3f} s ({100 * bubble / plan.step_time_s:.1f}% "
        "of the step); a larger global batch gives each replica more micro-batches"
    )


def _mfu_above_published(job: JobSpec, plan: Plan) -> str | None:
    """Above the best published run of any model on the job's GPU and precision, or, for an MoE
    model, of its own shape at its sequence length there: an MoE model's MFU depends on its expert
    sizes and routing far more than a dense model's on its size, so the best dense runs that set
    the GPU's bound say little about it."""
    gpu, precision = job.cluster.gpu or "", job.training.precision
    same, where = None, gpu
    if job.model.moe:
        same = best_for_model(job.model, gpu, precision, job.training.seq_len)
        if same is None:  # a GPU with no run of its own: its generation's (an H200 against H100 runs)
            found = [
                b for g in _generation_of(gpu) if (b := best_for_model(job.model, g, precision, job.training.seq_len))
            ]
            same = max(found, key=lambda b: b.mfu, default=None)
            where = f"{current().catalog.gpus[gpu].generation} GPUs"
    if same is not None:
        if plan.mfu <= same.mfu:
            return None  # the model's own bound, in the planner's FLOP count, replaces the GPU's
        return (
            f"{MFU_OPENING} {100 * plan.mfu:.1f}% is above the best published for this model's shape on {where} at "
            f"{precision} and {same.seq_len:,} tokens ({100 * same.mfu:.1f}%, {same.model} on {same.num_gpus:,} GPUs, "
            f"published run {same.run}): treat the prediction as an upper estimate"
        )
    checks = load_job_checks()
    best = checks.best_for(gpu, precision)
    if best is not None:
        if plan.mfu <= best.mfu:
            return None
        return (
            f"{MFU_OPENING} {100 * plan.mfu:.1f}% is above the best published for {gpu} at "
            f"{precision} ({100 * best.mfu:.1f}%, {best.cite}): treat the prediction as an upper estimate"
        )
    return _mfu_above_generation(checks, gpu, precision, plan.mfu)


def _generation_of(gpu: str) -> frozenset[str]:
    """The catalog's GPUs of ``gpu``'s generation (itself included)."""
    gpus = current().catalog.gpus
    return frozenset(g for g, e in gpus.items() if e.generation == gpus[gpu].generation)


def _mfu_above_generation(checks: JobChecks, gpu: str, precision: str, mfu: float) -> str | None:
    """For a GPU with no published run of its own: above the best published on its generation's
    other GPUs (an H200 or H20 against the H100's runs)."""
    generation = current().catalog.gpus[gpu].generation
    best = checks.best_among(_generation_of(gpu), precision)
    if best is None or mfu <= best.mfu:
        return None
    return (
        f"{MFU_OPENING} {100 * mfu:.1f}% is above the best published on {generation} GPUs at {precision} "
        f"({100 * best.mfu:.1f}%, {best.cite}, on {best.gpus[0]}; none is published on {gpu}): treat the "
        "prediction as an upper estimate"
    )
