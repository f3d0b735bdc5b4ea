// Shared by the page's scripts (loaded first): DOM and object helpers, number formats, requests.
"use strict";

const $ = (selector) => document.querySelector(selector);
const form = $("#job-form");
const TIME_PARTS = ["compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer"];
const MEMORY_PARTS = ["weights", "gradients", "optimizer", "activations", "buffers", "optimizer_step"];
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

function deletePath(obj, path) {
  const keys = path.split(".");
  const last = keys.pop();
  const parent = keys.reduce((o, key) => (o == null ? undefined : o[key]), obj);
  if (parent != null) delete parent[last];
}
