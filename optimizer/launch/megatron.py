"""Megatron-LM command-line arguments for a planned layout (``megatron/training/arguments.py``),
and the Megatron-Core settings Megatron-Bridge shares: the pipeline split, the recompute modules,
the attention backend and the Megatron-FSDP strategy."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch.common import Geometry, dp_overlapped, geometry
from optimizer.specs import ModelSpec, TrainingSpec

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
        "--use-tp-pp-dp-mapping",  # rank order tp-cp-ep-pp-dp (megatron/training/initialize.py)
        "--overlap-grad-reduce",
        "--overlap-param-gather",  # needs --use-distributed-optimizer (validate_args)
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        "--ddp-average-in-collective",
        # _add_moe_args
        "--expert-model-parallel-size",
        "--expert-tensor-parallel-size",  # defaults to --tensor-model-parallel-size (validate_args)
        "--moe-token-dispatcher-type",  # default 'allgather' ('alltoall' recommended with EP)
        "--moe-enable-deepep",  # with dispatcher 'flex': its DeepEP backend (the only one at this version)
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
        # _add_regularization_args (both default 0.1)
        "--hidden-dropout",
        "--attention-dropout",
        # _add_mixed_precision_args
        "--bf16",
        "--fp16",
        "--grad-reduce-in-bf16",  # sets accumulate_allreduce_grads_in_fp32 false (validate_args)
        "--accumulate-allreduce-grads-in-fp32",
        # _add_transformer_engine_args
        "--fp8-format",
        "--fp8-recipe",  # tensorwise | delayed | mxfp8 | blockwise | custom
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

# Megatron-FSDP ``--data-parallel-sharding-strategy`` per ZeRO stage (stages 0 and 1 do not use it).
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
MEGATRON_MOE_RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe")
"""``recompute="moe"``: Megatron-Core selective recompute modules (TransformerConfig.recompute_modules;
'moe' wraps the whole MoE layer forward in a checkpoint, 'layernorm' the input/pre-MLP norms)."""


def launched_dispatcher(dispatcher: str, geo: Geometry) -> str:
    """The dispatcher a plan launches: its own, except that with one expert-parallel rank
    (``ep x etp == 1``: nothing to dispatch, and none costed) DeepEP and HybridEP become the
    all-to-all dispatcher, since the flex dispatcher asserts "Flex token dispatcher requires TPxEP
    > 1" (Megatron-Core ``token_dispatcher.py`` MoEFlexTokenDispatcher at 000c4ac2)."""
    if dispatcher in ("deepep", "hybridep") and geo.ep * geo.etp <= 1:
        return "alltoall"
    return dispatcher


def _megatron_dispatcher_args(dispatcher: str) -> list[str]:
    """Megatron-LM flags for ``training.moe_dispatcher``: the all-to-all or all-gather dispatcher,
    or the flex dispatcher with DeepEP (Megatron-LM runs no HybridEP plan at its profile's version:
    ``frameworks.toml``)."""
    if dispatcher in ("deepep", "hybridep"):
        return ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"]
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


def needs_current_scaling(model: ModelSpec, training: TrainingSpec, recompute: str) -> bool:
    """Whether an fp8 plan's recompute modules rule out fp8 delayed scaling: Megatron-Core's
    TransformerConfig refuses ``layernorm`` and ``moe_act`` recompute with it ("Delayed scaling
    does not support moe_act and layernorm recompute for fp8"), so the launch asks for per-tensor
    current scaling (the ``moe`` recompute's modules include ``layernorm``)."""
    modules = megatron_recompute_modules(model, recompute) or ()
    return training.precision == "fp8" and bool({"layernorm", "moe_act"} & set(modules))


@dataclass(frozen=True)
class Split:
    """How the planned pipeline split is expressed to Megatron."""

    uniform: bool
    first: int | None = None
    last: int | None = None
    layout: str | None = None
    """Megatron ``--pipeline-model-parallel-layout`` string, when first/last cannot express it."""


def megatron_split(geo: Geometry) -> Split:
    """Express the chunk split with Megatron's uneven-pipeline settings.

    ``--decoder-first/last-pipeline-num-layers`` give the layers on pipeline rank 0 / pp-1
    (spread evenly over that rank's virtual chunks); the other ranks share the rest evenly. A
    split they cannot express, or with a chunk holding only the embedding or only the loss, is
    given exactly by ``--pipeline-model-parallel-layout``.
    """
    chunks, pp = geo.chunks, geo.pp
    if pp == 1 or len(set(chunks)) == 1:
        return Split(uniform=True)
    if min(chunks) == 0:  # an embedding-only first or loss-only last chunk
        return Split(uniform=False, layout=_megatron_layout_string(chunks))
    first = [c for i, c in enumerate(chunks) if i % pp == 0]
    last = [c for i, c in enumerate(chunks) if i % pp == pp - 1]
    middle = [c for i, c in enumerate(chunks) if 0 < i % pp < pp - 1]
    if len(set(first)) == 1 and len(set(last)) == 1 and len(set(middle)) <= 1:
        return Split(uniform=False, first=sum(first), last=sum(last))
    return Split(uniform=False, layout=_megatron_layout_string(chunks))


def _megatron_layout_string(chunks: tuple[int, ...]) -> str:
    """``E``/``L`` mark embedding and loss, ``t*n`` n decoder layers, ``|`` separates chunks."""
    stages = []
    for i, n in enumerate(chunks):
        body = "t" if n == 1 else (f"t*{n}" if n > 1 else "")
        prefix = "E" if i == 0 else ""
        suffix = "L" if i == len(chunks) - 1 else ""
        stages.append(prefix + body + suffix)
    return "|".join(stages)


def megatron_args(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout, geo: Geometry, split: Split) -> str:
    """Megatron-LM command-line arguments for the layout (the settings it decides)."""
    args: list[str] = [
        "--tensor-model-parallel-size", str(geo.tp),
        "--pipeline-model-parallel-size", str(geo.pp),
        "--context-parallel-size", str(geo.cp),
    ]  # fmt: skip
    if model.is_moe:
        args += _megatron_moe_args(training, geo)
    if geo.pp > 1:
        args += _megatron_pipeline_args(training, geo, split)
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
    if dp_overlapped(training, geo, layout.zero_stage):
        # Megatron issues data-parallel collectives after backward unless asked (both default off)
        args.append("--overlap-grad-reduce")
        if layout.zero_stage >= 1:
            args.append("--overlap-param-gather")
    if layout.zero_stage in MEGATRON_FSDP_STRATEGY:
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[layout.zero_stage],
            "--no-gradient-accumulation-fusion",
            "--ckpt-format", "fsdp_dtensor",
        ]  # fmt: skip
        if bf16_gradients(training):
            # Megatron-FSDP at 000c4ac2 scales bf16 gradients' accumulated shard instead of the
            # reduced bucket (param_and_grad_buffer.py gradient_reduce_preprocessing); averaging in
            # the collective skips that scaling (MoE models run ZeRO-2/3 with fp32 gradients only)
            args.append("--ddp-average-in-collective")
    args += _megatron_recompute_args(model, layout)
    args += [f"--{flag.replace('_', '-')} {value}" for flag, value in costed_dropout(model)]
    args += ["--attention-backend", ATTENTION_BACKEND[training.attention_kernel]]
    args += _megatron_precision_args(training, needs_current_scaling(model, training, layout.recompute))
    return " ".join(args)


def costed_dropout(model: ModelSpec) -> list[tuple[str, float]]:
    """``model.dropout`` as Megatron-Core names it (both default 0.1 in Megatron-LM and
    TransformerConfig, which the plan's memory would not hold: the residual dropout's 1-byte
    masks are costed only with ``model.dropout`` above 0)."""
    return [("hidden_dropout", model.dropout), ("attention_dropout", model.dropout)]


def _megatron_moe_args(training: TrainingSpec, geo: Geometry) -> list[str]:
    """Expert parallelism, the dispatcher and the expert GEMMs of an MoE model."""
    args: list[str] = []
    # The plan's expert tensor parallelism, always explicit: unset, Megatron splits experts over
    # the tensor-parallel size (--expert-tensor-parallel-size defaults to tp).
    args += ["--expert-model-parallel-size", str(geo.ep), "--expert-tensor-parallel-size", str(geo.etp)]
    # the plan's dispatcher (training.moe_dispatcher) and one grouped GEMM per layer; Megatron
    # defaults to an all-gather dispatcher and a loop of per-expert GEMMs
    args += [*_megatron_dispatcher_args(launched_dispatcher(training.moe_dispatcher, geo)), "--moe-grouped-gemm"]
    if training.moe_capacity_factor is not None:  # experts padded to capacity, as costed
        args += ["--moe-expert-capacity-factor", f"{training.moe_capacity_factor:g}",
                 "--moe-pad-expert-input-to-capacity"]  # fmt: skip
    if training.ep_comm_overlap and geo.ep > 1:
        # combined 1F1B schedule: one micro-batch's all-to-all under another's compute
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return args


def _megatron_pipeline_args(training: TrainingSpec, geo: Geometry, split: Split) -> list[str]:
    """The pipeline split, interleaving and p2p overlap of a plan with ``pp > 1``."""
    args: list[str] = []
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
    return args


def _megatron_recompute_args(model: ModelSpec, layout: ResolvedLayout) -> list[str]:
    args: list[str] = []
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
    return args


def bf16_gradients(training: TrainingSpec) -> bool:
    """The launch reduces gradients in bf16 (``--bf16 --grad-reduce-in-bf16``)."""
    return training.precision != "fp16" and not training.grad_reduce_in_fp32


def _megatron_precision_args(training: TrainingSpec, current_scaling: bool = False) -> list[str]:
    args: list[str] = []
    if training.precision == "fp16":
        args.append("--fp16")
        if training.grad_reduce_in_fp32:  # fp16 keeps fp16 gradients by default
            args.append("--accumulate-allreduce-grads-in-fp32")
    else:
        args.append("--bf16")
        if not training.grad_reduce_in_fp32:  # --bf16 keeps fp32 gradients by default
            args.append("--grad-reduce-in-bf16")
        if training.precision == "fp8":
            args += ["--fp8-format", "hybrid"] + (["--fp8-recipe", "tensorwise"] if current_scaling else [])
        elif training.precision == "fp4":
            args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    return args


def delayed_wgrad_te_note(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout) -> list[str]:
    """A Megatron-LM plan that overlaps the expert all-to-all (``--delay-wgrad-compute``) and the
    data-parallel gradient reduction: Megatron-LM asserts Transformer Engine 2.8 for the pair."""
    geo = geometry(training, layout, model.is_moe)
    if not (
        model.is_moe and training.ep_comm_overlap and geo.ep > 1 and dp_overlapped(training, geo, layout.zero_stage)
    ):
        return []
    return [
        "Megatron-LM: --delay-wgrad-compute with --overlap-grad-reduce needs Transformer Engine 2.8 or later "
        "(megatron/training/arguments.py asserts it)"
    ]
