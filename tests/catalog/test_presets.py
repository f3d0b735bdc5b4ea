"""Model presets: the data file loads, presets resolve in ModelSpec, overrides win, bad specs fail clearly."""

from __future__ import annotations

import copy
import tomllib
from importlib import resources

import pytest
from pydantic import ValidationError

from optimizer.presets import ModelPreset, PresetLoadError, load_model_presets, parse_model_presets
from optimizer.specs import MODEL_FIELDS, ModelSpec

EXPECTED_IDS = {
    "gpt3-175b",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek-v3",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "nemotron4-15b",
    "nemotron4-340b",
    "gpt-oss-120b",
    "llama4-scout",
    "llama4-maverick",
}


def _raw_presets() -> dict:
    text = resources.files("optimizer").joinpath("data/models.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


# ---------------------------------------------------------------- the data file


def test_all_expected_presets_present():
    assert set(load_model_presets()) == EXPECTED_IDS


def test_load_is_cached():
    assert load_model_presets() is load_model_presets()


@pytest.mark.parametrize("preset_id", sorted(EXPECTED_IDS))
def test_preset_is_sourced_and_consistent(preset_id):
    preset = load_model_presets()[preset_id]
    assert isinstance(preset, ModelPreset)
    assert preset.id == preset_id
    assert len(preset.source) > 10
    assert preset.published_total_params > 0
    assert (preset.published_active_params is not None) == (preset.moe is not None)
    if preset.moe is not None:
        assert preset.published_active_params < preset.published_total_params


@pytest.mark.parametrize("preset_id", sorted(EXPECTED_IDS))
def test_architecture_has_exactly_the_model_fields(preset_id):
    arch = load_model_presets()[preset_id].architecture()
    assert tuple(arch) == MODEL_FIELDS
    assert arch["mla"] is None or type(arch["mla"]) is dict
    assert arch["moe"] is None or type(arch["moe"]) is dict
    # a copy: mutating it does not touch the cached preset
    if arch["moe"] is not None:
        original = arch["moe"]["top_k"]
        arch["moe"]["top_k"] = original + 1
        assert load_model_presets()[preset_id].architecture()["moe"]["top_k"] == original


@pytest.mark.parametrize("preset_id", sorted(EXPECTED_IDS))
def test_preset_resolves_to_complete_spec(preset_id):
    spec = ModelSpec(preset=preset_id)
    for field in MODEL_FIELDS:
        if field not in ("mla", "moe", "sliding_window"):  # optional blocks
            assert getattr(spec, field) is not None, field
    assert spec.num_attention_heads % spec.num_kv_heads == 0


def test_nemotron_squared_relu_is_mapped_to_two_matrix_mlp():
    for pid in ("nemotron4-15b", "nemotron4-340b"):
        preset = load_model_presets()[pid]
        assert preset.activation == "gelu"
        assert preset.note and "squared ReLU" in preset.note


def test_broken_preset_fails_at_load_naming_its_id():
    data = _raw_presets()
    broken = copy.deepcopy(data)
    broken["models"]["llama3-8b"]["num_kv_heads"] = 7  # 32 heads not divisible by 7
    with pytest.raises(PresetLoadError, match="llama3-8b") as exc:
        parse_model_presets(broken, origin="test.toml")
    assert "num_kv_heads" in str(exc.value)

    unknown_key = copy.deepcopy(data)
    unknown_key["models"]["mixtral-8x7b"]["experts"] = 8
    with pytest.raises(PresetLoadError, match="mixtral-8x7b"):
        parse_model_presets(unknown_key)

    bad_moe = copy.deepcopy(data)
    bad_moe["models"]["deepseek-v3"]["moe"]["top_k"] = 999
    with pytest.raises(PresetLoadError, match="deepseek-v3"):
        parse_model_presets(bad_moe)

    no_active = copy.deepcopy(data)
    del no_active["models"]["qwen3-30b-a3b"]["published_active_params"]
    with pytest.raises(PresetLoadError, match="qwen3-30b-a3b"):
        parse_model_presets(no_active)

    with pytest.raises(PresetLoadError):
        parse_model_presets({"presets": {}})


# ---------------------------------------------------------------- ModelSpec with presets


def test_llama3_70b_resolves_with_all_fields():
    spec = ModelSpec(preset="llama3-70b")
    assert spec.preset == "llama3-70b"
    assert spec.architecture() == {
        "name": "Llama 3 70B",
        "num_layers": 80,
        "hidden_size": 8192,
        "ffn_hidden_size": 28672,
        "num_attention_heads": 64,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "activation": "swiglu",
        "tied_embeddings": False,
        "mla": None,
        "moe": None,
        "sliding_window": None,
        "sliding_window_every": 1,
        "dropout": 0.0,
    }


def test_explicit_field_overrides_preset():
    spec = ModelSpec(preset="llama3-70b", num_layers=40)
    assert spec.num_layers == 40
    assert spec.hidden_size == 8192  # the rest still comes from the preset
    assert spec.num_kv_heads == 8


def test_explicit_moe_override_replaces_preset_moe():
    spec = ModelSpec(preset="mixtral-8x7b", moe={"num_experts": 16, "top_k": 4, "expert_ffn_hidden_size": 4096})
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.top_k, spec.moe.expert_ffn_hidden_size) == (16, 4, 4096)


def test_unknown_preset_lists_valid_ids():
    with pytest.raises(ValidationError) as exc:
        ModelSpec(preset="llama9-1t")
    message = str(exc.value)
    assert "llama9-1t" in message
    for pid in EXPECTED_IDS:
        assert pid in message


# ---------------------------------------------------------------- ModelSpec rejects bad specs


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(ValidationError) as exc:
        ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=8, num_kv_heads=3, vocab_size=100)
    assert "num_attention_heads" in str(exc.value) and "num_kv_heads" in str(exc.value)


def test_preset_with_bad_kv_override():
    with pytest.raises(ValidationError, match="num_kv_heads"):
        ModelSpec(preset="llama3-8b", num_kv_heads=5)


def test_top_k_greater_than_experts():
    with pytest.raises(ValidationError) as exc:
        ModelSpec(
            num_layers=2,
            hidden_size=64,
            num_attention_heads=8,
            vocab_size=100,
            moe={"num_experts": 4, "top_k": 5, "expert_ffn_hidden_size": 32},
        )
    assert "top_k" in str(exc.value) and "num_experts" in str(exc.value)


def test_missing_fields_without_preset():
    with pytest.raises(ValidationError) as exc:
        ModelSpec(hidden_size=64)
    message = str(exc.value)
    for field in ("num_layers", "num_attention_heads", "vocab_size"):
        assert field in message
    assert "preset" in message


def test_hidden_not_divisible_by_heads_needs_head_dim():
    with pytest.raises(ValidationError, match="head_dim"):
        ModelSpec(num_layers=2, hidden_size=60, num_attention_heads=8, vocab_size=100)
    assert ModelSpec(num_layers=2, hidden_size=60, num_attention_heads=8, head_dim=8, vocab_size=100).head_dim == 8


def test_first_dense_layers_beyond_num_layers():
    with pytest.raises(ValidationError, match="first_dense_layers"):
        ModelSpec(preset="deepseek-v3", num_layers=2)


def test_unknown_field_rejected():
    with pytest.raises(ValidationError, match="num_heads"):
        ModelSpec(preset="llama3-8b", num_heads=32)
