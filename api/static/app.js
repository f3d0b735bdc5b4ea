// The planner's web page: a job form, ranked plans, and charts of /plan and /sweeps answers.
// Every request goes to this service; charts use the plotly.js bundle served at /static/vendor.
// Loaded last: common.js, hf.js, plans.js, compare.js and sweep.js define what this file uses.
"use strict";

// ---- form <-> job ----------------------------------------------------------------------------
function fields() {
  return [...form.elements].filter((e) => e.name);
}

// the job the page was opened with (a link): fields the form has no box for are kept from it
let baseJob = {};

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
  $("#custom-model").open = fields().some((f) => isCustomModelField(f) && f.value);
  updatePresetNote();
  echoTokens();
  showLinkExtras();
}

const isCustomModelField = (field) => field.name.startsWith("model.") && field.name !== "model.preset";

// Under a preset, every other model field overrides it: the note next to the preset says which.
function updatePresetNote() {
  const model = formToJob().model ?? {};
  const overrides = model.preset ? modelOverrides(model) : [];
  const note = $("#preset-note");
  note.textContent = overrides.length
    ? `${plural(overrides.length, "preset field")} overridden: ${overrides.map(([path]) => path).join(", ")}` : "";
  note.hidden = !overrides.length;
}

// Choosing a preset plans that model: the custom architecture (typed, imported or from a link) goes.
function choosePreset() {
  if ($("#model-preset").value) {
    for (const field of fields().filter(isCustomModelField)) field.value = "";
    delete baseJob.model;
    $("#hf-status").textContent = "";
    showLinkExtras();
  }
  updatePresetNote();
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

// The link's fields the form has no box for (search.allow.tp, reliability.*, ...): each is sent with
// every later request, so a line under the form lists them, each with a button that clears it.
function linkExtras(obj = baseJob, prefix = "") {
  const names = fields().map((f) => f.name);
  return Object.entries(obj ?? {}).flatMap(([key, value]) => {
    const path = `${prefix}${key}`;
    if (names.includes(path)) return [];
    const isObject = value !== null && typeof value === "object" && !Array.isArray(value);
    return isObject ? linkExtras(value, `${path}.`) : [[path, value]];
  });
}

function showLinkExtras() {
  const found = linkExtras();
  const items = found.map(([path, value]) => {
    const text = JSON.stringify(value);
    const clear = el("button", { type: "button", "aria-label": `clear ${path}` }, "clear");
    clear.addEventListener("click", () => {
      deletePath(baseJob, path);
      showLinkExtras();
    });
    return el("span", { class: "extra", "data-path": path },
      el("code", {}, `${path} = ${text.length > 60 ? `${text.slice(0, 57)}...` : text}`), " ", clear);
  });
  $("#link-extras").replaceChildren("Also from the link (no box on the form; sent with each Plan and sweep): ", ...items);
  $("#link-extras").hidden = !items.length;
}

// the token budget in words next to its box: "= 15 trillion tokens"
function echoTokens() {
  const tokens = Number($('[name="training.total_tokens"]').value || NaN);
  const scales = [[1e12, "trillion"], [1e9, "billion"], [1e6, "million"], [1e3, "thousand"]];
  const [scale, word] = scales.find(([s]) => tokens >= s) ?? [1, null];
  const amount = [Number((tokens / scale).toPrecision(4)), word].filter(Boolean).join(" ");
  $("#tokens-echo").textContent = tokens > 0 ? `= ${amount} tokens` : "";
}

// ---- errors ----------------------------------------------------------------------------------
function clearErrors() {
  removeFieldErrors("[data-for]");
  $("#form-error").hidden = true;
}

// the field errors `selector` finds, and their ties to their fields
function removeFieldErrors(selector) {
  for (const node of document.querySelectorAll(selector)) {
    const field = form.elements.namedItem(node.dataset.for);
    const left = (field?.getAttribute("aria-describedby") ?? "").split(" ").filter((id) => id && id !== node.id);
    if (left.length) field.setAttribute("aria-describedby", left.join(" "));
    else field?.removeAttribute("aria-describedby");
    if (!left.length) field?.removeAttribute("aria-invalid");
    node.remove();
  }
}

function showFormError(message) {
  $("#form-error").textContent = message;
  $("#form-error").hidden = false;
}

// the form field an error is at: the field itself or, for an error at a whole section (loc
// "training"), the first of its fields the message names, else its first field; an error at a
// field the form has no box for has none
function fieldFor(loc, message = "") {
  const path = loc.filter((part) => part !== "body").map(String);
  const named = (f) => new RegExp(`\\b${f.name.split(".").pop()}\\b`).test(message);
  for (let n = path.length; n > 0; n--) {
    const name = path.slice(0, n).join(".");
    const section = n === path.length ? fields().filter((f) => f.name.startsWith(`${name}.`)) : [];
    const field = fields().find((f) => f.name === name) ?? section.find(named) ?? section[0];
    if (field) return field;
  }
  return null;
}

function showErrors(detail) {
  if (!Array.isArray(detail)) return showFormError(String(detail));
  const left = markFieldErrors(detail);
  if (left.length) showFormError(left.join("; "));
}

// A 422's messages next to the fields their `loc`s name (the first marked takes the focus); the
// lines of those at no field of the form ("search.allow.tp: ...") are returned.
function markFieldErrors(detail) {
  const left = [];
  for (const item of detail) {
    const field = fieldFor(item.loc ?? [], item.msg);
    const where = (item.loc ?? []).filter((p) => p !== "body").join(".");
    const message = item.msg.startsWith(`${where}: `) ? item.msg.slice(where.length + 2) : item.msg;
    if (field) showFieldError(field, field.name === where ? message : item.msg);
    else left.push(`${where}: ${message}`);
  }
  focusFirstError();
  return left;
}

// the message next to its field, tied to it for screen readers (aria-describedby)
let errorIds = 0;
function showFieldError(field, message) {
  const details = field.closest("details");
  if (details) details.open = true;
  const id = `field-error-${++errorIds}`;
  field.closest("label").after(el("span", { id, class: "error", "data-testid": "error", "data-for": field.name }, message));
  const ids = (field.getAttribute("aria-describedby") ?? "").split(" ").filter(Boolean);
  field.setAttribute("aria-describedby", [...ids, id].join(" "));
  field.setAttribute("aria-invalid", "true");
}

const focusFirstError = () => fields().find((f) => f.getAttribute("aria-invalid") === "true")?.focus();

// Number boxes holding text the browser cannot read as a number (their value is then ""): each is
// marked "not a number", the first takes the focus, and true says no request may go.
function markBadNumbers() {
  removeFieldErrors("[data-for].bad-number");
  const bad = fields().filter((f) => f.validity?.badInput);
  for (const field of bad) {
    showFieldError(field, "not a number");
    $(`[data-for="${field.name}"]`).classList.add("bad-number");
  }
  focusFirstError();
  return bad.length > 0;
}

// ---- planning --------------------------------------------------------------------------------
// Plans `job`; the address becomes its link once its plans are on the page.
async function runPlan(job) {
  clearErrors();
  setState("running", "Planning…");
  const results = $("#results");
  const shown = !results.hidden;
  if (shown) markStale(results, "Results for the previous job: planning the new one…", true);
  $("#plan-button").disabled = true;
  try {
    const { status, body } = await getJson("/plan", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(job),
    });
    if (status !== 200) {
      showErrors(body.detail);
      setState("error", refusalText(status));
      return;
    }
    render(body, job);
    resetCompare(job, body.plans);
    markStale(results);
    history.replaceState(null, "", `?job=${encodeURIComponent(JSON.stringify(job))}`);
    setState("done", "");
  } catch (err) {
    showFormError(err.message);
    setState("error", "");
  } finally {
    $("#plan-button").disabled = false;
    if (shown && document.body.dataset.state === "error") {
      markStale(results, "Results for the previous job: the new one failed (see above)");
    }
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
  try {
    await loadCatalogs();
  } catch (err) {
    showFormError(err.message);
    return setState("error", "");
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearErrors();
    if (markBadNumbers()) return setState("error", "fix the marked fields");
    runPlan(formToJob());
  });
  $("#model-preset").addEventListener("change", choosePreset);
  for (const event of ["input", "change"]) form.addEventListener(event, echoTokens);
  form.addEventListener("input", updatePresetNote);
  $("#hf-import").addEventListener("click", importHfConfig);
  $("#hf-file").addEventListener("change", importHfFile);
  compareForm().addEventListener("submit", runCompare);
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
