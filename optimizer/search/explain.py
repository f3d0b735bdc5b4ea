"""The explanations of answers without plans: no valid layout, or none fitting in memory."""

from __future__ import annotations

import math
from dataclasses import replace

from optimizer.cost import Estimate, build_context, estimate
from optimizer.cost.rules import divisors
from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import profile
from optimizer.search.fixed_values import fixed_combination_reason
from optimizer.search.framework_explain import framework_rules_explanation
from optimizer.search.space import MAX_CP, MIN_CP_CHUNK, SpaceBudget, cp_chunk_too_short, empty_choice
from optimizer.specs import JobSpec, SearchSpec
from optimizer.units import to_gib


def no_layout_explanation(job: JobSpec, spec: SearchSpec, budget: SpaceBudget | None = None) -> str:
    """Why the space of ``job`` under ``spec`` holds no valid layout (reading other spaces within
    ``budget``, the search's)."""
    knob = empty_choice(job, spec)
    if knob is not None:
        return f"no valid layout: search.fix / search.allow leave no {knob} the search can use" + (
            " ('moe' recompute needs an MoE model)" if knob == "recompute" and job.model.moe is None else ""
        )
    framework = framework_rules_explanation(job, spec, budget or SpaceBudget(math.inf, math.inf))
    if framework is not None:
        return framework
    pinned = fixed_combination_reason(job, spec)
    if pinned is not None:
        return f"no valid layout: {pinned}"
    t = job.training
    m = job.model
    return (
        f"no valid layout: with num_gpus={job.cluster.num_gpus}, global_batch_size={t.global_batch_size}, "
        f"num_attention_heads={m.num_attention_heads}, num_kv_heads={m.num_kv_heads}, num_layers={m.num_layers} "
        "no combination of tp/pp/cp/dp (and the search.fix / search.allow restrictions) divides evenly "
        "with micro-batches >= pp"
        + ("; training.attention_kernel 'unfused' allows only cp = 1" if t.attention_kernel == "unfused" else "")
        + _short_chunks_left_out(job, spec)
    )


def _short_chunks_left_out(job: JobSpec, spec: SearchSpec) -> str:
    """The context-parallel sizes the layout rules allow and the default space leaves out
    (``space.cp_chunk_too_short``), which a request may name."""
    if spec.fix.cp is not None or spec.allow.cp is not None or job.training.attention_kernel == "unfused":
        return ""
    n, seq = job.cluster.num_gpus or 0, job.training.seq_len
    left = [d for d in divisors(n) if d <= MAX_CP and seq % (2 * d) == 0 and cp_chunk_too_short(seq, d)]
    if not left:
        return ""
    return (
        f"; the default space leaves out cp {left} (context-parallel chunks under {MIN_CP_CHUNK} tokens): "
        "name them in search.allow.cp to search them"
    )


def memory_explanation(best: Estimate | None, job: JobSpec) -> str:
    """Name the smallest per-GPU memory need over all layouts (all were costed) against capacity;
    its recompute under the named framework's own name."""
    if best is None:
        return "no layout fits in memory"
    lay = best.layout
    named = job.training.framework
    recompute = (profile(named).own_recompute(lay.recompute) if named else None) or lay.recompute
    cap = to_gib(best.usable_bytes)
    return (
        f"no layout fits in memory: the smallest per-GPU memory over all layouts is "
        f"{to_gib(best.peak_memory_bytes):.1f} GiB on stage {best.peak_stage} "
        f"(tp={lay.tp} pp={lay.pp} cp={lay.cp} ep={lay.ep} micro_batch_size={lay.micro_batch_size}, "
        f"ZeRO-{lay.zero_stage}, {recompute} recompute); usable capacity "
        f"{cap:.1f} GiB ({to_gib(best.capacity_bytes):.1f} GiB minus {to_gib(best.headroom_bytes):.1f} GiB headroom)"
        + _step_copy_clause(best, job)
    )


def _step_copy_clause(best: Estimate, job: JobSpec) -> str:
    """What the optimizer step's fp32 copy of 16-bit gradients adds to that peak, when it does; and
    the same layout with fp32 gradients (which the step uses in place) and full recompute, when
    that fits and a target framework runs fp32 gradients."""
    step = float(best.memory[best.peak_stage].optimizer_step_bytes)  # numbers on the one-layout path
    if not step:
        return ""
    clause = (
        f"; the optimizer step's fp32 copy of the 16-bit gradients needs {to_gib(step):.1f} GiB of it beyond "
        "the activations it replaces"
    )
    fp32 = job.model_copy(update={"training": job.training.model_copy(update={"grad_reduce_in_fp32": True})})
    if not candidate_frameworks(fp32.training, fp32.model, generation=job.gpu_generation):
        return clause
    full = estimate(build_context(fp32), replace(best.layout, recompute="full"), best.order)
    if not full.fits_memory:
        return clause
    return clause + (
        f"; with fp32 gradients (training.grad_reduce_in_fp32) and full recompute the same layout needs "
        f"{to_gib(full.peak_memory_bytes):.1f} GiB"
    )
