"""FLOPs per token, counted per layer (forward pass; backward = 2x forward).

Counted (one multiply-add = 2 FLOPs):
- projections: ``2 * params`` per token for Q/K/V/O (MHA, GQA) or the MLA down/up projections;
- attention core, causal: per token the mean context is ``s/2``, so ``QK^T`` costs
  ``2 * (s/2) * heads * d_qk`` and ``AV`` costs ``2 * (s/2) * heads * d_v``;
- MLP: ``2 * params`` (SwiGLU three matrices, GeLU two); MoE: router ``2*h*E``, ``top_k`` routed
  experts and every shared expert;
- LM head ``2 * h * V`` (the embedding lookup is free).
Not counted: norms, activations, softmax, rotary, optimizer (memory-bound; timed from HBM
bandwidth instead). MFU uses these model FLOPs; HFU adds recomputed forward FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.modes import RecomputeMode
from optimizer.params import layer_params, mla_up_projection_params
from optimizer.specs import ModelSpec


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs per token of one layer, before any parallel split."""

    attn_proj: float
    attn_core: float
    mlp: float
    """Dense MLP, or router + top_k routed experts + shared experts."""

    @property
    def total(self) -> float:
        return self.attn_proj + self.attn_core + self.mlp


def attention_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key head dim, value head dim)."""
    if model.mla is not None:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim
    assert model.head_dim is not None
    return model.head_dim, model.head_dim


def mean_context(model: ModelSpec, seq_len: int) -> float:
    """Keys a query attends to, averaged over the sequence and the layers: ``s/2`` for causal
    attention; a layer with a window of ``w`` keys attends to ``min(i + 1, w)`` at position ``i``,
    ``w (1 - w / 2s)`` on average (``s/2`` at ``w = s``). With ``sliding_window_every`` n, every
    n-th layer from the first is windowed. Every layer is costed at this mean: alternating
    patterns put the same share of windowed layers on every pipeline stage, to one layer."""
    full = seq_len / 2.0
    w = model.sliding_window
    if w is None or w >= seq_len:
        return full
    layers = model.num_layers or 1
    windowed = -(-layers // model.sliding_window_every)  # layers 0, n, 2n, ...
    local = w * (1.0 - w / (2.0 * seq_len))
    return (windowed * local + (layers - windowed) * full) / layers


def attention_core_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Causal attention scores and values, forward, per token (``mean_context`` keys)."""
    d_qk, d_v = attention_dims(model)
    heads = model.num_attention_heads or 0
    return 2.0 * mean_context(model, seq_len) * heads * (d_qk + d_v)


def layer_flops(model: ModelSpec, layer_index: int, seq_len: int) -> LayerFlops:
    p = layer_params(model, layer_index)
    mlp = 2.0 * p.mlp_dense
    if p.num_routed_experts:
        assert model.moe is not None
        mlp = 2.0 * (p.router + model.moe.top_k * p.routed_expert_each + p.shared_experts)
    return LayerFlops(2.0 * p.attention, attention_core_flops_per_token(model, seq_len), mlp)


def lm_head_flops_per_token(model: ModelSpec) -> float:
    """Logit projection, forward (runs even with tied embeddings)."""
    assert model.hidden_size is not None and model.vocab_size is not None
    return 2.0 * model.hidden_size * model.vocab_size


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per token for one training step (forward + backward), whole model."""

    model_per_token: float
    """Model FLOPs (no recompute): 3x forward."""
    forward_layers_per_token: float
    attn_core_forward_per_token: float
    moe_block_forward_per_token: float
    """Router, routed and shared experts of the MoE layers (what ``recompute="moe"`` re-runs)."""
    mla_up_forward_per_token: float
    """MLA up-projections of every layer (re-run by ``selective`` and ``moe`` on MLA models)."""


def model_flops(model: ModelSpec, seq_len: int) -> ModelFlops:
    fwd_layers = 0.0
    core = 0.0
    moe_block = 0.0
    for i in range(model.num_layers or 0):
        lf = layer_flops(model, i, seq_len)
        fwd_layers += lf.total
        core += lf.attn_core
        if layer_params(model, i).num_routed_experts:
            moe_block += lf.mlp
    fwd = fwd_layers + lm_head_flops_per_token(model)
    mla_up = 2.0 * sum(mla_up_projection_params(model)) * (model.num_layers or 0)
    return ModelFlops(3.0 * fwd, fwd_layers, core, moe_block, mla_up)


MEGATRON_SELECTIVE = RecomputeMode.CORE_ATTN
"""Internal recompute mode, never searched: Megatron-Core's selective recompute with the modules
the launch arguments name for ``selective`` (``core_attn``, plus ``mla_up_proj`` on MLA models).
Under Transformer Engine it keeps the norm and activation-function outputs that ``selective``
drops. Plan notes cost a ``selective`` layout with it to say how much more memory that takes."""


def recompute_flops_per_token(mf: ModelFlops, recompute: str) -> float:
    """Extra forward FLOPs per token that activation recompute adds (hardware FLOPs only)."""
    if recompute == RecomputeMode.FULL:
        return mf.forward_layers_per_token
    if recompute in (RecomputeMode.SELECTIVE, MEGATRON_SELECTIVE):
        return mf.attn_core_forward_per_token + mf.mla_up_forward_per_token
    if recompute == RecomputeMode.MOE:
        return mf.attn_core_forward_per_token + mf.mla_up_forward_per_token + mf.moe_block_forward_per_token
    if recompute == RecomputeMode.OP:  # every second matmul of the layers (attention core kept)
        return 0.5 * (mf.forward_layers_per_token - mf.attn_core_forward_per_token)
    return 0.0
