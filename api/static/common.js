// Shared by the page's scripts (loaded first): DOM and object helpers, number formats, requests.
"use strict";

const $ = (selector) => document.querySelector(selector);
const form = $("#job-form");
const TIME_PARTS = ["compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"];
const MEMORY_PARTS = ["weights", "gradients", "optimizer", "activations", "buffers", "optimizer_step"];
// One colour per category, the same in both plan charts and for every job (optimizer is in both)
const CATEGORY_COLOURS = {
  compute: "#4c78a8", tp_comm: "#f58518", cp_comm: "#eeca3b", ep_comm: "#72b7b2", pp_comm: "#9d755d",
  pp_bubble: "#bab0ac", dp_comm: "#ff9da6", optimizer: "#b279a2",
  weights: "#1f3a5f", gradients: "#e45756", activations: "#54a24b", buffers: "#9ecae9", optimizer_step: "#d6a5c9",
};
const PLOT_CONFIG = { displayModeBar: false, responsive: true };

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

// The answer's status and JSON body; a request that gets no answer throws "cannot reach the planner".
async function getJson(url, options) {
  let response;
  try {
    response = await fetch(url, options);
  } catch (err) {
    throw new Error(`cannot reach the planner at ${location.host}: ${err.message} (is the server running?)`);
  }
  const body = await response.json().catch(() => ({ detail: response.statusText }));
  return { status: response.status, body };
}

// what an answer's status means, in words
function refusalText(status) {
  const words = { 400: "bad request", 413: "request too large", 422: "invalid request", 429: "the planner is busy: try again shortly" };
  return words[status] ?? `the planner failed (HTTP ${status})`;
}

const fmt = {
  s: (x) => `${x.toFixed(3)} s`,
  pct: (x) => `${(100 * x).toFixed(1)}%`,
  int: (x) => Math.round(x).toLocaleString("en-US"),
  sig: (x, digits) => {  // `digits` significant digits, thousands separated
    const v = Number(x.toPrecision(digits));
    return Math.abs(v) >= 1000 ? fmt.int(v) : String(v);
  },
  usd: (x) => `$${x >= 0.01 ? x.toFixed(2) : x.toPrecision(2)}`,
  gib: (x) => x.toFixed(1),
  params: (x) => {
    const [scale, unit] = [[1e12, "T"], [1e9, "B"], [1e6, "M"]].find(([s]) => x >= s) ?? [1e3, "K"];
    return `${Number((x / scale).toPrecision(3))}${unit}`;
  },
};

// Results of an earlier request while a new one runs or after it failed: greyed out under a label
// that says so (no label: current again). The section is busy while `busy`.
function markStale(section, label = null, busy = false) {
  section.classList.toggle("stale", label !== null);
  section.setAttribute("aria-busy", String(busy));
  const note = section.querySelector(".stale-label");
  note.textContent = label ?? "";
  note.hidden = label === null;
}

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

// a model's fields besides its preset, as [dotted path, value] pairs
function modelOverrides(model) {
  const found = [];
  const walk = (obj, prefix) => {
    for (const [key, value] of Object.entries(obj ?? {})) {
      if (value !== null && typeof value === "object" && !Array.isArray(value)) walk(value, `${prefix}${key}.`);
      else if (`${prefix}${key}` !== "preset") found.push([`${prefix}${key}`, value]);
    }
  };
  walk(model, "");
  return found;
}

// deletes obj's field at `path`, and the objects it leaves empty
function deletePath(obj, path) {
  const keys = path.split(".");
  const last = keys.pop();
  const parent = keys.reduce((o, key) => (o == null ? undefined : o[key]), obj);
  if (parent == null) return;
  delete parent[last];
  if (keys.length && typeof parent === "object" && !Object.keys(parent).length) deletePath(obj, keys.join("."));
}
