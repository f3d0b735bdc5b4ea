// "Compare your layout": the planned job scored under the user's layout and plan #1's through
// POST /compare (layouts [yours, plan #1]), so every delta reads plan #1 minus yours.
"use strict";

const compareForm = () => $("#compare-form");
const COMPARE_FIELDS = ["tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "zero_stage", "recompute"];
const COMPARE_NAMES = ["your layout", "plan #1"];
let compareJob = null;  // the planned job (without `search`) and plan #1's config
let comparePlanConfig = null;

// A new plan on the page: the boxes start at plan #1's layout and the old comparison goes.
function resetCompare(job, plans) {
  const plan = plans?.[0];
  $("#compare").hidden = !plan;
  clearCompare();
  $("#compare-result").hidden = true;
  delete document.body.dataset.compare;
  if (!plan) return;
  const { search, ...rest } = structuredClone(job);
  compareJob = rest;
  if (search?.memory_headroom_gib != null) compareJob.memory_headroom_gib = search.memory_headroom_gib;
  comparePlanConfig = plan.config;
  for (const name of COMPARE_FIELDS) compareForm().elements.namedItem(name).value = String(plan.config[name] ?? "");
}

// your layout from the boxes: an empty box is left out (the server's default)
function yourLayout() {
  const layout = {};
  for (const name of COMPARE_FIELDS) {
    const field = compareForm().elements.namedItem(name);
    const raw = field.value.trim();
    if (raw !== "") layout[name] = name === "recompute" ? raw : Number(raw);
  }
  return layout;
}

function compareBody() {
  return { ...compareJob, layouts: [yourLayout(), comparePlanConfig] };
}

function clearCompare() {
  for (const node of document.querySelectorAll("[data-compare-for]")) {
    const field = compareForm().elements.namedItem(node.dataset.compareFor);
    field.removeAttribute("aria-invalid");
    field.removeAttribute("aria-describedby");
    node.remove();
  }
  $("#compare-error").hidden = true;
}

function compareError(message) {
  $("#compare-error").textContent = message;
  $("#compare-error").hidden = false;
}

// A 422 at ["body", "layouts", 0, <field>] goes next to that box; anything else above the result.
function showCompareErrors(detail) {
  if (!Array.isArray(detail)) return compareError(String(detail));
  const left = [];
  for (const item of detail) {
    const loc = (item.loc ?? []).filter((p) => p !== "body");
    const where = loc.join(".");
    const message = item.msg.startsWith(`${where}: `) ? item.msg.slice(where.length + 2) : item.msg;
    const field = loc[0] === "layouts" && loc[1] === 0 && COMPARE_FIELDS.includes(loc[2])
      ? compareForm().elements.namedItem(loc[2]) : null;
    if (!field) {
      const who = loc[0] === "layouts" && loc[1] in COMPARE_NAMES ? `${COMPARE_NAMES[loc[1]]}, ${loc.slice(2).join(".")}` : where;
      left.push(`${who}: ${message}`);
      continue;
    }
    const id = `compare-error-${loc[2]}`;
    field.closest("label").after(el("span", { id, class: "error", "data-testid": "error", "data-compare-for": loc[2] }, message));
    field.setAttribute("aria-invalid", "true");
    field.setAttribute("aria-describedby", id);
  }
  if (left.length) compareError(left.join("; "));
  compareForm().querySelector('[aria-invalid="true"]')?.focus();
}

async function runCompare(event) {
  event.preventDefault();
  clearCompare();
  const bad = COMPARE_FIELDS.map((n) => compareForm().elements.namedItem(n)).filter((f) => f.validity?.badInput);
  if (bad.length) {
    showCompareErrors(bad.map((f) => ({ loc: ["body", "layouts", 0, f.name], msg: "not a number" })));
    document.body.dataset.compare = "error";
    return;
  }
  document.body.dataset.compare = "running";
  $("#compare-status").textContent = "Comparing…";
  $("#compare-button").disabled = true;
  try {
    const { status, body } = await getJson("/compare", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(compareBody()),
    });
    if (status !== 200) {
      showCompareErrors(body.detail);
      $("#compare-result").hidden = true;
      $("#compare-status").textContent = refusalText(status);
      document.body.dataset.compare = "error";
      return;
    }
    showComparison(body);
    $("#compare-status").textContent = "";
    document.body.dataset.compare = "done";
  } catch (err) {
    compareError(err.message);
    $("#compare-status").textContent = "";
    document.body.dataset.compare = "error";
  } finally {
    $("#compare-button").disabled = false;
  }
}

// a cell with its text and the exact number behind it
const valueCell = (field, value, text) => el("td", { "data-field": field, "data-value": JSON.stringify(value) }, text);
const signed = (x, digits) => `${x > 0 ? "+" : ""}${x.toFixed(digits)}`;

function showComparison(response) {
  const entries = response.entries;
  const rows = entries.map((entry, i) => {
    const p = entry.plan;
    const m = p.memory_gib;
    const usable = m.capacity - (m.headroom ?? 0);
    return el("tr", { "data-testid": "compare-entry", class: p.fits_memory ? "" : "over" },
      el("th", {}, COMPARE_NAMES[i] ?? `layout ${i}`), el("td", { "data-field": "layout" }, layoutText(p.config)),
      valueCell("step_time_s", p.step_time_s, fmt.s(p.step_time_s)), valueCell("mfu", p.mfu, fmt.pct(p.mfu)),
      valueCell("memory", [m.total, usable], `${fmt.gib(m.total)} / ${fmt.gib(usable)}`),
      valueCell("fits_memory", p.fits_memory, p.fits_memory ? "yes" : "no"),
      i === 0 ? el("td", { "data-field": "step_time_delta_s" }, "reference")
        : valueCell("step_time_delta_s", entry.step_time_delta_s, `${signed(entry.step_time_delta_s, 3)} s (${signed(100 * entry.relative, 1)}%)`));
  });
  $("#compare-entries tbody").replaceChildren(...rows);
  const other = entries[1] ?? { time_deltas_s: {}, memory_deltas_gib: {} };
  deltaRows("#compare-time-deltas", other.time_deltas_s, TIME_PARTS, (x) => `${signed(x, 4)} s`);
  deltaRows("#compare-memory-deltas", other.memory_deltas_gib, [...MEMORY_PARTS, "total"], (x) => `${signed(x, 2)} GiB`);
  $("#compare-summaries").replaceChildren(...entries.map((e) => el("li", { "data-testid": "compare-summary" }, e.summary)));
  const warnings = response.warnings ?? [];
  $("#compare-warnings ul").replaceChildren(...warnings.map((w) => el("li", {}, w)));
  $("#compare-warnings").hidden = !warnings.length;
  $("#compare-result").hidden = false;
}

// one row per category that differs, in the charts' order (any other category after them)
function deltaRows(selector, deltas, order, text) {
  const keys = [...order.filter((k) => k in deltas), ...Object.keys(deltas).filter((k) => !order.includes(k))];
  const rows = keys.map((k) => el("tr", {}, el("th", {}, k), valueCell(k, deltas[k], text(deltas[k]))));
  const table = $(selector);
  table.querySelector("tbody").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 2 }, "no difference"))]));
}
