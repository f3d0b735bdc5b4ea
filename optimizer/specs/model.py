"""The model spec: a preset id, or a full architecture (dense, MoE, MLA)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from optimizer.errors import UnknownCatalogId
from optimizer.reference import current
from optimizer.specs.common import MAX_HIDDEN, MAX_LAYERS, Activation, check_derived_bounds
from optimizer.strict_model import Strict


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
    "dropout",
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
    mla: MLAConfig | None = Field(
        default=None,
        description="Multi-head latent attention; null: standard attention (with a preset, null keeps the preset's).",
    )
    moe: MoEConfig | None = Field(
        default=None,
        description="Mixture of experts; null: a dense model (with a preset, null keeps the preset's: give the architecture without a preset for a dense variant).",
    )
    sliding_window: int | None = Field(
        default=None,
        ge=1,
        le=4_194_304,
        description=(
            "Sliding-window attention: keys each query attends to on windowed layers (null: full causal; "
            "with a preset, null keeps the preset's)."
        ),
    )
    sliding_window_every: int = Field(
        default=1,
        ge=1,
        le=MAX_LAYERS,
        description="Every n-th layer from the first is windowed, the others full (gpt-oss: 2). Needs sliding_window.",
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description=(
            "Hidden and attention dropout probability (Megatron-Core's hidden_dropout / attention_dropout; "
            "most LLM pretraining uses none). Above 0 each layer keeps two 1-byte residual-dropout masks a token "
            "and hidden unit for backward."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        presets = current().presets
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
        check_derived_bounds(self, ("head_dim", "ffn_hidden_size"), "hidden_size and num_attention_heads")
        if self.moe is not None and self.moe.first_dense_layers >= self.num_layers:
            raise ValueError(
                f"model.moe.first_dense_layers: {self.moe.first_dense_layers} leaves no MoE layer of num_layers "
                f"({self.num_layers}): give fewer, or no moe block for a dense model"
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
