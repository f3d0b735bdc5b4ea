"""Map a calibration row's model block to a ``ModelSpec`` (``benchmarks/calibration_rows.py``),
and count FLOPs per token the way the row's source does.

Model
  - ``num_layers``, ``hidden_size``, ``num_attention_heads`` are required (a row without heads is
    skipped unless ``INFER_MISSING_HEADS``; heads do not change FLOPs when
    ``heads * head_dim = hidden``, only TP divisibility). ``num_kv_heads`` null means MHA.
  - Activation by family: gated SwiGLU for llama / qwen / mixtral / mistral / deepseek families;
    a non-gated two-matrix MLP (``gelu``) for megatron-gpt, mt-nlg, bloom (GeLU) and nemotron
    (squared ReLU, also two matrices).
  - ``ffn_hidden_size`` null: ``4 * hidden`` for non-gated families; the Llama rule
    (``8h/3`` rounded up to 256) for gated ones (``ModelSpec`` default).
  - ``head_dim``: ``hidden / heads``, except Qwen3 (128, its ``config.json``; the row's
    ``hidden / heads`` = 64 would halve the attention projections) and, when ``hidden / heads`` is
    not integral, 128.
  - ``vocab_size`` null: megatron-gpt 51,200 (the GPT-2 BPE vocabulary padded; it reproduces
    Korthikanti et al.'s MFU and the NeMo GPT-3 rows' TFLOP/s from their tokens/s); nemotron3
    256,000 (its SentencePiece vocabulary; reproduces the NeMo Nemotron rows' TFLOP/s to 0.1%).
  - ``tied_embeddings``: tied for megatron-gpt / mt-nlg / bloom, untied otherwise, unless that
    misses the row's ``total_params_b`` by more than 2% and the other choice halves the miss
    (the 2024 Megatron-LM weak-scaling models are untied). It only moves weight memory and the
    LM-head gradient; the LM-head FLOPs run either way.
  - ``attention.sliding_window`` -> ``sliding_window`` (every second layer when the row says the
    windowed layers alternate); attention sinks cost no GEMM work and are not modelled.
  - ``gated_mlp`` when stated decides the activation; ``head_dim`` and ``mla`` are taken as given.
  - ``moe``: ``num_experts``, ``top_k``, ``expert_ffn_hidden_size``, ``shared_experts`` ->
    ``num_shared_experts``, ``moe_layer_freq`` ("all layers" or an integer) -> ``layer_frequency``.

FLOPs: :func:`source_flops_per_token` counts FLOPs per token the way the row's source does
(:func:`flop_definition` picks which of its three definitions); ``measured_throughput``
(``benchmarks/calibration_rows.py``) converts a row that reports only TFLOP/s with it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from benchmarks.row_errors import Unmappable
from benchmarks.row_stack import map_recompute
from optimizer.params import count_params
from optimizer.specs import MLAConfig, ModelSpec, MoEConfig

INFER_MISSING_HEADS = True
"""If True, a row without ``num_attention_heads`` gets ``hidden / 128`` heads instead of being skipped."""

GATED_FAMILIES = ("llama", "qwen", "mixtral", "mistral", "deepseek")
NON_GATED_FAMILIES = ("megatron-gpt", "mt-nlg", "bloom", "nemotron", "gpt")
TIED_BY_DEFAULT = ("megatron-gpt", "mt-nlg", "bloom")
FAMILY_VOCAB = {"megatron-gpt": 51200, "nemotron3": 256000}
FAMILY_HEAD_DIM = {"qwen3": 128}
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


# ---------------------------------------------------------------------------------------- model


def _family(row: dict[str, Any]) -> str:
    m = row["model"]
    return f"{m.get('family') or ''} {m.get('name') or ''}".lower()


def activation_for(row: dict[str, Any]) -> str:
    """The row's ``gated_mlp`` flag when stated, else the family rule."""
    gated = row["model"].get("gated_mlp")
    if gated is not None:
        return "swiglu" if gated else "gelu"
    fam = _family(row)
    if any(f in fam for f in GATED_FAMILIES):
        return "swiglu"
    if any(f in fam for f in NON_GATED_FAMILIES):
        return "gelu"
    fam = row["model"].get("family")
    raise Unmappable(f"activation of family {fam!r} unknown (no gated / non-gated rule)")


DENSE_THEN_MOE = re.compile(r"^\(?\s*\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\s*\)?$")
"""Megatron's ``--moe-layer-freq`` pattern ``([0]*k+[1]*n)``: ``k`` dense layers, then MoE layers."""


def _moe(block: dict[str, Any]) -> MoEConfig:
    freq = block.get("moe_layer_freq", block.get("layer_frequency", 1))
    first_dense = int(block.get("first_dense_layers") or block.get("first_k_dense") or 0)
    pattern = DENSE_THEN_MOE.match(freq.replace(" ", "")) if isinstance(freq, str) else None
    if pattern:
        first_dense, freq = int(pattern.group(1)), 1
    if freq is None or (isinstance(freq, str) and "all" in freq.lower()):
        freq = 1
    try:
        freq = int(freq)
    except (TypeError, ValueError) as exc:
        raise Unmappable(f"moe_layer_freq {freq!r} not understood") from exc
    return MoEConfig(
        num_experts=int(block["num_experts"]),
        top_k=int(block["top_k"]),
        expert_ffn_hidden_size=int(block["expert_ffn_hidden_size"]),
        num_shared_experts=int(block.get("shared_experts") or block.get("num_shared_experts") or 0),
        shared_expert_ffn_hidden_size=block.get("shared_expert_ffn_hidden_size"),
        layer_frequency=freq,
        first_dense_layers=first_dense,
    )


def _sliding_window(attn: dict[str, Any]) -> dict[str, int]:
    """``model.attention``'s window (``sliding_window``) and which layers use it ("every second
    layer" -> ``sliding_window_every`` 2, else every layer)."""
    if not attn.get("sliding_window"):
        return {}
    layers = str(attn.get("sliding_window_layers") or "").lower()
    every = 2 if "every second" in layers or "alternat" in layers else 1
    return {"sliding_window": int(attn["sliding_window"]), "sliding_window_every": every}


def map_model(row: dict[str, Any]) -> tuple[ModelSpec, list[str]]:
    m = row["model"]
    notes: list[str] = []
    layers, hidden, heads = m.get("num_layers"), m.get("hidden_size"), m.get("num_attention_heads")
    if layers is None or hidden is None:
        raise Unmappable("architecture not stated (num_layers / hidden_size null)")
    if heads is None:
        if not INFER_MISSING_HEADS:
            raise Unmappable("num_attention_heads not stated")
        heads = max(1, hidden // 128)
        notes.append(f"heads not stated: {heads} assumed (hidden/128)")
    fam = (m.get("family") or "").lower()
    activation = activation_for(row)
    ffn = m.get("ffn_hidden_size")
    if ffn is None and activation == "gelu":
        ffn = 4 * hidden
        notes.append("ffn = 4h (not stated)")
    head_dim = m.get("head_dim") or next((d for f, d in FAMILY_HEAD_DIM.items() if fam.startswith(f)), None)
    if head_dim is None and hidden % heads:
        head_dim = 128
        notes.append("hidden/heads not integral: head_dim 128 assumed")
    vocab = m.get("vocab_size")
    if vocab is None:
        vocab = next((v for f, v in FAMILY_VOCAB.items() if fam.startswith(f)), None)
        if vocab is None:
            raise Unmappable(f"vocab_size not stated and no default for family {fam!r}")
        notes.append(f"vocab {vocab} assumed (family default)")
    moe = _moe(m["moe"]) if m.get("moe") else None
    mla = MLAConfig(**{k: m["mla"][k] for k in MLA_FIELDS if k in m["mla"]}) if m.get("mla") else None
    if mla is not None:
        head_dim = None  # MLA sets its own per-head dimensions
    base = {
        "name": m.get("name") or row["id"],
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_kv_heads": m.get("num_kv_heads"),
        "head_dim": head_dim,
        "vocab_size": vocab,
        "activation": activation,
        "moe": moe,
        "mla": mla,
        **_sliding_window(m.get("attention") or {}),
    }
    try:
        tied = ModelSpec(**base, tied_embeddings=True)
        untied = ModelSpec(**base, tied_embeddings=False)
    except ValueError as exc:
        raise Unmappable(f"model fields rejected: {exc}") from exc
    default_tied = any(fam.startswith(f) for f in TIED_BY_DEFAULT)
    model, other = (tied, untied) if default_tied else (untied, tied)
    stated_b = m.get("total_params_b")
    if stated_b:
        err = abs(count_params(model).total / 1e9 - stated_b) / stated_b
        err_other = abs(count_params(other).total / 1e9 - stated_b) / stated_b
        if err > 0.02 and err_other < err / 2:
            model, err = other, err_other
            tie = "tied" if model.tied_embeddings else "untied"
            notes.append(f"{tie} embeddings (matches {stated_b}B)")
        if err > 0.10:
            notes.append(f"params {count_params(model).total / 1e9:.1f}B vs stated {stated_b}B")
    return model, notes


# ---------------------------------------------------------------------------------------- FLOPs


def source_flops_per_token(model: ModelSpec, seq: int, *, causal: bool, recompute_factor: float = 1.0) -> float:
    """FLOPs per token (forward + backward) the way Megatron-family sources count them.

    The generalised Megatron-LM ``num_floating_point_operations`` (Narayanan et al. 2021, appendix;
    GQA, gated MLP and MoE terms), per token, summed over layers::

        attention projections   6 * (h * (q + 2 kv) + q * h)       q = heads*d, kv = kv_heads*d
        attention core          12 * q * s   (x 1/2 when ``causal``)
        MLP                     6 * m * h * f       m = 3 gated, 2 non-gated (MoE: top_k experts
                                                    of width expert_ffn, plus shared experts)
        logits                  6 * h * V            (once, not per layer)

    For GPT with a 4h GeLU MLP and MHA this is ``72 L h^2 (1 + s/(6h) + V/(12 L h))`` per token.
    ``recompute_factor`` multiplies the layer terms only: 4/3 gives the hardware-FLOP count of
    full activation recompute that SC'21, MT-NLG and BLOOM report,
    ``96 L h^2 (1 + s/(6h) + V/(16 L h))`` per token (the logit layer is not recomputed).

    The three definitions used (``flop_definition``): SC'21 / MT-NLG / BLOOM hardware TFLOP/s:
    non-causal, factor 4/3; Megatron-LM README 2024 and NeMo 24.x model TFLOP/s: non-causal, 1;
    Megatron-Core 2025 (Megatron-MoE-ModelZoo): causal, 1. Rows that report both TFLOP/s and
    tokens/s reproduce these to within 1-2% (``benchmarks/validation.py`` prints the check).
    """
    if model.mla is not None:
        raise Unmappable("FLOP conversion for MLA models not implemented")
    h = float(model.hidden_size or 0)
    d = float(model.head_dim or 0)
    q = (model.num_attention_heads or 0) * d
    kv = (model.num_kv_heads or 0) * d
    mult = 3.0 if model.activation == "swiglu" else 2.0
    attn = 6.0 * (h * (q + 2 * kv) + q * h) + 12.0 * q * seq * (0.5 if causal else 1.0)
    total_layers = 0.0
    for i in range(model.num_layers or 0):
        if model.moe is not None and model.is_moe_layer(i):
            moe = model.moe
            shared_f = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
            width = moe.top_k * moe.expert_ffn_hidden_size + moe.num_shared_experts * shared_f
            mlp = 6.0 * mult * h * width
        else:
            mlp = 6.0 * mult * h * float(model.ffn_hidden_size or 0)
        total_layers += attn + mlp
    return recompute_factor * total_layers + 6.0 * h * float(model.vocab_size or 0)


def flop_definition(row: dict[str, Any]) -> tuple[bool, float, str]:
    """(causal attention, recompute factor, label) of the row's reported TFLOP/s."""
    kind = (row["measured"].get("tflops_kind") or "").lower()
    src = json.dumps(row.get("source", {})).lower()
    if "hardware" in kind:
        rc = map_recompute(row["config"].get("activation_recompute")) or "full"
        factor = 4.0 / 3.0 if rc == "full" else 1.0
        label = "hardware FLOPs, 96-factor (full recompute counted)" if rc == "full" else "hardware FLOPs"
        return False, factor, label
    if "modelzoo" in src or "moe-modelzoo" in src:
        return True, 1.0, "Megatron-Core model FLOPs, causal attention"
    return False, 1.0, "Megatron model FLOPs, 72-factor (non-causal attention)"
