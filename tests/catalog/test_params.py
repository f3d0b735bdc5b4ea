"""Parameter counting: the formulas on tiny hand-computed models, and every preset against its published count."""

from __future__ import annotations

import pytest

from optimizer.params import (
    LayerParams,
    ParamCount,
    attention_params,
    count_params,
    embedding_params,
    layer_params,
    lm_head_params,
    mlp_params,
)
from optimizer.presets import load_model_presets
from optimizer.specs import ModelSpec

TOLERANCE = 0.02

# A tiny dense model: h=8, a=2 heads, g=1 KV head, d=4, f=16, V=10, 2 layers.
TINY = {
    "num_layers": 2,
    "hidden_size": 8,
    "ffn_hidden_size": 16,
    "num_attention_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 4,
    "vocab_size": 10,
}


def tiny(**overrides) -> ModelSpec:
    return ModelSpec(**{**TINY, **overrides})


# ---------------------------------------------------------------- formulas, exact integers


def test_mlp_formulas():
    assert mlp_params(8, 16, "swiglu") == 3 * 8 * 16 == 384
    assert mlp_params(8, 16, "gelu") == 2 * 8 * 16 == 256
    with pytest.raises(ValueError):
        mlp_params(8, 16, "relu")


def test_gqa_attention():
    # Q 8*(2*4)=64, K+V 2*8*(1*4)=64, O (2*4)*8=64
    assert attention_params(tiny()) == 192
    # MHA (g = a = 2): Q 64, K+V 2*8*8=128, O 64
    assert attention_params(tiny(num_kv_heads=2)) == 256
    # head_dim decoupled from hidden/heads: d=6 -> Q 8*12=96, K+V 2*8*6=96, O 12*8=96
    assert attention_params(tiny(head_dim=6)) == 288


def test_dense_layer_and_model_swiglu():
    m = tiny()
    layer = layer_params(m, 0)
    assert layer == LayerParams(
        attention=192, mlp_dense=384, router=0, routed_expert_each=0, num_routed_experts=0, shared_experts=0, norms=16
    )
    assert layer.total == 592
    assert layer.active(8) == 592  # no experts: top_k is irrelevant
    assert embedding_params(m) == 80
    assert lm_head_params(m) == 80
    # 2 layers * 592 + embedding 80 + head 80 + final norm 8
    assert count_params(m) == ParamCount(total=1352, active=1352, embedding=80, lm_head=80, per_layer_total=(592, 592))


def test_dense_model_gelu_tied():
    m = tiny(activation="gelu", tied_embeddings=True)
    # layer: 192 + 256 + 16 = 464; 2 layers + embedding 80 + no head + final norm 8
    c = count_params(m)
    assert lm_head_params(m) == 0
    assert c.per_layer_total == (464, 464)
    assert c.total == c.active == 2 * 464 + 80 + 8 == 1016
    assert c.lm_head == 0


def test_moe_model():
    # 3 layers; layer 0 dense, layers 1-2 MoE with 4 experts (f_e=6), top-2, 1 shared expert (f_s=10)
    m = tiny(
        num_layers=3,
        moe={
            "num_experts": 4,
            "top_k": 2,
            "expert_ffn_hidden_size": 6,
            "num_shared_experts": 1,
            "shared_expert_ffn_hidden_size": 10,
            "first_dense_layers": 1,
        },
    )
    assert [m.is_moe_layer(i) for i in range(3)] == [False, True, True]
    dense = layer_params(m, 0)
    assert dense.total == 192 + 384 + 16 == 592
    moe = layer_params(m, 1)
    assert moe == LayerParams(
        attention=192,
        mlp_dense=0,
        router=8 * 4,  # 32
        routed_expert_each=3 * 8 * 6,  # 144
        num_routed_experts=4,
        shared_experts=3 * 8 * 10,  # 240
        norms=16,
    )
    assert moe.total == 192 + 32 + 4 * 144 + 240 + 16 == 1056
    assert moe.active(2) == 192 + 32 + 2 * 144 + 240 + 16 == 768
    assert moe.active(0) == 480
    assert moe.active(99) == moe.total  # capped at the expert count
    c = count_params(m)
    assert c.per_layer_total == (592, 1056, 1056)
    assert c.total == 592 + 2 * 1056 + 80 + 80 + 8 == 2872
    assert c.active == 592 + 2 * 768 + 80 + 80 + 8 == 2296


def test_moe_layer_frequency_and_default_shared_width():
    # every 2nd layer is MoE; shared expert width defaults to the routed expert width
    m = tiny(
        num_layers=4,
        moe={"num_experts": 2, "top_k": 1, "expert_ffn_hidden_size": 6, "num_shared_experts": 2, "layer_frequency": 2},
    )
    assert [m.is_moe_layer(i) for i in range(4)] == [True, False, True, False]
    moe = layer_params(m, 0)
    assert moe.shared_experts == 2 * 3 * 8 * 6 == 288
    assert moe.total == 192 + 16 + 2 * 144 + 288 + 16 == 800
    assert layer_params(m, 1).total == 592
    assert count_params(m).per_layer_total == (800, 592, 800, 592)


def test_mla_attention():
    # h=8, a=2, r_q=4, r_kv=3, nope=2, rope=1, v=2
    mla = {"q_lora_rank": 4, "kv_lora_rank": 3, "qk_nope_head_dim": 2, "qk_rope_head_dim": 1, "v_head_dim": 2}
    # q_a 8*4=32, q_a_norm 4, q_b 4*2*(2+1)=24, kv_a 8*(3+1)=32, kv_a_norm 3, kv_b 3*2*(2+2)=24, o 2*2*8=32
    assert attention_params(tiny(mla=mla)) == 151
    # no query compression: q 8*2*(2+1)=48 replaces q_a + q_a_norm + q_b
    assert attention_params(tiny(mla={**mla, "q_lora_rank": None})) == 48 + 32 + 3 + 24 + 32 == 139
    # MLA ignores num_kv_heads / head_dim
    assert attention_params(tiny(mla=mla, num_kv_heads=2, head_dim=6)) == 151
    assert layer_params(tiny(mla=mla), 0).attention == 151


def test_layer_index_out_of_range():
    with pytest.raises(IndexError):
        layer_params(tiny(), 2)
    with pytest.raises(IndexError):
        layer_params(tiny(), -1)


def test_active_rejects_negative_top_k():
    with pytest.raises(ValueError):
        layer_params(tiny(), 0).active(-1)


# ---------------------------------------------------------------- presets vs published counts

PRESET_IDS = sorted(load_model_presets())
MOE_PRESET_IDS = [pid for pid in PRESET_IDS if load_model_presets()[pid].moe is not None]


def _rel(computed: int, published: int) -> float:
    return abs(computed - published) / published


@pytest.mark.parametrize("preset_id", PRESET_IDS)
def test_preset_total_matches_published(preset_id):
    preset = load_model_presets()[preset_id]
    c = count_params(ModelSpec(preset=preset_id))
    assert _rel(c.total, preset.published_total_params) <= TOLERANCE, (
        f"{preset_id}: computed {c.total:,} vs published {preset.published_total_params:,}"
    )
    assert len(c.per_layer_total) == preset.num_layers
    assert c.total == c.embedding + c.lm_head + sum(c.per_layer_total) + preset.hidden_size


@pytest.mark.parametrize("preset_id", MOE_PRESET_IDS)
def test_moe_preset_active_matches_published(preset_id):
    preset = load_model_presets()[preset_id]
    assert preset.published_active_params is not None
    c = count_params(ModelSpec(preset=preset_id))
    active = c.active - (c.embedding if preset.published_active_excludes_embedding else 0)
    assert _rel(active, preset.published_active_params) <= TOLERANCE, (
        f"{preset_id}: computed active {active:,} vs published {preset.published_active_params:,}"
    )
    assert c.active < c.total


@pytest.mark.parametrize("preset_id", sorted(set(PRESET_IDS) - set(MOE_PRESET_IDS)))
def test_dense_preset_active_equals_total(preset_id):
    c = count_params(ModelSpec(preset=preset_id))
    assert c.active == c.total


def test_deepseek_v3_layer_structure():
    m = ModelSpec(preset="deepseek-v3")
    dense = [layer_params(m, i) for i in range(3)]
    assert all(layer.mlp_dense == 3 * 7168 * 18432 and layer.num_routed_experts == 0 for layer in dense)
    moe = layer_params(m, 3)
    assert moe.mlp_dense == 0
    assert moe.num_routed_experts == 256
    assert moe.routed_expert_each == 3 * 7168 * 2048
    assert moe.shared_experts == 3 * 7168 * 2048
    assert moe.router == 7168 * 256
    assert m.num_moe_layers == 58


def test_qwen3_moe_has_no_shared_experts_and_no_dense_layers():
    m = ModelSpec(preset="qwen3-30b-a3b")
    assert all(m.is_moe_layer(i) for i in range(m.num_layers or 0))
    layer = layer_params(m, 0)
    assert layer.shared_experts == 0
    assert layer.mlp_dense == 0
    # head_dim 128 with hidden 2048: Q/O are 2048 x 4096, not square
    assert layer.attention == 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 32 * 128 * 2048
