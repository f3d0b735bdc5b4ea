// Hugging Face config.json import: the architecture keys of a config as the planner's model fields.
"use strict";

const HF_KEYS = {
  num_hidden_layers: "num_layers", hidden_size: "hidden_size", intermediate_size: "ffn_hidden_size",
  num_attention_heads: "num_attention_heads", num_key_value_heads: "num_kv_heads", head_dim: "head_dim",
  vocab_size: "vocab_size", tie_word_embeddings: "tied_embeddings",
  num_local_experts: "moe.num_experts", n_routed_experts: "moe.num_experts", num_experts: "moe.num_experts",
  num_experts_per_tok: "moe.top_k", moe_intermediate_size: "moe.expert_ffn_hidden_size",
  n_shared_experts: "moe.num_shared_experts", first_k_dense_replace: "moe.first_dense_layers",
  decoder_sparse_step: "moe.layer_frequency", moe_layer_freq: "moe.layer_frequency",
  q_lora_rank: "mla.q_lora_rank", kv_lora_rank: "mla.kv_lora_rank",
  qk_nope_head_dim: "mla.qk_nope_head_dim", qk_rope_head_dim: "mla.qk_rope_head_dim", v_head_dim: "mla.v_head_dim",
};

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
// keys that only a model's config.json has (a tokenizer's config may name a vocab_size too)
const ARCHITECTURE_KEYS = Object.keys(HF_KEYS).filter((key) => !["vocab_size", "tie_word_embeddings"].includes(key));

// the model fields of a config.json; an Error for JSON that is not one
function hfToModel(config) {
  if (!isObject(config)) throw new Error("not a JSON object");
  const cfg = isObject(config.text_config) ? config.text_config : config;
  if (!ARCHITECTURE_KEYS.some((key) => cfg[key] != null)) {
    throw new Error("no architecture keys (such as num_hidden_layers, hidden_size) in this JSON: is it a model's config.json? The form is unchanged");
  }
  const model = {};
  for (const [key, path] of Object.entries(HF_KEYS)) {
    if (cfg[key] != null) setPath(model, path, cfg[key]);
  }
  if (model.moe && model.moe.expert_ffn_hidden_size == null) model.moe.expert_ffn_hidden_size = cfg.intermediate_size;
  llama4Layers(cfg, model);
  if (cfg.shared_expert_intermediate_size != null && model.moe) {  // Qwen2-MoE: one shared expert
    model.moe.num_shared_experts ??= 1;
    model.moe.shared_expert_ffn_hidden_size = cfg.shared_expert_intermediate_size;
  }
  const windowNote = slidingWindow(cfg, model);
  if (windowNote) Object.defineProperty(model, "importNote", { value: windowNote, enumerable: false });
  const act = String(cfg.hidden_act ?? cfg.hidden_activation ?? "");
  if (act) model.activation = /silu|swish/.test(act) ? "swiglu" : "gelu";
  model.name = config._name_or_path || config.model_type || "imported";
  return model;
}

// Llama 4: the experts' FFN is intermediate_size, the dense layers' intermediate_size_mlp, one shared
// expert in every MoE layer, and layer i is MoE when (i + 1) % interleave_moe_layer_step == 0.
function llama4Layers(cfg, model) {
  if (cfg.intermediate_size_mlp == null || !model.moe) return;
  model.ffn_hidden_size = cfg.intermediate_size_mlp;
  model.moe.num_shared_experts ??= 1;
  model.moe.shared_expert_ffn_hidden_size ??= cfg.intermediate_size;
  const step = cfg.interleave_moe_layer_step ?? 1;
  if (step > 1) Object.assign(model.moe, { layer_frequency: step, first_dense_layers: step - 1 });
}

// Banded attention: the layers layer_types marks "sliding_attention"; else every layer but each
// sliding_window_pattern-th (Gemma 3, Cohere2), every other layer from the first (Gemma 2), or every
// layer (Mistral). Qwen configs carry a window with use_sliding_window false. The planner windows
// every k-th layer from the first: another pattern is imported without its window, and said so.
function slidingWindow(cfg, model) {
  if (cfg.sliding_window == null || cfg.use_sliding_window === false) return null;
  const layers = cfg.num_hidden_layers ?? 0;
  const pattern = cfg.sliding_window_pattern;
  const windowed = (i) =>
    cfg.layer_types ? cfg.layer_types[i] === "sliding_attention"
    : pattern ? (i + 1) % pattern !== 0
    : /^gemma2/.test(cfg.model_type ?? "") ? i % 2 === 0
    : true;
  const ids = [...Array(layers).keys()].filter(windowed);
  if (!ids.length) return null;
  const every = ids.length > 1 ? ids[1] - ids[0] : layers;
  if (ids[0] !== 0 || ids.some((i, n) => i !== n * every) || ids.length !== Math.ceil(layers / every)) {
    return `its ${cfg.sliding_window}-token window on ${ids.length} of ${layers} layers follows a pattern the ` +
      "planner does not model (it windows every k-th layer from the first): imported without it, as full attention";
  }
  Object.assign(model, { sliding_window: cfg.sliding_window, sliding_window_every: every });
  return null;
}

async function importHfFile() {
  const file = $("#hf-file").files[0];
  if (!file) return;
  $("#hf-config").value = await file.text();
  importHfConfig();
}

function importHfConfig() {
  try {
    const model = hfToModel(JSON.parse($("#hf-config").value));
    for (const field of fields().filter((f) => f.name.startsWith("model."))) field.value = "";
    jobToForm({ ...formToJob(), model });
    $("#hf-status").textContent = `imported ${model.name}` + (model.importNote ? `; ${model.importNote}` : "");
  } catch (err) {
    $("#hf-status").textContent = `cannot import: ${err.message}`;
  }
}
