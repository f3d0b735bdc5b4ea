"""The training spec: sequence length, batch, precision, framework and the stack's knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from optimizer.frameworks import stack_defaults
from optimizer.specs.common import Framework, Precision, check_derived_bounds
from optimizer.strict_model import Strict


class TrainingSpec(Strict):
    """What one optimizer step processes."""

    seq_len: int = Field(ge=1, le=4_194_304, description="Sequence length (tokens).")
    global_batch_size: int | None = Field(
        default=None, ge=1, le=1 << 24, description="Sequences per step (or global_batch_tokens)."
    )
    global_batch_tokens: int | None = Field(
        default=None, ge=1, le=1 << 40, description="Tokens per step, a multiple of seq_len (or global_batch_size)."
    )
    precision: Precision = Field(
        default="bf16", description="GEMM precision; everything else runs in bf16 (fp16 with fp16)."
    )
    framework: Framework | None = Field(
        default=None,
        description=(
            "The training framework the plans are for (docs/frameworks.md): the search then covers exactly "
            "the layouts it runs, costed with its recompute modes and its stack defaults for every training.* "
            "knob the job leaves out. null: every plan runs unchanged on at least one framework (plan.frameworks)."
        ),
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description=(
            "The stack overlaps tensor-parallel collectives with GEMMs (Megatron --tp-comm-overlap, "
            "torchtitan async TP): needs sequence parallelism and a TP group inside one NVLink domain."
        ),
    )
    tp_dgrad_overlap: bool = Field(
        default=True,
        description=(
            "The stack's tensor-parallel linears run their backward as Megatron-Core's do: the "
            "column-parallel input-gradient all-reduce (with sequence parallelism, reduce-scatter) "
            "under the weight-gradient GEMM and, with sequence parallelism, a re-gather of the input "
            "(only the shard is kept from forward) under the input-gradient GEMM. False: PyTorch "
            "DTensor TP (torchtitan), every backward collective blocking and the gathered input kept."
        ),
    )
    fused_kernels: bool = Field(
        default=True,
        description=(
            "The stack fuses norms, activation functions, rotary embeddings and residual adds into "
            "few kernels (Megatron / Transformer Engine, torch.compile in torchtitan). False: eager "
            "PyTorch, one kernel and one HBM round trip per elementwise op."
        ),
    )
    attention_kernel: Literal["unfused", "flash2", "flash3"] = Field(
        default="flash3",
        description=(
            "Attention kernel generation the stack runs. flash3: kernels written for Hopper and later "
            "(FlashAttention-3, cuDNN fused attention in Transformer Engine 2.x, PyTorch SDPA's cuDNN "
            "backend); flash2: FlashAttention-2-class kernels (PyTorch SDPA flash backend, ring attention "
            "in PyTorch context parallel of 2024); unfused: the s x s scores are materialised in memory "
            "(batched GEMMs, softmax and attention dropout as separate kernels: stacks before "
            "FlashAttention, Megatron --attention-backend unfused); no context parallelism. GPUs before "
            "Hopper run flash2-class kernels when flash3 is asked for; left out, the default there is flash2."
        ),
    )
    pp_comm_overlap: bool = Field(
        default=True,
        description=(
            "The stack overlaps pipeline send/recv with compute (Megatron-Core's interleaved schedule "
            "by default, torchtitan's pipelining). False: blocking sends (DeepSpeed's pipeline engine, "
            "Megatron --no-overlap-p2p-communication), every transfer on the critical path."
        ),
    )
    ep_comm_overlap: bool = Field(
        default=False,
        description=(
            "The stack overlaps one micro-batch's expert all-to-all with another micro-batch's "
            "compute (Megatron --overlap-moe-expert-parallel-comm, DualPipe-style batch-level "
            "overlap); MoE models with expert parallelism only, no effect otherwise."
        ),
    )
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] = Field(
        default="alltoall",
        description=(
            "MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type): 'alltoall' (every "
            "routed copy through one NCCL all-to-all on the compute stream), 'allgather' (gather "
            "the expert-parallel group's tokens, reduce-scatter back), 'deepep' (flex dispatcher "
            "with DeepEP: one copy per destination rank and per remote node, bf16 rows in FP8 runs "
            "too), 'hybridep' (the flex "
            "dispatcher's NVL72 backend, costed as DeepEP). MoE models with expert parallelism only."
        ),
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        ge=1,
        le=16,
        description=(
            "Expert capacity factor with padding (Megatron --moe-expert-capacity-factor with "
            "--moe-pad-expert-input-to-capacity): each expert processes this many times its mean "
            "share of routed tokens, dropping the rest. At least 1: below it every expert drops "
            "tokens even when routing is balanced, which the model FLOPs (and MFU) would still count. "
            "Null (default): dropless. MoE models only."
        ),
    )
    expert_gemm_host_splits: bool = Field(
        default=True,
        description=(
            "The stack reads each local expert's token count back to the host and issues one GEMM "
            "per expert (Megatron-Core with Transformer Engine's grouped GEMM, whose splits are a "
            "host list): small expert GEMMs are then host bound (calibration expert_gemm_host_s per "
            "GEMM). False: the expert GEMMs run without the host in the loop (one device-side "
            "grouped GEMM such as torchtitan's torch._grouped_mm, Transformer Engine's "
            "device-initiated grouped GEMM, CUDA graphs over the experts). MoE models only."
        ),
    )
    fp8_saved_inputs: bool = Field(
        default=True,
        description=(
            "With fp8 or fp4 GEMMs, the stack keeps each GEMM's quantized input for backward, 1 byte an "
            "element instead of 2 (Transformer Engine's Linear, LayerNormLinear and GroupedLinear: the "
            "norm outputs, the activation-function output and the routed experts' inputs). False: the "
            "16-bit inputs are kept and re-quantized in backward (torchao's Float8Linear in torchtitan). "
            "Ignored with bf16 or fp16 GEMMs."
        ),
    )
    kv_expanded: bool | None = Field(
        default=None,
        description=(
            "The stack's attention takes keys and values expanded to the query heads (torchtitan's "
            "repeat_kv before scaled_dot_product_attention), so with grouped-query attention the "
            "expanded copies are what is kept for backward: query-wide instead of the key/value "
            "heads' width, in eager and compiled runs alike. False: kernels that read the key/value "
            "heads (Megatron-Core, Transformer Engine). Default null: the named framework's; with none "
            "named, expanded when torchtitan's stack runs the job (the larger memory). Ignored without "
            "grouped-query attention."
        ),
    )
    fsdp_buffers: Literal["megatron-fsdp", "fsdp2", "layer"] | None = Field(
        default=None,
        description=(
            "Buffers the stack's ZeRO-2/3 holds beside the shards. megatron-fsdp (Megatron-FSDP, "
            "Megatron-LM and Megatron-Bridge): a reduce-scatter queue of up to max(1e9, 2 layers) "
            "unsharded gradient elements, a parameter prefetch of half that, and the embedding and "
            "output layer kept gathered all step. fsdp2 (torchtitan): ZeRO-3 gathers two layers whole "
            "and reduces a layer's 16-bit gradients through a reduce-dtype copy (ZeRO-2: the copy only), "
            "and keeps the output layer gathered across the loss. layer (DeepSpeed): ZeRO-2 two gradient "
            "buckets, ZeRO-3 two gathered layers (the current and the prefetched). Null: the named framework's; with none named, the larger of "
            "those the frameworks whose stack runs the job hold (megatron-fsdp when a Megatron "
            "framework is among them, else fsdp2 when torchtitan is), so plans fit on every framework they list. Ignored below ZeRO-2."
        ),
    )
    dp_comm_overlap: bool = Field(
        default=True,
        description=(
            "The stack overlaps data-parallel collectives with compute: gradient buckets reduced "
            "during backward, the parameter all-gather with the next forward, ZeRO-3 / FSDP "
            "gathering the next layer's weights while the current one computes (Megatron "
            "--overlap-grad-reduce --overlap-param-gather, FSDP2's prefetch, DeepSpeed overlap_comm "
            "with a stage3_prefetch_bucket_size of at least one layer). False: every data-parallel "
            "collective blocks compute, except ZeRO-3's gradient reduce-scatters, which still run "
            "under backward: ZeRO-3 then gathers each layer's weights on demand (DeepSpeed's default "
            "prefetch bucket of 5e7 elements is under 3% of one GPT-3 175B layer; its overlap_comm "
            "is on by default at stage 3; Megatron --overlap-grad-reduce without "
            "--overlap-param-gather)."
        ),
    )
    grad_reduce_in_fp32: bool = Field(
        default=False,
        description=(
            "The stack keeps and reduces gradients in fp32, 4 bytes each (Megatron-Core's "
            "grad_reduce_in_fp32: Megatron-LM's default with --bf16 and Megatron-Bridge's bf16 "
            "recipes; torchtitan's mixed_precision_reduce float32), instead of the 16-bit training "
            "dtype, 2 bytes each (the 16 bytes per parameter of mixed-precision Adam; Megatron-LM "
            "--grad-reduce-in-bf16). True doubles the gradient memory and the bytes of every "
            "gradient reduction."
        ),
    )
    cross_entropy: Literal["fused", "unfused"] = Field(
        default="fused",
        description=(
            "How the stack computes the loss over the vocabulary. fused: Megatron-Core's "
            "vocab-parallel cross-entropy, one fp32 softmax buffer reused for the gradient next to "
            "the bf16 logits (6 bytes per logit); unfused: PyTorch's cross_entropy on logits cast "
            "to fp32 (torchtitan), whose fp32 log-probabilities are kept for backward and meet "
            "their fp32 gradient and the logits' there (12 bytes per logit at the peak; 16 with TP, "
            "where it runs as PyTorch's loss_parallel on vocabulary-sharded logits)."
        ),
    )
    dp_collectives: Literal["hierarchical", "flat"] = Field(
        default="hierarchical",
        description=(
            "How the stack's data-parallel collectives (gradient all-reduce or reduce-scatter, "
            "ZeRO / FSDP parameter all-gathers) use the network tiers. hierarchical: NCCL-style, the "
            "GPUs of an NVLink domain share the scale-out traffic (the domain reduces first). flat: "
            "one ring over every rank with each hop at the slowest tier's rate and latency, so a group "
            "spanning nodes loads every GPU's NIC with the whole ring's traffic (DeepSpeed ZeRO-3 of "
            "2021: at a fixed batch its step time does not fall as GPUs are added)."
        ),
    )

    total_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10**16,
        description=(
            "Token budget of the whole run: plans then carry time_to_train (days, GPU-hours, cost, energy). "
            "Or give total_steps."
        ),
    )
    total_steps: int | None = Field(
        default=None,
        ge=1,
        le=10**10,
        description="Optimizer steps of the whole run (total_tokens = steps x batch tokens).",
    )

    @field_validator("total_tokens", "global_batch_tokens", mode="before")
    @classmethod
    def _whole_float(cls, value: object) -> object:
        """Token counts are written as 1e12 or 15e12: a float with no fractional part is that integer."""
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @model_validator(mode="after")
    def _framework_stack(self) -> TrainingSpec:
        """The named framework's stack defaults for the knobs the job leaves out (explicit knobs
        win). Written past ``__setattr__`` so that ``model_fields_set`` still lists only what the
        job gave."""
        if self.framework is not None:
            for knob, value in stack_defaults(self.framework).items():
                if knob not in self.model_fields_set:
                    self.__dict__[knob] = value
        return self

    @model_validator(mode="after")
    def _batch(self) -> TrainingSpec:
        if self.global_batch_size is None and self.global_batch_tokens is None:
            raise ValueError("give global_batch_size (sequences) or global_batch_tokens")
        if self.global_batch_tokens is not None:
            if self.global_batch_tokens % self.seq_len:
                raise ValueError(
                    f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of seq_len ({self.seq_len})"
                )
            gbs = self.global_batch_tokens // self.seq_len
            if self.global_batch_size is not None and self.global_batch_size != gbs:
                raise ValueError(
                    f"global_batch_size ({self.global_batch_size}) disagrees with global_batch_tokens / seq_len ({gbs})"
                )
            self.global_batch_size = gbs
        self.global_batch_tokens = self.global_batch_size * self.seq_len  # type: ignore[operator]
        if self.total_steps is not None:
            steps_tokens = self.total_steps * self.global_batch_tokens
            if self.total_tokens is not None and self.total_tokens != steps_tokens:
                raise ValueError(
                    f"total_tokens ({self.total_tokens}) disagrees with total_steps x global_batch_tokens ({steps_tokens})"
                )
            self.total_tokens = steps_tokens
        check_derived_bounds(self, ("global_batch_size", "global_batch_tokens"), "the batch and seq_len")
        check_derived_bounds(self, ("total_tokens",), "total_steps x global_batch_tokens")
        return self
