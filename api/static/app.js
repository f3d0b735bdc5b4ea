// The planner's web page: a job form, ranked plans, and charts of /plan and /sweeps answers.
// Every request goes to this service; charts use the plotly.js bundle served at /static/vendor.
"use strict";

const $ = (selector) => document.querySelector(selector);
const form = $("#job-form");
const TIME_PARTS = ["compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"];
const MEMORY_PARTS = ["weights", "gradients", "optimizer", "activations", "buffers", "optimizer_step"];
const PLOT_CONFIG = { displayModeBar: false, responsive: true };
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
let lastPlans = [];

// ---- small helpers -------------------------------------------------------------------------
function getPath(obj, path) {
  return path.split(".").reduce((o, key) => (o == null ? undefined : o[key]), obj);
}

function setPath(obj, path, value) {
  const keys = path.split(".");
  const last = keys.pop();
  keys.reduce((o, key) => (o[key] ??= {}), obj)[last] = value;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

function setState(state, message = "") {
  document.body.dataset.state = state;
  $("#status").textContent = message;
}

async function getJson(url, options) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({ detail: response.statusText }));
  return { status: response.status, body };
}

const fmt = {
  s: (x) => `${x.toFixed(3)} s`,
  pct: (x) => `${(100 * x).toFixed(1)}%`,
  int: (x) => Math.round(x).toLocaleString("en-US"),
  gib: (x) => x.toFixed(1),
};

// ---- form <-> job ----------------------------------------------------------------------------
function fields() {
  return [...form.elements].filter((e) => e.name);
}

// the job the page was opened with (a link): fields the form has no box for are kept from it
let baseJob = {};

function deletePath(obj, path) {
  const keys = path.split(".");
  const last = keys.pop();
  const parent = keys.reduce((o, key) => (o == null ? undefined : o[key]), obj);
  if (parent != null) delete parent[last];
}

function formToJob() {
  const job = structuredClone(baseJob);
  for (const field of fields()) {
    const raw = field.value.trim();
    if (raw === "") {
      deletePath(job, field.name);
      continue;
    }
    let value = raw;
    if (field.type === "number") value = Number(raw);
    else if (field.dataset.type === "int") value = parseInt(raw, 10);
    else if (field.dataset.type === "bool") value = raw === "true";
    setPath(job, field.name, value);
  }
  return job;
}

function jobToForm(job) {
  for (const field of fields()) {
    const value = getPath(job, field.name);
    if (value != null) field.value = String(value);
    else field.value = field.tagName === "SELECT" && !field.querySelector('option[value=""]') ? field.options[0].value : "";
  }
  const custom = fields().some((f) => f.name.startsWith("model.") && f.name !== "model.preset" && f.value);
  $("#custom-model").open = custom;
}

function jobFromUrl() {
  const text = new URLSearchParams(location.search).get("job");
  if (!text) return null;
  try {
    baseJob = JSON.parse(text);
    return baseJob;
  } catch (err) {
    showFormError(`the job in the link is not JSON: ${err.message}`);
    return null;
  }
}

// ---- errors ----------------------------------------------------------------------------------
function clearErrors() {
  document.querySelectorAll("[data-for]").forEach((node) => node.remove());
  $("#form-error").hidden = true;
}

function showFormError(message) {
  $("#form-error").textContent = message;
  $("#form-error").hidden = false;
}

// the form field an error is at: the field itself or, for an error at a whole section (loc
// "training"), its first field; an error at a field the form has no box for has none
function fieldFor(loc) {
  const path = loc.filter((part) => part !== "body").map(String);
  for (let n = path.length; n > 0; n--) {
    const name = path.slice(0, n).join(".");
    const field = fields().find((f) => f.name === name) ??
      (n === path.length ? fields().find((f) => f.name.startsWith(`${name}.`)) : undefined);
    if (field) return field;
  }
  return null;
}

function showErrors(detail) {
  if (!Array.isArray(detail)) return showFormError(String(detail));
  for (const item of detail) {
    const field = fieldFor(item.loc ?? []);
    const where = (item.loc ?? []).filter((p) => p !== "body").join(".");
    if (!field) {
      showFormError(`${where}: ${item.msg}`);
      continue;
    }
    const details = field.closest("details");
    if (details) details.open = true;
    const note = el("span", { class: "error", "data-testid": "error", "data-for": field.name }, item.msg);
    field.closest("label").after(note);
  }
}

// ---- planning --------------------------------------------------------------------------------
async function runPlan(job) {
  clearErrors();
  setState("running", "Planning…");
  $("#plan-button").disabled = true;
  try {
    const { status, body } = await getJson("/plan", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(job),
    });
    if (status !== 200) {
      showErrors(body.detail);
      setState("error", `HTTP ${status}`);
      return;
    }
    render(body);
    setState("done", "");
  } catch (err) {
    showFormError(`request failed: ${err.message}`);
    setState("error", "");
  } finally {
    $("#plan-button").disabled = false;
  }
}

function layoutText(c) {
  const parts = [`TP${c.tp}`, `PP${c.pp}`, `DP${c.dp}`];
  if (c.cp > 1) parts.push(`CP${c.cp}`);
  if (c.ep > 1) parts.push(`EP${c.ep}`);
  if (c.etp > 1) parts.push(`ETP${c.etp}`);
  if (c.vpp > 1) parts.push(`VPP${c.vpp}`);
  parts.push(`mbs ${c.micro_batch_size}`, `ZeRO-${c.zero_stage}`, `recompute ${c.recompute}`);
  return parts.join(" ");
}

// a framework's launch text (its `<name>_env` fields are objects)
const isLaunchText = (value) => typeof value === "string" && value !== "";

function frameworksOf(plan) {
  return plan.frameworks ?? Object.keys(plan.launch ?? {}).filter((k) => isLaunchText(plan.launch[k]));
}

function render(response) {
  lastPlans = response.plans;
  $("#results").hidden = false;
  const lines = [`Status: ${response.status}; solver ${response.solver.wall_time_s.toFixed(2)} s.`];
  if (response.explanation) lines.push(response.explanation);
  lines.push(...response.warnings);
  $("#summary").textContent = lines.join(" ");
  const suggestions = response.suggestions ?? [];
  $("#suggestions").replaceChildren(...suggestions.map((s) => el("li", { "data-num-gpus": s.num_gpus, "data-tokens-per-s": s.tokens_per_s },
    `Try ${fmt.int(s.num_gpus)} GPUs: ${fmt.int(s.tokens_per_s)} tokens/s (${fmt.int(s.tokens_per_s_per_gpu)} per GPU). ${s.reason}`)));
  $("#suggestions").hidden = !suggestions.length;
  const body = $("#plans tbody");
  body.replaceChildren(...response.plans.flatMap(planRows));
  timeChart(response.plans);
  memoryChart(response.plans[0], 0);
}

function planRows(plan, i) {
  const m = plan.memory_gib;
  const cells = [
    ["rank", `${i + 1}`], ["layout", layoutText(plan.config)],
    ["placement", Object.entries(plan.placement).filter(([, t]) => t !== "none").map(([a, t]) => `${a}:${t}`).join(" ")],
    ["step_time_s", fmt.s(plan.step_time_s)], ["tokens_per_s_per_gpu", fmt.int(plan.tokens_per_s_per_gpu)],
    ["mfu", fmt.pct(plan.mfu)], ["memory", `${fmt.gib(m.total)} / ${fmt.gib(m.capacity - (m.headroom ?? 0))}`],
    ["bottleneck", plan.bottleneck], ["frameworks", frameworksOf(plan).join(", ")],
  ];
  const row = el("tr", { "data-testid": "plan-row", class: plan.fits_memory ? "" : "over" },
    ...cells.map(([field, text]) => el("td", { "data-field": field }, text)));
  const detail = el("tr", { class: "detail", hidden: "" }, el("td", { colspan: cells.length }, planDetail(plan)));
  row.tabIndex = 0;
  row.addEventListener("click", () => {
    detail.hidden = !detail.hidden;
    memoryChart(plan, i);
  });
  row.addEventListener("keydown", (event) => event.key === "Enter" && row.click());
  return [row, detail];
}

function planDetail(plan) {
  const breakdown = el("table", { class: "breakdown" }, el("tr", {}, el("th", {}, "step time part"), el("th", {}, "s"), el("th", {}, "share")));
  for (const part of TIME_PARTS) {
    const s = plan.time_breakdown_s[part] ?? 0;
    breakdown.append(el("tr", {}, el("td", {}, part), el("td", {}, s.toFixed(4)), el("td", {}, fmt.pct(s / plan.step_time_s))));
  }
  const notes = el("ul", { class: "notes" }, ...plan.notes.map((n) => el("li", {}, n)));
  // each framework's text, after the environment variables its launch sets (`<name>_env`)
  const launches = Object.entries(plan.launch ?? {}).filter(([, text]) => isLaunchText(text));
  const launch = launches.map(([name, args]) => {
    const env = Object.entries(plan.launch[`${name}_env`] ?? {}).map(([k, v]) => `export ${k}=${v}`);
    const text = [...env, args].join("\n");
    const copy = el("button", { type: "button", class: "copy" }, "Copy");
    copy.addEventListener("click", (event) => {
      event.stopPropagation();
      copyText(text).then(() => (copy.textContent = "Copied"));
    });
    return el("div", { class: "launch" }, el("h4", {}, name, " ", copy), el("pre", {}, text));
  });
  return el("div", {}, capacityLine(plan), breakdown, notes, ...launch);
}

function capacityLine(plan) {
  const ttt = plan.time_to_train;
  const parts = [["goodput_fraction", plan.goodput?.fraction, (x) => `goodput ${fmt.pct(x)}`],
    ["time_to_train_days", ttt?.days, (x) => `${x.toFixed(1)} days to train`],
    ["cost_usd", ttt?.cost_usd, (x) => `$${fmt.int(x)}`]].filter(([, value]) => value != null);
  return el("p", { class: "capacity", "data-testid": "capacity" },
    ...parts.map(([field, value, text]) => el("span", { "data-field": field, "data-value": value }, text(value), " ")));
}

async function copyText(text) {
  if (navigator.clipboard) return navigator.clipboard.writeText(text);
  const area = el("textarea", {}, text);
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

// ---- charts ----------------------------------------------------------------------------------
function timeChart(plans) {
  const x = plans.map((_, i) => `plan ${i + 1}`);
  const traces = TIME_PARTS.filter((part) => plans.some((p) => p.time_breakdown_s[part] > 0))
    .map((part) => ({ type: "bar", name: part, x, y: plans.map((p) => p.time_breakdown_s[part] ?? 0) }));
  Plotly.react("time-chart", traces, {
    title: { text: "Step time by part (exposed seconds)" }, barmode: "stack",
    xaxis: { type: "category" }, yaxis: { title: { text: "s" } }, margin: { t: 40 },
  }, PLOT_CONFIG);
}

function memoryChart(plan, index) {
  if (!plan) return Plotly.purge("memory-chart");
  const m = plan.memory_gib;
  const stages = m.per_stage?.length ? m.per_stage : [m];
  const x = stages.map((_, s) => `stage ${s}`);
  const traces = MEMORY_PARTS.map((part) => ({ type: "bar", name: part, x, y: stages.map((st) => st[part]) }));
  const usable = m.capacity - (m.headroom ?? 0);
  Plotly.react("memory-chart", traces, {
    title: { text: `Memory per pipeline stage, plan #${index + 1} (GiB per GPU)` }, barmode: "stack",
    yaxis: { title: { text: "GiB" }, range: [0, 1.08 * Math.max(m.capacity, ...stages.map((st) => st.total))] },
    shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: m.capacity, y1: m.capacity, line: { color: "#c00", dash: "dash" } },
      { type: "line", xref: "paper", x0: 0, x1: 1, y0: usable, y1: usable, line: { color: "#c80", dash: "dot" } }],
    annotations: [{ xref: "paper", x: 1, y: m.capacity, text: `capacity ${fmt.gib(m.capacity)}`, showarrow: false, yanchor: "bottom", xanchor: "right" }],
    margin: { t: 40 },
  }, PLOT_CONFIG);
}

// ---- sweeps ----------------------------------------------------------------------------------
let sweepId = null;
let lastSweep = null;
const SWEEP_METRICS = {
  throughput: { title: "Throughput against GPU count", axis: "tokens/s", of: (plan) => plan?.tokens_per_s },
  days: { title: "Time to train against GPU count", axis: "days", of: (plan) => plan?.time_to_train?.days ?? plan?.time_to_train_days },
};

function sweepMessage(text, isError = false) {
  $("#sweep-status").textContent = isError ? "" : text;
  $("#sweep-error").textContent = isError ? text : "";
  $("#sweep-error").hidden = !isError;
}

async function startSweep() {
  const counts = $("#sweep-gpus").value.split(/[\s,]+/).filter(Boolean).map(Number);
  if (!counts.length || counts.some((n) => !Number.isInteger(n) || n < 1)) {
    return sweepMessage("GPU counts: whole numbers separated by commas", true);
  }
  const job = formToJob();
  job.search = { ...job.search, top_k: 1 };  // a sweep plans each point's best plan only
  delete job.search.suggest;
  const { status, body } = await getJson("/sweeps", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ job, vary: { num_gpus: counts } }),
  });
  if (status === 404) return sweepMessage("this server does not run sweeps", true);
  if (status !== 202 && status !== 200) {
    const where = (d) => d.loc.slice(1).join(".");
    const line = (d) => (d.msg.startsWith(`${where(d)}:`) ? d.msg : `${where(d)}: ${d.msg}`);
    const detail = Array.isArray(body.detail) ? body.detail.map(line).join("; ") : body.detail;
    return sweepMessage(detail, true);
  }
  sweepId = body.id;
  $("#sweep-cancel").hidden = false;
  $("#sweep-progress").hidden = false;
  document.body.dataset.sweep = "running";
  pollSweep(body.id);
}

async function pollSweep(id) {
  const { status, body } = await getJson(`/sweeps/${encodeURIComponent(id)}`);
  if (id !== sweepId) return;
  if (status !== 200) return sweepMessage(`sweep ${id}: HTTP ${status}`, true);
  $("#sweep-progress").max = Math.max(body.total, 1);
  $("#sweep-progress").value = body.done;
  sweepMessage(`${body.status}: ${body.done} of ${body.total} points`);
  sweepWarnings(body);
  sweepChart(body);
  if (body.status === "running") return setTimeout(() => pollSweep(id), 500);
  $("#sweep-cancel").hidden = true;
  document.body.dataset.sweep = body.status;
}

// The sweep's warnings, then each point's (named by its values), each text once.
function sweepWarnings(sweep) {
  const seen = new Set(sweep.warnings ?? []);
  const lines = [...seen];
  for (const r of sweep.results ?? []) {
    for (const w of r.warnings ?? []) {
      if (seen.has(w)) continue;
      seen.add(w);
      lines.push(`${Object.entries(r.point).map(([k, v]) => `${k}=${v}`).join(", ")}: ${w}`);
    }
  }
  const list = $("#sweep-warnings");
  list.replaceChildren(...lines.map((text) => Object.assign(document.createElement("li"), { textContent: text })));
  list.hidden = lines.length === 0;
}

function sweepPoint(item, metric) {
  const gpus = item.point?.num_gpus ?? item.num_gpus ?? item.point?.cluster?.num_gpus;
  return { gpus, y: metric.of(item.plan ?? item) };
}

function sweepChart(sweep = lastSweep) {
  lastSweep = sweep;
  const hasDays = sweep.results.some((r) => r.plan?.time_to_train);
  const select = $("#sweep-metric");
  select.options[1].disabled = !hasDays;
  if (!hasDays) select.value = "throughput";
  const metric = SWEEP_METRICS[select.value];
  const byGpus = (items) => items.map((i) => sweepPoint(i, metric)).filter((p) => p.y != null).sort((a, b) => a.gpus - b.gpus);
  const points = byGpus(sweep.results.filter((r) => r.plan));
  const front = byGpus(sweep.pareto ?? []);
  $("#sweep-chart").hidden = false;
  Plotly.react("sweep-chart", [
    { type: "scatter", mode: "markers", name: "best plan", marker: { size: 11 }, x: points.map((p) => p.gpus), y: points.map((p) => p.y) },
    { type: "scatter", mode: "lines+markers", name: "Pareto front", x: front.map((p) => p.gpus), y: front.map((p) => p.y) },
  ], {
    title: { text: metric.title }, xaxis: { title: { text: "GPUs" } },
    yaxis: { title: { text: metric.axis } }, margin: { t: 40 },
  }, PLOT_CONFIG);
}

async function cancelSweep() {
  if (sweepId) await fetch(`/sweeps/${encodeURIComponent(sweepId)}`, { method: "DELETE" });
}

// ---- Hugging Face config.json ------------------------------------------------------------------
function hfToModel(config) {
  const cfg = config.text_config ?? config;
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
    $("#hf-status").textContent = `cannot import this config: ${err.message}`;
  }
}

// ---- start-up --------------------------------------------------------------------------------
async function loadCatalogs() {
  const [models, clusters] = await Promise.all([getJson("/models"), getJson("/clusters")]);
  $("#model-preset").append(...models.body.map((m) => el("option", { value: m.id }, `${m.id} (${m.name})`)));
  $("#cluster-preset").append(...clusters.body.map((c) => el("option", { value: c.id }, `${c.id} (${c.gpu})`)));
  $("#model-preset").value = "llama3-70b";
  $("#cluster-preset").value = "dgx-h100";
}

async function main() {
  await loadCatalogs();
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const job = formToJob();
    history.replaceState(null, "", `?job=${encodeURIComponent(JSON.stringify(job))}`);
    runPlan(job);
  });
  $("#hf-import").addEventListener("click", importHfConfig);
  $("#hf-file").addEventListener("change", importHfFile);
  $("#sweep-start").addEventListener("click", startSweep);
  $("#sweep-cancel").addEventListener("click", cancelSweep);
  $("#sweep-metric").addEventListener("change", () => lastSweep && sweepChart());
  const job = jobFromUrl();
  if (job) {
    jobToForm(job);
    runPlan(job);
  } else {
    setState("idle");
  }
}

main();
