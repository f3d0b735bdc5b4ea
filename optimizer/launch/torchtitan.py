"""torchtitan TOML job-config fragments for a planned layout (``torchtitan/config/job_config.py``),
with a comment where torchtitan runs the layout differently from the plan."""

from __future__ import annotations

import json

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch.common import Geometry
from optimizer.specs import TrainingSpec


def _torchtitan_fqns(chunks: tuple[int, ...]) -> list[list[str]]:
    parts: list[list[str]] = []
    start = 0
    for i, n in enumerate(chunks):
        part = ["tok_embeddings"] if i == 0 else []
        part += [f"layers.{j}" for j in range(start, start + n)]
        if i == len(chunks) - 1:
            part += ["norm", "output"]
        parts.append(part)
        start += n
    return parts


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            rows = ",\n".join(f"  {_toml_value(v)}" for v in value)
            return f"[\n{rows},\n]"
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def torchtitan_toml(training: TrainingSpec, layout: ResolvedLayout, geo: Geometry, is_moe: bool) -> str:
    """A torchtitan TOML job-config fragment for the layout (of an MoE model when ``is_moe``), with
    a comment where torchtitan runs it differently from the plan."""
    parallelism, shard, async_tp, local_batch = _torchtitan_parallelism(training, layout, geo)
    mode = {"moe": "full", "op": "selective", "core_attn": "selective"}.get(layout.recompute, layout.recompute)
    checkpoint: dict[str, object] = {"mode": mode}
    if mode == "selective":
        checkpoint["selective_ac_option"] = "op"
    train: dict[str, object] = {
        "local_batch_size": local_batch,
        "global_batch_size": geo.gbs,
        "seq_len": geo.seq,
    }
    # The cost model's fused elementwise kernels are torch.compile's in torchtitan; async TP also
    # only takes effect when compiled.
    train["compile"] = training.fused_kernels or async_tp
    comments = _torchtitan_parallelism_comments(training, layout, geo, shard, is_moe)
    _torchtitan_training(training, geo, train, comments)
    sections: dict[str, dict[str, object]] = {
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
        "training": train,
    }
    # always written: torchtitan's own configs turn float8 on (llama3_405b.toml)
    sections["model"] = {"converters": ["float8"] if training.precision == "fp8" else []}  # no fp4 (frameworks.toml)
    lines: list[str] = []
    for name, keys in sections.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines += [f"# {c}" for c in comments.get(name, [])]
        lines += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _torchtitan_parallelism(
    training: TrainingSpec, layout: ResolvedLayout, geo: Geometry
) -> tuple[dict[str, object], int, bool, int]:
    """The ``[parallelism]`` section, the FSDP shard degree, whether async TP is on, and the local
    batch size."""
    # torchtitan shards with FSDP2 or replicates with DDP, which keeps the whole optimizer state on
    # every rank (more memory than a ZeRO-1/2 plan): every sharded stage maps to FSDP2.
    fsdp = layout.zero_stage >= 1
    shard = geo.dp if fsdp else 1
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": geo.dp // shard,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": geo.tp,
        "pipeline_parallel_degree": geo.pp,
        "context_parallel_degree": geo.cp,
        "expert_parallel_degree": geo.ep,
    }
    if fsdp and layout.zero_stage < 3 and geo.pp == 1:
        # weights stay gathered from forward to backward, as ZeRO-1/2 keeps them whole (with pp > 1
        # torchtitan's pipeline schedule keeps them gathered anyway)
        parallelism["fsdp_reshard_after_forward"] = "never"
    async_tp = training.tp_comm_overlap and geo.sp  # sequence parallel implies tp > 1
    # always written (torchtitan's own configs turn it on); effective only with training.compile
    parallelism["enable_async_tensor_parallel"] = async_tp
    if geo.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if geo.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = geo.mbs
        parallelism["module_fqns_per_model_part"] = _torchtitan_fqns(geo.chunks)
        # All micro-batches of a step go through the pipeline schedule at once.
        local_batch = geo.mbs * geo.nmb
    else:
        # One micro-batch per forward; torchtitan accumulates global / (local * dp) of them.
        local_batch = geo.mbs
    return parallelism, shard, async_tp, local_batch


def _torchtitan_parallelism_comments(
    training: TrainingSpec, layout: ResolvedLayout, geo: Geometry, shard: int, is_moe: bool
) -> dict[str, list[str]]:
    """Comments for the ``[activation_checkpoint]`` and ``[parallelism]`` sections."""
    comments: dict[str, list[str]] = {}
    if layout.recompute == "moe":
        comments["activation_checkpoint"] = [
            "torchtitan has no MoE-block recompute: full recompute (slower than the plan's 'moe')"
        ]
    elif layout.recompute == "selective":
        comments["activation_checkpoint"] = [
            (
                "torchtitan has no attention-core-only recompute: op-level selective checkpointing (plan "
                "with recompute 'op' to cost it exactly)"
            )
        ]
    if training.ep_comm_overlap and geo.ep > 1:  # ep > 1 only for MoE models
        comments["parallelism"] = [
            "torchtitan has no batch-level all-to-all overlap: expect slower MoE layers than the plan"
        ]
    if geo.ep > 1 and training.moe_dispatcher != "alltoall":
        comments.setdefault("parallelism", []).append(
            f"the plan costs the {training.moe_dispatcher} dispatcher; these settings keep torchtitan's "
            "all-to-all (plan with training.moe_dispatcher 'alltoall' to cost it)"
        )
    if not training.dp_comm_overlap and geo.has_dp_group:
        comments.setdefault("parallelism", []).append(
            "torchtitan always overlaps data-parallel collectives with compute: expect a faster step than the plan"
        )
    comments.setdefault("parallelism", []).extend(_torchtitan_sharding_comments(layout, geo))
    if geo.ep > 1 and (geo.ep % geo.cp or (shard * geo.cp) % geo.ep):
        comments.setdefault("parallelism", []).append(
            f"torchtitan's expert parallelism borrows cp and data_parallel_shard_degree ranks: it needs cp "
            f"({geo.cp}) to divide expert_parallel_degree and expert_parallel_degree to divide "
            f"data_parallel_shard_degree x cp ({shard * geo.cp}): this layout does not run there"
        )
    if is_moe and geo.etp != geo.tp:
        comments.setdefault("parallelism", []).append(
            f"torchtitan splits routed experts over tensor parallelism (etp = tp = {geo.tp}); the plan's etp "
            f"{geo.etp} does not run there"
        )
    return comments


def _torchtitan_training(
    training: TrainingSpec, geo: Geometry, train: dict[str, object], comments: dict[str, list[str]]
) -> None:
    """The ``[training]`` section's precision settings (into ``train``) and its comments."""
    if training.attention_kernel == "unfused":
        comments["training"] = [
            "attention costed with materialised scores: torchtitan's SDPA kernels are faster and leaner than the plan"
        ]
    elif training.attention_kernel == "flash3":
        comments["training"] = [
            (
                "attention costed with Hopper-native kernels: run SDPA's cuDNN backend or FlashAttention-3 "
                "(PyTorch SDPA's default flash backend is FlashAttention-2, slower than the plan)"
            )
        ]
    if training.precision == "fp16":
        comments.setdefault("training", []).append(
            "fp16 has no torchtitan setting: training.mixed_precision_param takes bfloat16|float32"
        )
    else:
        train["mixed_precision_param"] = "bfloat16"
    train["mixed_precision_reduce"] = "float32"  # the only value torchtitan takes
    if training.cross_entropy == "fused":
        held = 16 if geo.tp > 1 else 12  # with TP, PyTorch's loss_parallel
        comments.setdefault("training", []).append(
            f"torchtitan computes the loss with PyTorch's cross_entropy on fp32 logits: {held} bytes per logit on "
            + "the last stage where this plan has 6 (plan with training.cross_entropy unfused to cost it)"
        )
    if geo.has_dp_group and not training.grad_reduce_in_fp32:
        comments.setdefault("training", []).append(
            "torchtitan reduces gradients in float32 (FSDP2's mixed_precision_reduce takes no other value; DDP "
            + "keeps fp32 parameters under autocast): twice the gradient bytes of this plan (plan with "
            + "training.grad_reduce_in_fp32 true to cost them)"
        )


def _torchtitan_sharding_comments(layout: ResolvedLayout, geo: Geometry) -> list[str]:
    """Where torchtitan's DDP / FSDP2 differ from the plan's ZeRO stage (PyTorch
    ``torch/distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``: with pp > 1, FSDP2
    modules neither reshard nor reduce gradients until a step's last backward)."""
    z = layout.zero_stage
    if z == 0:
        if geo.cp > 1 or geo.dp > 1 and max(geo.tp, geo.pp, geo.ep) > 1:  # with CP it runs FSDP
            return [
                "torchtitan's DDP (zero_stage 0) runs only when data parallelism is the only parallel "
                + "dimension: this layout does not run there (plan with zero_stage 1 or more)"
            ]
        return []
    if geo.pp > 1 and z >= 2:
        return [
            "torchtitan's pipeline schedule keeps a stage's weights gathered and its gradients unsharded "
            + "from its first backward to its last (ZeRO-1 memory): expect more memory per GPU than this "
            + f"ZeRO-{z} plan; plan with search.allow.zero_stage [0, 1] to cost it"
        ]
    if geo.pp == 1 and z < 3 and geo.nmb > 1:
        return [
            f"torchtitan has no ZeRO-{z}: FSDP2 keeps the gathered weights from forward to backward, as "
            + f"the plan does, but gathers them for each of the {geo.nmb} micro-batches where the plan "
            + "gathers once per step"
            + (" and reduce-scatters gradients once per step" if z == 1 else "")
            + ": expect more data-parallel traffic"
        ]
    return []


PIPELINE_GRADIENT_SHARD_NOTE = (
    "torchtitan's FSDP2 under a pipeline schedule also keeps each parameter's sharded fp32 gradient "
    "after the last backward: up to 4 / (dp x cp) bytes a parameter more than the plan's memory counts"
)
"""The plan's line for a torchtitan ZeRO-1 pipeline with data-parallel ranks: FSDP2 reduce-scatters
the whole fp32 gradient it accumulated unsharded into a sharded one, and both exist at once."""


def torchtitan_notes(layout: ResolvedLayout) -> list[str]:
    """What a torchtitan plan's memory does not count, one line each."""
    return [PIPELINE_GRADIENT_SHARD_NOTE] if layout.pp > 1 and layout.dp * layout.cp > 1 else []
