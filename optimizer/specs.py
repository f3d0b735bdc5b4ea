"""Job specs and layouts as the HTTP contract defines them (request side).

A request names presets or gives explicit fields; validation resolves presets, applies the
explicit overrides and checks every cross-field rule, so that an invalid request fails with a
message that names the field and the reason (HTTP 422) before any planning work starts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from optimizer.errors import UnknownCatalogId
from optimizer.strict_model import Strict
from optimizer.topology_spec import ClusterTopology

Precision = Literal["bf16", "fp16", "fp8", "fp4"]
"""GEMM precision; everything else runs in bf16 (fp16 for ``fp16``). ``fp8``: FP8 GEMMs
(Transformer Engine hybrid / torchao float8); ``fp4``: block-scaled FP4 GEMMs (NVFP4) on GPUs with
FP4 tensor cores."""
Recompute = Literal["none", "selective", "op", "moe", "full", "core_attn"]
"""Activation recompute. ``selective``: the attention core (Megatron), norms and activation
functions, and on MLA models the up-projections (the latents are kept). ``op``: torchtitan's
op-level selective checkpointing: keeps the attention output, the expert all-to-all output and
every second matmul output; re-runs the other matmuls, the elementwise ops and the tensor-parallel
all-gathers / all-reduces in backward (searched only when ``search.allow`` or ``search.fix`` names
it). ``moe``: ``selective`` plus the whole MoE block
(router, dispatch, experts, combine), recomputed from its input (MoE models only). ``full``: every
layer from its input. ``core_attn``: Megatron-Core's selective recompute (its default module
``core_attn``, plus ``mla_up_proj`` on MLA models): the attention core only, norm and activation
outputs kept (what Megatron-LM and Megatron-Bridge run as ``selective``). With
``training.framework`` named, ``recompute`` takes that framework's own names instead
(docs/frameworks.md)."""
Framework = Literal["megatron-lm", "megatron-bridge", "torchtitan", "deepspeed"]
Activation = Literal["swiglu", "gelu"]
AXES: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
"""Parallel axes that own process groups, in the canonical (innermost-first) rank order."""

MAX_NUM_GPUS = 1_048_576
MAX_LAYERS = 1_024
MAX_HIDDEN = 131_072


MAX_ALLOW_VALUES = 256
"""Most candidate values one ``search.allow`` list may hold (720,720 GPUs have 240 divisors)."""


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be one of 0, 1, 2 or 3, not a boolean")
    return value


ZeroStage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(_not_bool)]
"""ZeRO stage; ``Literal`` alone would take ``true`` for 1."""


class MLAConfig(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: int | None = Field(
        default=None, ge=1, le=MAX_HIDDEN, description="Compressed query latent rank; null: no query compression."
    )
    kv_lora_rank: int = Field(ge=1, le=MAX_HIDDEN, description="Rank of the compressed key/value latent (elements).")
    qk_nope_head_dim: int = Field(ge=1, le=4096, description="Per-head query/key dimension without rotary embedding.")
    qk_rope_head_dim: int = Field(ge=0, le=4096, description="Per-head query/key dimension with rotary embedding.")
    v_head_dim: int = Field(ge=1, le=4096, description="Per-head value dimension.")


class MoEConfig(Strict):
    """Mixture of experts; every ``layer_frequency``-th layer after ``first_dense_layers`` is MoE."""

    num_experts: int = Field(ge=1, le=16_384, description="Routed experts per MoE layer.")
    top_k: int = Field(ge=1, le=1_024, description="Routed experts each token goes to.")
    expert_ffn_hidden_size: int = Field(ge=1, le=MAX_HIDDEN * 4, description="FFN hidden size of one expert.")
    num_shared_experts: int = Field(default=0, ge=0, le=64, description="Experts every token goes to.")
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HIDDEN * 4,
        description="FFN hidden size of a shared expert; default: expert_ffn_hidden_size.",
    )
    layer_frequency: int = Field(
        default=1, ge=1, le=MAX_LAYERS, description="Every n-th layer after first_dense_layers is MoE (1: all of them)."
    )
    first_dense_layers: int = Field(default=0, ge=0, le=MAX_LAYERS, description="Leading dense (non-MoE) layers.")

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        return self


MODEL_FIELDS = (
    "name",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "activation",
    "tied_embeddings",
    "mla",
    "moe",
    "sliding_window",
    "sliding_window_every",
)


class ModelSpec(Strict):
    """A model: a preset id, or a full architecture; explicit fields override the preset.

    After validation every field is filled (preset values, then explicit overrides, then defaults).
    """

    preset: str | None = Field(default=None, max_length=200, description="Model preset id (GET /models).")
    name: str | None = Field(
        default=None, max_length=200, description="Display name; default: the preset id or 'custom'."
    )
    num_layers: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="Transformer layers.")
    hidden_size: int | None = Field(default=None, ge=1, le=MAX_HIDDEN, description="Model (embedding) dimension.")
    ffn_hidden_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HIDDEN * 8,
        description="Dense FFN hidden size; default: 4h (gelu), 8h/3 up to a multiple of 256 (swiglu).",
    )
    num_attention_heads: int | None = Field(default=None, ge=1, le=4096, description="Query heads.")
    num_kv_heads: int | None = Field(
        default=None, ge=1, le=4096, description="Key/value heads; default: num_attention_heads."
    )
    head_dim: int | None = Field(
        default=None, ge=1, le=4096, description="Head dimension; default: hidden_size / heads."
    )
    vocab_size: int | None = Field(default=None, ge=1, le=4_000_000, description="Vocabulary size (tokens).")
    activation: Activation | None = Field(default=None, description="FFN activation; default: swiglu.")
    tied_embeddings: bool | None = Field(
        default=None, description="Input embedding and output layer share weights; default: false."
    )
    mla: MLAConfig | None = Field(default=None, description="Multi-head latent attention; null: standard attention.")
    moe: MoEConfig | None = Field(default=None, description="Mixture of experts; null: a dense model.")
    sliding_window: int | None = Field(
        default=None,
        ge=1,
        le=4_194_304,
        description="Sliding-window attention: keys each query attends to on windowed layers (null: full causal).",
    )
    sliding_window_every: int = Field(
        default=1,
        ge=1,
        le=MAX_LAYERS,
        description="Every n-th layer from the first is windowed, the others full (gpt-oss: 2). Needs sliding_window.",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        from optimizer.presets import load_model_presets

        presets = load_model_presets()
        preset_id = data["preset"]
        if not isinstance(preset_id, str):
            raise ValueError(f"preset must be a string (a model preset id), not {type(preset_id).__name__}")
        if preset_id not in presets:
            raise ValueError(str(UnknownCatalogId("model preset", preset_id[:100], list(presets))))
        base = presets[preset_id].architecture()
        # null leaves a nullable field to the preset; on any other field it is refused as it is without one
        given = {k: v for k, v in data.items() if v is not None or not cls._nullable(k)}
        merged = {**base, **given}
        for key in ("mla", "moe"):  # nested blocks merge field by field
            if isinstance(base.get(key), dict) and isinstance(data.get(key), dict):
                merged[key] = {**base[key], **data[key]}
        return merged

    @classmethod
    def _nullable(cls, name: str) -> bool:
        field = cls.model_fields.get(name)
        return field is not None and field.default is None

    @model_validator(mode="after")
    def _complete_and_check(self) -> ModelSpec:
        required = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
        missing = [f for f in required if getattr(self, f) is None]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (give them or a preset)")
        assert self.num_layers and self.hidden_size and self.num_attention_heads  # for type checkers
        if self.name is None:
            self.name = self.preset or "custom"
        if self.activation is None:
            self.activation = "swiglu"
        if self.tied_embeddings is None:
            self.tied_embeddings = False
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                    f"({self.num_attention_heads}); give head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.ffn_hidden_size is None:
            if self.moe is not None and self.moe.first_dense_layers == 0 and self.moe.layer_frequency == 1:
                self.ffn_hidden_size = self.moe.expert_ffn_hidden_size
            else:
                self.ffn_hidden_size = (
                    4 * self.hidden_size if self.activation == "gelu" else (_swiglu_default_ffn(self.hidden_size))
                )
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_dense_layers ({self.moe.first_dense_layers}) exceeds num_layers ({self.num_layers})"
            )
        return self

    def architecture(self) -> dict[str, Any]:
        """The architecture fields (no preset id) as a plain dict."""
        return {f: getattr(self, f) for f in MODEL_FIELDS}

    # Convenience accessors used by the cost model (the validator guarantees these are set).
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether 0-based layer ``layer_index`` is an MoE layer (Megatron / DeepSeek convention)."""
        moe = self.moe
        if moe is None or layer_index < moe.first_dense_layers:
            return False
        return (layer_index - moe.first_dense_layers) % moe.layer_frequency == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers or 0))

    @property
    def mixes_layer_kinds(self) -> bool:
        """Whether some layers are MoE and others dense (DeepSeek's first dense layers, an MoE
        layer frequency above 1): the only way this spec's layers differ from one another."""
        return self.moe is not None and 0 < self.num_moe_layers < (self.num_layers or 0)

    @property
    def alternates_layer_kinds(self) -> bool:
        """Whether MoE and dense layers alternate (an MoE layer frequency above 1, with some layers
        of each kind), so that the mix of kinds a run of consecutive layers holds depends on
        where it starts past the first dense layers."""
        return self.mixes_layer_kinds and self.moe is not None and self.moe.layer_frequency > 1


def _swiglu_default_ffn(hidden: int) -> int:
    """Llama rule: 2/3 * 4h rounded up to a multiple of 256."""
    raw = int(8 * hidden / 3)
    return (raw + 255) // 256 * 256


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
            "Hopper run flash2-class kernels when flash3 is asked for."
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
            "with DeepEP: one copy per destination rank and per remote node, FP8 dispatch in FP8 "
            "runs, partly overlapped with the same micro-batch's compute), 'hybridep' (the flex "
            "dispatcher's NVL72 backend, costed as DeepEP). MoE models with expert parallelism only."
        ),
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        le=16,
        description=(
            "Expert capacity factor with padding (Megatron --moe-expert-capacity-factor with "
            "--moe-pad-expert-input-to-capacity): each expert processes this many times its mean "
            "share of routed tokens, dropping the rest. Null (default): dropless. MoE models only."
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
    dp_comm_overlap: bool = Field(
        default=True,
        description=(
            "The stack overlaps data-parallel collectives with compute: gradient buckets reduced "
            "during backward, the parameter all-gather with the next forward, ZeRO-3 / FSDP "
            "gathering the next layer's weights while the current one computes (Megatron "
            "--overlap-grad-reduce --overlap-param-gather, FSDP2's prefetch, DeepSpeed overlap_comm "
            "with a stage3_prefetch_bucket_size of at least one layer). False: every data-parallel "
            "collective blocks compute (DeepSpeed ZeRO-3 with its default prefetch bucket of 5e7 "
            "elements, under 3% of one GPT-3 175B layer, gathers each module's weights on demand)."
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
            "their fp32 gradient and the logits' there (12 bytes per logit at the peak)."
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

    @model_validator(mode="after")
    def _framework_stack(self) -> TrainingSpec:
        """The named framework's stack defaults for the knobs the job leaves out (explicit knobs
        win). Written past ``__setattr__`` so that ``model_fields_set`` still lists only what the
        job gave."""
        if self.framework is not None:
            from optimizer.frameworks import stack_defaults

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
        return self


class ClusterSpec(Strict):
    """A cluster: a preset id plus ``num_gpus``, or explicit fields (which override the preset)."""

    preset: str | None = Field(default=None, max_length=200, description="Cluster preset id (GET /clusters).")
    num_gpus: int | None = Field(
        default=None, ge=1, le=MAX_NUM_GPUS, description="GPUs the job takes; with topology, omit to let /plan choose"
    )
    gpu: str | None = Field(default=None, max_length=200, description="GPU id (GET /gpus).")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="GPUs per server; default: the preset's, else 8."
    )
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GPUs joined by NVLink (scale-up domain); default: the preset's or the GPU's.",
    )
    network: str | None = Field(default=None, max_length=200, description="Scale-out fabric id (GET /networks).")
    nics_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="Scale-out NICs per server; default: one per GPU."
    )
    leaf_span_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NUM_GPUS,
        description="GPUs under one leaf/rail group; default: the preset's, else 32 nodes.",
    )
    spine_oversubscription: float | None = Field(
        default=None,
        ge=1.0,
        le=64.0,
        description="Spine tier oversubscription (ratio, 1 = non-blocking); default: the preset's, else 1.",
    )
    gpu_power_limit_w: float | None = Field(
        default=None, ge=50, le=5000, description="Power cap per GPU (W); below the TDP it lowers sustained clocks"
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="Override the GPU's usable memory (e.g. a 94/96 GB part); default: catalog",
    )
    topology: ClusterTopology | None = Field(
        default=None, description="Free nodes and their labels: plan onto them (docs/scheduler.md)"
    )

    @property
    def resolved_num_gpus(self) -> int:
        """``num_gpus`` of a job being costed: given, or chosen from ``topology`` before costing."""
        assert self.num_gpus is not None, "cluster.num_gpus is set before a job is costed"
        return self.num_gpus

    @model_validator(mode="after")
    def _resolve(self) -> ClusterSpec:
        from hardware_catalog import load_catalog

        cat = load_catalog()
        if self.preset is not None:
            if self.preset not in cat.clusters:
                raise ValueError(str(UnknownCatalogId("cluster preset", self.preset, list(cat.clusters))))
            c = cat.clusters[self.preset]
            self.gpu = self.gpu or c.gpu
            self.gpus_per_node = self.gpus_per_node or c.gpus_per_node
            self.nvlink_domain_size = self.nvlink_domain_size or c.nvlink_domain_size
            self.network = self.network or c.network
            self.nics_per_node = self.nics_per_node or c.nics_per_node
            leaf = next((t for t in c.tiers if t.name == "leaf"), None)
            spine = c.tiers[-1]
            if self.leaf_span_gpus is None and leaf is not None:
                self.leaf_span_gpus = leaf.span_gpus
            if self.spine_oversubscription is None:
                self.spine_oversubscription = spine.oversubscription
        if self.gpu is None:
            raise ValueError("give a cluster preset or a gpu id")
        if self.gpu not in cat.gpus:
            raise ValueError(str(UnknownCatalogId("gpu", self.gpu, list(cat.gpus))))
        gpu = cat.gpus[self.gpu]
        if self.network is None:
            self.network = "ib-ndr-400"
        if self.network not in cat.networks:
            raise ValueError(str(UnknownCatalogId("network", self.network, list(cat.networks))))
        self.gpus_per_node = self.gpus_per_node or min(8, gpu.default_nvlink_domain_size)
        self.nvlink_domain_size = self.nvlink_domain_size or gpu.default_nvlink_domain_size
        self.nics_per_node = self.nics_per_node or self.gpus_per_node
        if self.nvlink_domain_size % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain_size:
            raise ValueError(
                f"nvlink_domain_size ({self.nvlink_domain_size}) and gpus_per_node ({self.gpus_per_node}) "
                "must divide one another"
            )
        if self.spine_oversubscription is None:
            self.spine_oversubscription = 1.0
        if self.leaf_span_gpus is None:
            self.leaf_span_gpus = 32 * max(self.gpus_per_node, 8)
        self.leaf_span_gpus = max(self.leaf_span_gpus, self.nvlink_domain_size)
        if self.num_gpus is None and self.topology is None:
            raise ValueError("num_gpus: required unless cluster.topology is given")
        if self.topology is not None:
            over = next((n for n in self.topology.nodes if n.free_gpus > self.gpus_per_node), None)
            if over is not None:
                raise ValueError(
                    f"topology.nodes: node {over.name!r} has {over.free_gpus} free GPUs, more than gpus_per_node "
                    f"({self.gpus_per_node})"
                )
        return self


class PlacementSpec(Strict):
    """For each parallel axis, the outermost network tier its process groups span."""

    tp: str | None = Field(default=None, description="Outermost network tier the tensor-parallel groups span.")
    cp: str | None = Field(default=None, description="Outermost network tier the context-parallel groups span.")
    ep: str | None = Field(default=None, description="Outermost network tier the expert-parallel groups span.")
    dp: str | None = Field(default=None, description="Outermost network tier the data-parallel groups span.")
    pp: str | None = Field(default=None, description="Outermost network tier the pipeline groups span.")


class Layout(Strict):
    """A parallel layout (``config`` in requests and plans)."""

    tp: int = Field(default=1, ge=1, le=MAX_NUM_GPUS, description="Tensor-parallel size (GPUs).")
    pp: int = Field(default=1, ge=1, le=MAX_LAYERS, description="Pipeline stages.")
    dp: int | None = Field(
        default=None, ge=1, le=MAX_NUM_GPUS, description="Data-parallel size; derived: num_gpus / (tp*pp*cp)."
    )
    cp: int = Field(default=1, ge=1, le=MAX_NUM_GPUS, description="Context-parallel size (sequence split, GPUs).")
    ep: int = Field(
        default=1,
        ge=1,
        le=MAX_NUM_GPUS,
        description="Expert-parallel size (expert TP = 1): must divide tp*dp*cp and num_experts.",
    )
    vpp: int = Field(
        default=1, ge=1, le=MAX_LAYERS, description="Virtual pipeline chunks per stage (interleaving; 1: none)."
    )
    micro_batch_size: int = Field(default=1, ge=1, le=1 << 16, description="Sequences per micro-batch.")
    zero_stage: ZeroStage = Field(
        default=1, description="ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + weights sharded over dp."
    )
    recompute: Recompute = Field(
        default="selective",
        description="Activation recompute mode (docs/cost-model.md; framework names with training.framework).",
    )
    sequence_parallel: bool | None = Field(
        default=None, description="Sequence parallelism for the TP group; default: tp > 1."
    )
    num_micro_batches: int | None = Field(
        default=None, ge=1, description="Micro-batches per step; derived: gbs / (dp * micro_batch_size)."
    )
    stage_layers: list[int] | None = Field(
        default=None,
        description=(
            "Layers per pipeline chunk in schedule order (pp*vpp entries, each at least 1; the first "
            "and last may be 0: an embedding-only or loss-only chunk); null = as even as possible."
        ),
    )
    placement: PlacementSpec | None = Field(
        default=None, description="/evaluate: the tier each axis spans; null: derived from the rank order."
    )

    @model_validator(mode="after")
    def _defaults(self) -> Layout:
        if self.sequence_parallel is None:
            self.sequence_parallel = self.tp > 1
        return self


class LayoutFix(Strict):
    """Layout fields to pin during search."""

    tp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the tensor-parallel size.")
    pp: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="Pin the pipeline stages.")
    dp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the data-parallel size.")
    cp: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the context-parallel size.")
    ep: int | None = Field(default=None, ge=1, le=MAX_NUM_GPUS, description="Pin the expert-parallel size.")
    vpp: int | None = Field(default=None, ge=1, le=MAX_LAYERS, description="Pin the virtual pipeline chunks per stage.")
    micro_batch_size: int | None = Field(
        default=None, ge=1, le=1 << 16, description="Pin the micro-batch size (sequences)."
    )
    zero_stage: ZeroStage | None = Field(default=None, description="Pin the ZeRO stage.")
    recompute: Recompute | None = Field(default=None, description="Pin the recompute mode.")
    sequence_parallel: bool | None = Field(default=None, description="Pin sequence parallelism on or off.")


def _allowed(limit: int) -> Any:
    """A ``search.allow`` list of sizes: at most ``MAX_ALLOW_VALUES`` values, each 1..``limit``."""
    return Annotated[list[Annotated[int, Field(ge=1, le=limit)]], Field(max_length=MAX_ALLOW_VALUES)]


class LayoutAllow(Strict):
    """Candidate values per layout field during search (each list at most ``MAX_ALLOW_VALUES``)."""

    tp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Tensor-parallel sizes to search.")  # type: ignore[valid-type]
    pp: _allowed(MAX_LAYERS) | None = Field(default=None, description="Pipeline stage counts to search.")  # type: ignore[valid-type]
    dp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Data-parallel sizes to search.")  # type: ignore[valid-type]
    cp: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Context-parallel sizes to search.")  # type: ignore[valid-type]
    ep: _allowed(MAX_NUM_GPUS) | None = Field(default=None, description="Expert-parallel sizes to search.")  # type: ignore[valid-type]
    vpp: _allowed(MAX_LAYERS) | None = Field(  # type: ignore[valid-type]
        default=None,
        description=(
            "Interleaving depths to search (any the layout rules allow: pp*vpp <= num_layers). For models whose "
            "dense and MoE layers alternate (an MoE "
            "layer frequency above 1), depths whose "
            "pp*vpp chunks cannot hold equal layer counts are searched by default only when they add at most "
            "40,000 layouts to the space, and otherwise only when listed here (or pinned with fix.vpp); for every "
            "other model they are searched by default."
        ),
    )
    micro_batch_size: _allowed(1 << 16) | None = Field(  # type: ignore[valid-type]
        default=None, description="Micro-batch sizes (sequences) to search."
    )
    zero_stage: list[ZeroStage] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="ZeRO stages to search."
    )
    recompute: list[Recompute] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="Recompute modes to search."
    )
    sequence_parallel: list[bool] | None = Field(
        default=None, max_length=MAX_ALLOW_VALUES, description="Sequence-parallel settings to search."
    )

    @model_validator(mode="after")
    def _non_empty(self) -> LayoutAllow:
        for name, values in self:
            if values is not None and len(values) == 0:
                raise ValueError(f"allow.{name} is empty: no candidate value is allowed")
            if values is not None and name not in ("zero_stage", "recompute", "sequence_parallel"):
                bad = [v for v in values if v < 1]
                if bad:
                    raise ValueError(f"allow.{name} has non-positive values {bad}")
        return self


Objective = Literal["throughput", "time_to_train", "cost", "energy", "goodput_throughput"]
"""What ranks the plans: step time (``throughput``), wall-clock days to the token budget
(``time_to_train``), dollars (``cost``), megawatt-hours (``energy``), or tokens per second after
checkpoints, failures and restarts (``goodput_throughput``)."""


class SearchSpec(Strict):
    top_k: int = Field(default=5, ge=1, le=50, description="Plans to return (best first).")
    objective: Objective = Field(
        default="throughput",
        description=(
            "What ranks the plans. throughput: step time. time_to_train, cost, energy: the time_to_train "
            "object's days, cost_usd, energy_mwh (they need training.total_tokens or total_steps; cost needs a "
            "price); goodput_throughput: tokens/s times goodput.fraction. The search finds the fastest layouts; "
            "the others re-rank them (at one GPU count they differ only through power and goodput)."
        ),
    )
    suggest: bool = Field(
        default=True,
        description="Also plan a few nearby GPU counts when cheap, and list the clearly better ones in suggestions.",
    )
    time_limit_s: float = Field(
        default=10.0,
        gt=0,
        description="Search time budget (s); values above the server's max_time_limit_s are clamped to it.",
    )
    fix: LayoutFix = Field(default_factory=LayoutFix, description="Layout fields pinned to one value.")
    allow: LayoutAllow = Field(default_factory=LayoutAllow, description="Candidate values per layout field.")
    memory_headroom_gib: float | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Memory kept free per GPU (GiB); default: the cost model's documented value.",
    )
    diverse: bool = Field(
        default=True,
        description=(
            "true: the top-k are the best plan of each of k layout families (tp, pp, dp, cp, ep); false: the raw "
            "top-k layouts, which may differ only in micro-batch, depth, ZeRO stage or recompute."
        ),
    )


class CostsSpec(Strict):
    """Prices for time_to_train; omitted fields come from the capacity catalog
    (``hardware_catalog/data/capacity.toml``)."""

    price_per_gpu_hour_usd: float | None = Field(
        default=None,
        ge=1e-4,
        le=1000,
        description="USD per GPU-hour; default: the catalog's on-demand price for the GPU.",
    )
    pue: float | None = Field(
        default=None,
        ge=1.0,
        le=5.0,
        description="Data-centre power usage effectiveness; default 1.58 (industry average).",
    )


class ReliabilitySpec(Strict):
    """Failure and checkpoint figures for goodput; omitted fields come from the capacity catalog."""

    gpu_mtbf_hours: float | None = Field(
        default=None,
        ge=1.0,
        le=1e9,
        description="Mean GPU-hours between job-stopping failures, per GPU; default 50,677 (Llama 3 405B).",
    )
    restart_s: float | None = Field(
        default=None, ge=0, le=1e6, description="Time lost per failure to restart; default 600 s."
    )
    checkpoint_write_s: float | None = Field(
        default=None,
        ge=1e-3,
        le=1e6,
        description="Blocking time of one checkpoint; default: checkpoint bytes / (nodes x the node-local write rate).",
    )
    checkpoint_write_bytes_per_s_per_node: float | None = Field(
        default=None,
        ge=1e6,
        le=1e13,
        description="Rate at which each node writes its checkpoint shard (bytes/s); default 28e9 (node-local NVMe).",
    )


class JobSpec(Strict):
    """Model + training + cluster: shared by /plan and /evaluate."""

    model: ModelSpec = Field(description="The model: a preset id, or a full architecture.")
    training: TrainingSpec = Field(description="What one optimizer step processes, and the training stack.")
    cluster: ClusterSpec = Field(description="The GPUs and network: a preset id plus num_gpus, or explicit fields.")
    costs: CostsSpec = Field(default_factory=CostsSpec, description="Prices for time_to_train.")
    reliability: ReliabilitySpec = Field(
        default_factory=ReliabilitySpec, description="Failure and checkpoint figures for goodput."
    )


class PlanRequest(JobSpec):
    search: SearchSpec = Field(
        default_factory=SearchSpec, description="How to search: plans wanted, time limit, pinned fields."
    )

    @model_validator(mode="after")
    def _moe_recompute_needs_moe(self) -> PlanRequest:
        if self.model.moe is None and self.search.fix.recompute == "moe":
            raise ValueError("search.fix.recompute: 'moe' recomputes MoE blocks and needs an MoE model")
        framework = self.training.framework
        _check_framework_recompute(framework, [self.search.fix.recompute], "search.fix.recompute")
        _check_framework_recompute(framework, list(self.search.allow.recompute or ()), "search.allow.recompute")
        return self


class EvaluateRequest(JobSpec):
    config: Layout = Field(description="The layout to score.")

    @model_validator(mode="after")
    def _framework_recompute(self) -> EvaluateRequest:
        _check_framework_recompute(self.training.framework, [self.config.recompute], "config.recompute")
        return self


def _check_framework_recompute(framework: str | None, names: list, where: str) -> None:
    """With a framework named, recompute takes its own names (docs/frameworks.md)."""
    if framework is None:
        return
    from optimizer.frameworks import profile

    own = [m.name for m in profile(framework).recompute]
    bad = [n for n in names if n is not None and n not in own]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r} is not a {framework} recompute mode (its modes: {', '.join(own)})")


MAX_COMPARE_LAYOUTS = 8
"""Most layouts one /compare request may score."""


class CompareRequest(JobSpec):
    """A job and two or more layouts to score side by side (the first is the reference)."""

    layouts: list[Layout] = Field(
        min_length=2,
        max_length=MAX_COMPARE_LAYOUTS,
        description=f"Layouts to score (2 to {MAX_COMPARE_LAYOUTS}); deltas are against the first.",
    )

    @model_validator(mode="after")
    def _framework_recompute(self) -> CompareRequest:
        names = [layout.recompute for layout in self.layouts]
        _check_framework_recompute(self.training.framework, names, "layouts.recompute")
        return self
