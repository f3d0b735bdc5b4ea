"""Launch settings for a planned layout, for four training frameworks.

``build_launch(model, training, layout)`` is a pure function: it turns one planned layout into
Megatron-LM command-line arguments, a torchtitan TOML fragment, a DeepSpeed config JSON and
Megatron-Bridge recipe overrides. Only the settings the layout decides are emitted (parallel
degrees, batch geometry, pipeline split, optimizer sharding, recompute, precision); model
architecture, data, optimizer hyper-parameters and checkpoint paths stay with the user.

Where each framework's names come from (read in the framework's own repository):

* Megatron-LM -- ``NVIDIA/Megatron-LM`` ``megatron/training/arguments.py`` (commit
  000c4ac24f61159c138b0975def722c65245983c): ``_add_distributed_args``, ``_add_training_args``,
  ``_add_mixed_precision_args``, ``_add_transformer_engine_args``, ``_add_moe_args``,
  ``_add_data_args``, ``_add_checkpointing_args``, ``validate_args``. Semantics of the uneven split:
  ``megatron/core/transformer/transformer_layer.py`` (``get_transformer_layer_offset``) and
  ``megatron/core/transformer/pipeline_parallel_layer_layout.py``. Megatron-FSDP required
  flags: Megatron-Core developer guide, "Megatron-FSDP User Guide".
* torchtitan -- ``pytorch/torchtitan`` ``torchtitan/config/job_config.py`` (commit
  6404b932421f5ce382e7dac5ad381b2c17b1373c, the TOML job-config generation: ``[parallelism]``,
  ``[training]``, ``[activation_checkpoint]``, ``[model]``); module names for
  ``module_fqns_per_model_part`` from ``torchtitan/distributed/pipeline_parallel.py``
  (``generate_llm_fqn_per_model_part``: ``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``).
  Newer torchtitan replaces TOML files with Python configurations
  (``torchtitan/config/README.md``); the ``section.option`` names still work as
  ``--section.option`` command-line flags there, except the two pipeline keys noted in
  ``docs/launch.md``.
* DeepSpeed -- ``microsoft/DeepSpeed`` ``docs/_pages/config-json.md`` (commit
  da7f21a2516a693f973a5f4b26affcce1de6d38d): batch-size keys, ``zero_optimization.stage``,
  ``zero_optimization.overlap_comm``, ``zero_optimization.stage3_prefetch_bucket_size`` (default
  from ``deepspeed/runtime/zero/config.py``), ``bf16.enabled``, ``fp16.enabled``,
  ``activation_checkpointing``.
* Megatron-Bridge (NeMo's current training library; ``ConfigContainer`` Hydra overrides) --
  ``NVIDIA-NeMo/Megatron-Bridge`` ``docs/megatron-lm-to-megatron-bridge.md`` (flag-to-field
  mapping), ``src/megatron/bridge/training/mixed_precision.py`` (precision recipe names),
  ``src/megatron/bridge/training/utils/omegaconf_utils.py`` (Hydra ``OverridesParser``); field
  names under ``model.*`` and ``ddp.*`` are Megatron-Core's ``ModelParallelConfig``
  (``megatron/core/model_parallel_config.py``), ``TransformerConfig`` and
  ``DistributedDataParallelConfig`` fields.

``docs/launch.md`` has the full mapping table.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from optimizer.cost.pipeline import even_split
from optimizer.params import layer_params
from optimizer.results import LaunchArgs
from optimizer.specs import Layout, ModelSpec, TrainingSpec

MEGATRON_FLAGS: frozenset[str] = frozenset(
    {
        # _add_distributed_args
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--context-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--pipeline-model-parallel-layout",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",  # needs --use-distributed-optimizer (validate_args)
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        # _add_moe_args
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",  # defaults to --tensor-model-parallel-size (validate_args)
        "--moe-token-dispatcher-type",  # default 'allgather' ('alltoall' recommended with EP)
        "--moe-flex-dispatcher-backend",  # with dispatcher 'flex': deepep or hybridep
        "--moe-expert-capacity-factor",  # default None: dropless
        "--moe-pad-expert-input-to-capacity",  # effective once the capacity factor is set
        "--moe-grouped-gemm",
        "--no-overlap-p2p-communication",  # _add_distributed_args (overlap is the interleaved default)
        "--overlap-moe-expert-parallel-comm",  # MCore >= 0.14 (moe/README.md: batch-level overlap)
        "--delay-wgrad-compute",  # required with the flag above
        # _add_training_args
        "--micro-batch-size",
        "--global-batch-size",
        "--sequence-parallel",
        "--tp-comm-overlap",
        "--recompute-granularity",
        "--recompute-method",
        "--recompute-num-layers",
        "--recompute-modules",
        "--no-gradient-accumulation-fusion",
        # _add_data_args
        "--seq-length",
        # _add_checkpointing_args
        "--ckpt-format",
        # _add_mixed_precision_args
        "--bf16",
        "--fp16",
        "--grad-reduce-in-bf16",  # sets accumulate_allreduce_grads_in_fp32 false (validate_args)
        "--accumulate-allreduce-grads-in-fp32",
        # _add_transformer_engine_args
        "--fp8-format",
        "--fp4-format",
        "--fp4-recipe",
        "--attention-backend",  # AttnBackend: flash, fused, unfused, local, auto
    }
)
"""Every Megatron-LM flag ``build_launch`` may emit, each checked against ``arguments.py``."""

ATTENTION_BACKEND = {"flash3": "fused", "flash2": "flash", "unfused": "unfused"}
"""``training.attention_kernel`` as Megatron's ``--attention-backend`` / Bridge's
``model.attention_backend`` (AttnBackend): 'fused' is Transformer Engine's cuDNN fused attention
(Hopper-native kernels), 'flash' its FlashAttention backend (flash-attn 2), 'unfused' its
unfused attention over materialised scores (Megatron's own implementation is 'local')."""

_DEEPSPEED_PREFETCH_DEFAULT = 50_000_000
"""DeepSpeed's ``stage3_prefetch_bucket_size`` default (``deepspeed/runtime/zero/config.py``)."""

# Megatron-FSDP ``--data-parallel-sharding-strategy`` per ZeRO stage (stages 0 and 1 do not use it).
_MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
MEGATRON_MOE_RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe")
"""``recompute="moe"``: Megatron-Core selective recompute modules (TransformerConfig.recompute_modules;
'moe' wraps the whole MoE layer forward in a checkpoint, 'layernorm' the input/pre-MLP norms)."""


def _megatron_dispatcher_args(dispatcher: str) -> list[str]:
    """Megatron-LM flags for ``training.moe_dispatcher``: the all-to-all or all-gather dispatcher,
    or the flex dispatcher with its DeepEP / HybridEP backend."""
    if dispatcher in ("deepep", "hybridep"):
        return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", dispatcher]
    return ["--moe-token-dispatcher-type", dispatcher]


def megatron_recompute_modules(model: ModelSpec, recompute: str) -> tuple[str, ...] | None:
    """Megatron-Core ``recompute_modules`` for a selective-granularity plan (None: its default,
    ``core_attn``). MLA models add ``mla_up_proj``: the plan's selective and moe recompute keep
    the latents and re-make the per-head q, k, v (``cost.layer.MLA_UP_RECOMPUTED``)."""
    mla = ("mla_up_proj",) if model.mla is not None else ()
    if recompute == "moe":
        return MEGATRON_MOE_RECOMPUTE_MODULES + mla
    if recompute in ("selective", "core_attn") and mla:
        return ("core_attn", *mla)
    return None


@dataclass(frozen=True)
class _Geometry:
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


@dataclass(frozen=True)
class _Split:
    """How the planned pipeline split is expressed to Megatron."""

    uniform: bool
    first: int | None = None
    last: int | None = None
    layout: str | None = None
    """Megatron ``--pipeline-model-parallel-layout`` string, when first/last cannot express it."""


def default_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> list[int]:
    """The split used when ``Layout.stage_layers`` is null: the cost model's even split.

    Every one of the ``pp * vpp`` chunks gets ``num_layers // (pp * vpp)`` layers; the remainder
    goes to the chunks nearest the middle, so the first chunk (embedding) and the last (output
    layer and loss) are the ones left with the smaller share.
    """
    return even_split(num_layers, pp * vpp)


ALL_LAUNCH_FIELDS = ("megatron", "torchtitan", "deepspeed", "nemo")


def build_launch(
    model: ModelSpec, training: TrainingSpec, layout: Layout, fields: tuple[str, ...] = ALL_LAUNCH_FIELDS
) -> LaunchArgs:
    """Launch settings for ``layout`` (``layout.dp`` and ``layout.num_micro_batches`` set; recompute
    in the cost model's names), for the ``LaunchArgs`` ``fields`` named (the frameworks that run
    the plan as costed); the others stay empty."""
    geo = _geometry(model, training, layout)
    split = _megatron_split(geo)
    builders = {
        "megatron": lambda: _megatron(model, training, layout, geo, split),
        "torchtitan": lambda: _torchtitan(training, layout, geo),
        "deepspeed": lambda: _deepspeed(model, training, layout, geo),
        "nemo": lambda: _nemo(model, training, layout, geo, split),
    }
    return LaunchArgs(**{name: builders[name]() for name in fields})


# ---------------------------------------------------------------------------------------------
# Shared geometry
# ---------------------------------------------------------------------------------------------


def _geometry(model: ModelSpec, training: TrainingSpec, layout: Layout) -> _Geometry:
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
    return _Geometry(
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


def _megatron_split(geo: _Geometry) -> _Split:
    """Express the chunk split with Megatron's uneven-pipeline settings.

    ``--decoder-first/last-pipeline-num-layers`` give the layers on pipeline rank 0 / pp-1
    (spread evenly over that rank's virtual chunks); the other ranks share the rest evenly. A
    split they cannot express, or with a chunk holding only the embedding or only the loss, is
    given exactly by ``--pipeline-model-parallel-layout``.
    """
    chunks, pp = geo.chunks, geo.pp
    if pp == 1 or len(set(chunks)) == 1:
        return _Split(uniform=True)
    if min(chunks) == 0:  # an embedding-only first or loss-only last chunk
        return _Split(uniform=False, layout=_megatron_layout_string(chunks))
    first = [c for i, c in enumerate(chunks) if i % pp == 0]
    last = [c for i, c in enumerate(chunks) if i % pp == pp - 1]
    middle = [c for i, c in enumerate(chunks) if 0 < i % pp < pp - 1]
    if len(set(first)) == 1 and len(set(last)) == 1 and len(set(middle)) <= 1:
        return _Split(uniform=False, first=sum(first), last=sum(last))
    return _Split(uniform=False, layout=_megatron_layout_string(chunks))


def _dp_overlapped(training: TrainingSpec, geo: _Geometry) -> bool:
    """The plan overlaps data-parallel collectives (``training.dp_comm_overlap``) and has them
    (a ``dp x cp`` group)."""
    return training.dp_comm_overlap and geo.has_dp_group


def _largest_layer_params(model: ModelSpec, tp: int, ep: int) -> int:
    """Parameters of the largest layer on one rank, as the cost model holds them
    (``LayerParams.on_rank``): what a ZeRO-3 prefetch must hold to gather the next layer while the
    current one computes, and no more (a larger bucket would prefetch several layers, more memory
    than the plan holds for two)."""
    assert model.num_layers is not None  # set by the spec validators
    return math.ceil(max(sum(layer_params(model, i).on_rank(tp, ep)) for i in range(model.num_layers)))


def _megatron_layout_string(chunks: tuple[int, ...]) -> str:
    """``E``/``L`` mark embedding and loss, ``t*n`` n decoder layers, ``|`` separates chunks."""
    stages = []
    for i, n in enumerate(chunks):
        body = "t" if n == 1 else (f"t*{n}" if n > 1 else "")
        prefix = "E" if i == 0 else ""
        suffix = "L" if i == len(chunks) - 1 else ""
        stages.append(prefix + body + suffix)
    return "|".join(stages)


# ---------------------------------------------------------------------------------------------
# Megatron-LM
# ---------------------------------------------------------------------------------------------


def _megatron(model: ModelSpec, training: TrainingSpec, layout: Layout, geo: _Geometry, split: _Split) -> str:
    args: list[str] = [
        "--tensor-model-parallel-size", str(geo.tp),
        "--pipeline-model-parallel-size", str(geo.pp),
        "--context-parallel-size", str(geo.cp),
    ]  # fmt: skip
    if model.is_moe:
        # The cost model keeps experts whole (expert tensor parallelism 1: expert parallelism spans
        # tp x dp x cp); Megatron's default would split them over the tensor-parallel group.
        args += ["--expert-model-parallel-size", str(geo.ep), "--expert-tensor-parallel-size", "1"]
        # the plan's dispatcher (training.moe_dispatcher) and one grouped GEMM per layer; Megatron
        # defaults to an all-gather dispatcher and a loop of per-expert GEMMs
        args += [*_megatron_dispatcher_args(training.moe_dispatcher), "--moe-grouped-gemm"]
        if training.moe_capacity_factor is not None:  # experts padded to capacity, as costed
            args += ["--moe-expert-capacity-factor", f"{training.moe_capacity_factor:g}",
                     "--moe-pad-expert-input-to-capacity"]  # fmt: skip
        if training.ep_comm_overlap and geo.ep > 1:
            # combined 1F1B schedule: one micro-batch's all-to-all under another's compute
            args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if geo.pp > 1:
        if split.layout is not None:
            # Exclusive with the virtual-stage flags; the layout string fixes vpp itself.
            args += ["--pipeline-model-parallel-layout", shlex.quote(split.layout)]
        else:
            if geo.vpp > 1:
                args += ["--num-virtual-stages-per-pipeline-rank", str(geo.vpp)]
            if not split.uniform:
                args += [
                    "--decoder-first-pipeline-num-layers", str(split.first),
                    "--decoder-last-pipeline-num-layers", str(split.last),
                ]  # fmt: skip
        if geo.vpp > 1 and not training.pp_comm_overlap and geo.pp > 2:
            # Megatron overlaps p2p in interleaved schedules by default (and never otherwise); it
            # refuses to turn it off with pp = 2
            args.append("--no-overlap-p2p-communication")
    args += [
        "--micro-batch-size", str(geo.mbs),
        "--global-batch-size", str(geo.gbs),
        "--seq-length", str(geo.seq),
    ]  # fmt: skip
    if geo.sp:
        args.append("--sequence-parallel")
        if training.tp_comm_overlap:
            args.append("--tp-comm-overlap")  # userbuffers; needs sequence parallelism
    if layout.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if _dp_overlapped(training, geo):
        # Megatron issues data-parallel collectives after backward unless asked (both default off)
        args.append("--overlap-grad-reduce")
        if layout.zero_stage >= 1:
            args.append("--overlap-param-gather")
    if layout.zero_stage in _MEGATRON_FSDP_STRATEGY:
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", _MEGATRON_FSDP_STRATEGY[layout.zero_stage],
            "--no-gradient-accumulation-fusion",
            "--ckpt-format", "fsdp_dtensor",
        ]  # fmt: skip
    if layout.recompute in ("selective", "op", "moe", "core_attn"):  # op: torchtitan's policy; Megatron's nearest
        args += ["--recompute-granularity", "selective"]
        modules = megatron_recompute_modules(model, layout.recompute)
        if modules:
            args += ["--recompute-modules", *modules]
    elif layout.recompute == "full":
        args += [
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ]  # fmt: skip
    args += ["--attention-backend", ATTENTION_BACKEND[training.attention_kernel]]
    if training.precision == "fp16":
        args.append("--fp16")
        if training.grad_reduce_in_fp32:  # fp16 keeps fp16 gradients by default
            args.append("--accumulate-allreduce-grads-in-fp32")
    else:
        args.append("--bf16")
        if not training.grad_reduce_in_fp32:  # --bf16 keeps fp32 gradients by default
            args.append("--grad-reduce-in-bf16")
        if training.precision == "fp8":
            args += ["--fp8-format", "hybrid"]
        elif training.precision == "fp4":
            args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    return " ".join(args)


# ---------------------------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------------------------


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


def _torchtitan(training: TrainingSpec, layout: Layout, geo: _Geometry) -> str:
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
    if geo.ep > 1:
        parallelism["expert_tensor_parallel_degree"] = 1  # experts whole, as the cost model keeps them
    async_tp = training.tp_comm_overlap and geo.sp  # sequence parallel implies tp > 1
    if async_tp:
        parallelism["enable_async_tensor_parallel"] = True  # effective only with training.compile
    if geo.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if geo.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = geo.mbs
        parallelism["module_fqns_per_model_part"] = _torchtitan_fqns(geo.chunks)
        # All micro-batches of a step go through the pipeline schedule at once.
        local_batch = geo.mbs * geo.nmb
    else:
        # One micro-batch per forward; torchtitan accumulates global / (local * dp) of them.
        local_batch = geo.mbs
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
    if geo.ep > 1 and (geo.ep % (geo.tp * geo.cp) or geo.ep > shard * geo.cp * geo.tp):
        comments.setdefault("parallelism", []).append(
            f"torchtitan's expert parallelism (expert_tensor_parallel_degree 1) needs expert_parallel_degree a "
            f"multiple of tp x cp ({geo.tp * geo.cp}) and at most data_parallel_shard_degree x cp x tp "
            f"({shard * geo.cp * geo.tp}): this layout does not run there"
        )
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
        comments.setdefault("training", []).append(
            "torchtitan computes the loss with PyTorch's cross_entropy on fp32 logits: 12 bytes per logit on "
            + "the last stage where this plan has 6 (plan with training.cross_entropy unfused to cost it)"
        )
    if geo.has_dp_group and not training.grad_reduce_in_fp32:
        comments.setdefault("training", []).append(
            "torchtitan reduces gradients in float32 (FSDP2's mixed_precision_reduce takes no other value; DDP "
            + "keeps fp32 parameters under autocast): twice the gradient bytes of this plan (plan with "
            + "training.grad_reduce_in_fp32 true to cost them)"
        )
    sections: dict[str, dict[str, object]] = {
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
        "training": train,
    }
    if training.precision in ("fp8", "fp4"):
        sections["model"] = {"converters": ["float8"]}
    if training.precision == "fp4":
        comments["model"] = ["torchtitan has no NVFP4 training recipe: float8 linears (slower than the plan's fp4)"]
    lines: list[str] = []
    for name, keys in sections.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines += [f"# {c}" for c in comments.get(name, [])]
        lines += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def _torchtitan_sharding_comments(layout: Layout, geo: _Geometry) -> list[str]:
    """Where torchtitan's DDP / FSDP2 differ from the plan's ZeRO stage (PyTorch
    ``torch/distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``: with pp > 1, FSDP2
    modules neither reshard nor reduce gradients until a step's last backward)."""
    z = layout.zero_stage
    if z == 0:
        if geo.dp > 1 and max(geo.tp, geo.pp, geo.cp, geo.ep) > 1:
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
            + f"the plan does, but gathers them and reduce-scatters gradients for each of the {geo.nmb} "
            + "micro-batches where the plan does both once per step: expect more data-parallel traffic"
        ]
    return []


# ---------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------


def _deepspeed(model: ModelSpec, training: TrainingSpec, layout: Layout, geo: _Geometry) -> str:
    zero: dict[str, object] = {"stage": layout.zero_stage, "overlap_comm": training.dp_comm_overlap}
    if layout.zero_stage == 3 and training.dp_comm_overlap:
        # the default prefetch (5e7 elements) is a fraction of a large model's layer: gathers
        # would run on demand instead of under the previous layer's compute
        zero["stage3_prefetch_bucket_size"] = max(
            _DEEPSPEED_PREFETCH_DEFAULT, _largest_layer_params(model, geo.tp, geo.ep)
        )
    config: dict[str, object] = {
        "train_batch_size": geo.mbs * geo.nmb * geo.dp,
        "train_micro_batch_size_per_gpu": geo.mbs,
        "gradient_accumulation_steps": geo.nmb,
        "zero_optimization": zero,
        # DeepSpeed's JSON has no FP8/FP4 switch (Transformer Engine handles it): they run on bf16.
        "bf16": {"enabled": training.precision in ("bf16", "fp8", "fp4")},
        "fp16": {"enabled": training.precision == "fp16"},
    }
    if layout.recompute != "none":
        config["activation_checkpointing"] = {
            "partition_activations": geo.tp > 1,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return json.dumps(config, indent=2, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge (NeMo)
# ---------------------------------------------------------------------------------------------


def _hydra(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _nemo(model: ModelSpec, training: TrainingSpec, layout: Layout, geo: _Geometry, split: _Split) -> str:
    vpp = geo.vpp if geo.pp > 1 and geo.vpp > 1 else None
    over: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", geo.tp),
        ("model.pipeline_model_parallel_size", geo.pp),
        ("model.virtual_pipeline_model_parallel_size", vpp),
        ("model.context_parallel_size", geo.cp),
    ]
    if model.is_moe:
        over.append(("model.expert_model_parallel_size", geo.ep))
        over.append(("model.expert_tensor_parallel_size", 1))
        flex = training.moe_dispatcher in ("deepep", "hybridep")
        over.append(("model.moe_token_dispatcher_type", "flex" if flex else training.moe_dispatcher))
        if flex:
            over.append(("model.moe_flex_dispatcher_backend", training.moe_dispatcher))
        if training.moe_capacity_factor is not None:
            over.append(("model.moe_expert_capacity_factor", training.moe_capacity_factor))
            over.append(("model.moe_pad_expert_input_to_capacity", True))
        over.append(("model.moe_grouped_gemm", True))
    if training.tp_comm_overlap and geo.sp:
        over.append(("comm_overlap.tp_comm_overlap", True))  # needs the recipe's comm_overlap section
    if not training.pp_comm_overlap and geo.pp > 1:
        over.append(("comm_overlap.overlap_p2p_comm", False))  # Bridge overlaps p2p when vpp > 1
    if training.ep_comm_overlap and model.is_moe and geo.ep > 1:
        over.append(("comm_overlap.overlap_moe_expert_parallel_comm", True))
        over.append(("comm_overlap.delay_wgrad_compute", True))
    over += [
        ("model.sequence_parallel", geo.sp),
        ("model.seq_length", geo.seq),
        ("dataset.seq_length", geo.seq),
        ("train.micro_batch_size", geo.mbs),
        ("train.global_batch_size", geo.gbs),
        ("mixed_precision", _NEMO_PRECISION[training.precision]),
        ("model.attention_backend", ATTENTION_BACKEND[training.attention_kernel]),
        ("ddp.use_distributed_optimizer", layout.zero_stage >= 1),
        ("optimizer.use_distributed_optimizer", layout.zero_stage >= 1),
        ("ddp.overlap_grad_reduce", _dp_overlapped(training, geo)),
        ("ddp.overlap_param_gather", _dp_overlapped(training, geo) and layout.zero_stage >= 1),
    ]
    if layout.zero_stage in _MEGATRON_FSDP_STRATEGY:
        over += [
            ("dist.use_megatron_fsdp", True),
            ("ddp.use_megatron_fsdp", True),
            ("ddp.data_parallel_sharding_strategy", _MEGATRON_FSDP_STRATEGY[layout.zero_stage]),
            ("ddp.average_in_collective", False),
            ("model.gradient_accumulation_fusion", False),
            ("checkpoint.ckpt_format", "fsdp_dtensor"),
        ]
    granularity = {"none": None, "moe": "selective", "op": "selective", "core_attn": "selective"}.get(
        layout.recompute, layout.recompute
    )
    full = layout.recompute == "full"
    over += [
        ("model.recompute_granularity", granularity),
        ("model.recompute_method", "uniform" if full else None),
        ("model.recompute_num_layers", 1 if full else None),
        ("model.num_layers_in_first_pipeline_stage", split.first),
        ("model.num_layers_in_last_pipeline_stage", split.last),
    ]
    modules = megatron_recompute_modules(model, layout.recompute) if granularity == "selective" else None
    if modules:
        over.append(("model.recompute_modules", "[" + ",".join(modules) + "]"))
    tokens = [f"{k}={_hydra(v)}" for k, v in over]
    # Hydra needs '|' quoted; the outer double quotes keep the single quotes through a shell.
    layout_value = "null" if split.layout is None else f"'{split.layout}'"
    token = f"model.pipeline_model_parallel_layout={layout_value}"
    tokens.append(token if split.layout is None else f'"{token}"')
    return " ".join(tokens)


# Megatron-Bridge mixed-precision recipes (``mixed_precision.py``); fp8 matches Megatron-LM's
# ``--fp8-format hybrid`` with its default delayed-scaling recipe.
_NEMO_PRECISION = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_delayed_scaling_mixed",
    "fp4": "bf16_with_nvfp4_mixed",
}
