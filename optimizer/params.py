"""Parameter counts of a model: the one place that counts weights.

The cost model derives weight/gradient/optimizer memory and matmul FLOPs from these numbers, so
every formula lives here, once. All functions are pure and take a validated ``ModelSpec``.

Notation: ``h`` = hidden_size, ``f`` = ffn_hidden_size, ``a`` = num_attention_heads,
``g`` = num_kv_heads, ``d`` = head_dim, ``V`` = vocab_size.

Per-layer formulas (weights only; biases are not counted, the presets' models have none or
negligibly few):

- MLP, ``swiglu`` (gated: gate, up, down):   ``3 * h * f``
- MLP, ``gelu`` (non-gated: up, down):       ``2 * h * f``
- GQA/MHA attention:                         ``h*a*d [Q] + 2*h*g*d [K,V] + a*d*h [O]``
- MLA attention (DeepSeek-V2/V3), with ``r_q`` = q_lora_rank, ``r_kv`` = kv_lora_rank,
  ``n`` = qk_nope_head_dim, ``p`` = qk_rope_head_dim, ``v`` = v_head_dim::

      q:   h*r_q [q_a] + r_q [q_a_norm] + r_q*a*(n+p) [q_b]     (or h*a*(n+p) if r_q is null)
      kv:  h*(r_kv+p) [kv_a] + r_kv [kv_a_norm] + r_kv*a*(n+v) [kv_b]
      o:   a*v*h

- MoE layer: ``router = h * E`` (E routed experts), each routed expert is an MLP of width
  ``moe.expert_ffn_hidden_size``, the shared experts together are
  ``num_shared_experts * MLP(shared_expert_ffn_hidden_size)``; a MoE layer has no dense MLP.
- Norms: ``2 * h`` per layer (pre-attention and pre-MLP RMSNorm weights).

Whole model: ``total = V*h [embedding] + V*h [LM head, 0 if tied] + sum(layers) + h [final norm]``;
``active`` is the same with only ``moe.top_k`` routed experts per MoE layer (what one token touches).
Not modelled (each below 0.1% of the presets' totals): learned absolute position embeddings,
linear and LayerNorm biases, QK-norms, attention sinks and router bias terms. Multi-token-prediction
modules are not part of the model here (DeepSeek-V3's 671B excludes its MTP module).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.specs.model import ModelSpec

__all__ = [
    "LayerParams",
    "ParamCount",
    "attention_params",
    "count_params",
    "embedding_params",
    "layer_params",
    "lm_head_params",
    "mla_up_projection_params",
    "mlp_params",
]


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, split by the parts the cost model shards differently."""

    attention: int
    """Q/K/V/O projections (incl. MLA down/up projections and their norms)."""
    mlp_dense: int
    """Dense MLP of a non-MoE layer (0 in an MoE layer)."""
    router: int
    """MoE router (``hidden * num_experts``), 0 for dense layers."""
    routed_expert_each: int
    """One routed expert's MLP (0 for dense layers)."""
    num_routed_experts: int
    """Routed experts in this layer (0 for dense layers)."""
    shared_experts: int
    """All shared experts of this layer together."""
    norms: int
    """Norm weights of this layer (``2 * hidden`` for a pre-norm block)."""

    @property
    def total(self) -> int:
        """Every parameter of the layer (all routed experts)."""
        return self.active(self.num_routed_experts)

    def on_rank(self, tp: int, ep: int) -> tuple[float, float]:
        """(dense, routed-expert) parameters one GPU holds of this layer: attention, dense MLP and
        shared experts split over ``tp`` (router and norms replicated), the routed experts over
        ``ep`` (pass ``ep * etp`` for experts tensor-split ``etp`` ways)."""
        dense = (self.attention + self.mlp_dense + self.shared_experts) / tp + self.router + self.norms
        expert = self.routed_expert_each * self.num_routed_experts / ep if self.num_routed_experts else 0.0
        return dense, expert

    def active(self, top_k: int) -> int:
        """Parameters one token touches when routed to ``top_k`` experts (capped at the expert count)."""
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        routed = self.routed_expert_each * min(top_k, self.num_routed_experts)
        return self.attention + self.mlp_dense + self.router + routed + self.shared_experts + self.norms


@dataclass(frozen=True)
class ParamCount:
    """Whole-model parameter counts."""

    total: int
    """All parameters: embeddings, LM head, every layer (all experts), final norm."""
    active: int
    """Parameters one token touches: as ``total`` but ``moe.top_k`` routed experts per MoE layer."""
    embedding: int
    """Input embedding table (``vocab * hidden``)."""
    lm_head: int
    """Output projection (``vocab * hidden``; 0 when tied to the embedding)."""
    per_layer_total: tuple[int, ...]
    """``LayerParams.total`` of each layer, in layer order."""


def _req(value: int | None, field: str) -> int:
    if value is None:
        raise ValueError(f"model.{field} is not set; pass a validated ModelSpec")
    return value


def mlp_params(hidden: int, ffn: int, activation: str) -> int:
    """One MLP: ``3*h*f`` for gated ``swiglu``, ``2*h*f`` for non-gated ``gelu``."""
    if activation == "swiglu":
        return 3 * hidden * ffn
    if activation == "gelu":
        return 2 * hidden * ffn
    raise ValueError(f"unknown activation {activation!r}")


def mla_up_projection_params(model: ModelSpec) -> tuple[int, int]:
    """The projections that make MLA's per-head q, k, v in one layer: (query latent -> per-head q,
    or hidden state -> per-head q without query compression; key/value latent -> per-head k
    (no-rope part) and v). 0, 0 for models without MLA."""
    mla = model.mla
    if mla is None:
        return 0, 0
    a = _req(model.num_attention_heads, "num_attention_heads")
    q_in = _req(model.hidden_size, "hidden_size") if mla.q_lora_rank is None else mla.q_lora_rank
    q_up = q_in * a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    return q_up, mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)


def attention_params(model: ModelSpec) -> int:
    """Attention projections of one layer (GQA/MHA, or MLA when ``model.mla`` is set)."""
    h = _req(model.hidden_size, "hidden_size")
    a = _req(model.num_attention_heads, "num_attention_heads")
    mla = model.mla
    if mla is not None:
        q_up, kv_up = mla_up_projection_params(model)
        q = q_up if mla.q_lora_rank is None else h * mla.q_lora_rank + mla.q_lora_rank + q_up
        kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank + kv_up
        o = a * mla.v_head_dim * h
        return q + kv + o
    g = _req(model.num_kv_heads, "num_kv_heads")
    d = _req(model.head_dim, "head_dim")
    return h * a * d + 2 * h * g * d + a * d * h


def layer_params(model: ModelSpec, layer_index: int) -> LayerParams:
    """Parameters of 0-based layer ``layer_index`` (dense or MoE per ``model.is_moe_layer``)."""
    num_layers = _req(model.num_layers, "num_layers")
    if not 0 <= layer_index < num_layers:
        raise IndexError(f"layer_index {layer_index} out of range for {num_layers} layers")
    h = _req(model.hidden_size, "hidden_size")
    activation = model.activation or "swiglu"
    attention = attention_params(model)
    norms = 2 * h
    moe = model.moe
    if moe is not None and model.is_moe_layer(layer_index):
        shared_ffn = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
        return LayerParams(
            attention=attention,
            mlp_dense=0,
            router=h * moe.num_experts,
            routed_expert_each=mlp_params(h, moe.expert_ffn_hidden_size, activation),
            num_routed_experts=moe.num_experts,
            shared_experts=moe.num_shared_experts * mlp_params(h, shared_ffn, activation),
            norms=norms,
        )
    return LayerParams(
        attention=attention,
        mlp_dense=mlp_params(h, _req(model.ffn_hidden_size, "ffn_hidden_size"), activation),
        router=0,
        routed_expert_each=0,
        num_routed_experts=0,
        shared_experts=0,
        norms=norms,
    )


def embedding_params(model: ModelSpec) -> int:
    """Input embedding table: ``vocab * hidden``."""
    return _req(model.vocab_size, "vocab_size") * _req(model.hidden_size, "hidden_size")


def lm_head_params(model: ModelSpec) -> int:
    """Output projection: ``vocab * hidden``, or 0 when tied to the input embedding."""
    return 0 if model.tied_embeddings else embedding_params(model)


def count_params(model: ModelSpec) -> ParamCount:
    """Total and active parameters of the whole model (see the module docstring for the formulas)."""
    num_layers = _req(model.num_layers, "num_layers")
    top_k = model.moe.top_k if model.moe is not None else 0
    layers = [layer_params(model, i) for i in range(num_layers)]
    embedding = embedding_params(model)
    lm_head = lm_head_params(model)
    final_norm = _req(model.hidden_size, "hidden_size")
    outside = embedding + lm_head + final_norm
    per_layer_total = tuple(layer.total for layer in layers)
    return ParamCount(
        total=outside + sum(per_layer_total),
        active=outside + sum(layer.active(top_k) for layer in layers),
        embedding=embedding,
        lm_head=lm_head,
        per_layer_total=per_layer_total,
    )
