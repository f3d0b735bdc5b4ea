// The sweep panel: POST /sweeps, progress by polling, the warnings, the chart and the points' table.
"use strict";

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

// The shown sweep's results, marked as the previous sweep's (label) or current again (null).
function sweepStale(label, busy = false) {
  if (lastSweep) markStale($("#sweep-results"), label && `Results for the previous sweep: ${label}`, busy);
}

async function startSweep() {
  const refused = (message) => {
    sweepStale("the new one did not start");
    sweepMessage(message, true);
    $("#sweep-start").disabled = false;
  };
  const counts = $("#sweep-gpus").value.split(/[\s,]+/).filter(Boolean).map(Number);
  if (!counts.length || counts.some((n) => !Number.isInteger(n) || n < 1)) {
    return refused("GPU counts: whole numbers separated by commas");
  }
  removeFieldErrors("[data-for]");
  if (markBadNumbers()) return refused("fix the marked fields of the form first");
  sweepStale("starting a new one…", true);
  $("#sweep-start").disabled = true;  // one sweep at a time: a second would hold a worker slot too
  const job = formToJob();
  job.search = { ...job.search, top_k: 1 };  // a sweep plans each point's best plan only
  delete job.search.suggest;
  let status, body;
  try {
    ({ status, body } = await getJson("/sweeps", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ job, vary: { num_gpus: counts } }),
    }));
  } catch (err) {
    return refused(err.message);
  }
  if (status === 404) return refused("this server does not run sweeps");
  if (status !== 202 && status !== 200) return refused(sweepRefusal(status, body.detail));
  sweepId = body.id;
  $("#sweep-cancel").hidden = false;
  $("#sweep-progress").hidden = false;
  document.body.dataset.sweep = "running";
  pollSweep(body.id);
}

// Why a sweep was refused: a message about the job ("body", "job", ...) goes next to the form's
// field it names, the rest (the GPU counts, fields without a box) are the returned line.
function sweepRefusal(status, detail) {
  if (!Array.isArray(detail)) return detail ?? refusalText(status);
  const atJob = (d) => d.loc?.[1] === "job";
  const unplaced = markFieldErrors(detail.filter(atJob).map((d) => ({ ...d, loc: ["body", ...d.loc.slice(2)] })));
  const lines = [...unplaced.map((line) => `job.${line}`), ...detail.filter((d) => !atJob(d)).map((d) => {
    const where = (d.loc ?? []).slice(1).join(".");
    return d.msg.startsWith(`${where}:`) ? d.msg : `${where}: ${d.msg}`;
  })];
  const marked = unplaced.length < detail.filter(atJob).length;
  return [...(marked ? [`${refusalText(status)}: see the marked fields of the form`] : []), ...lines].join("; ");
}

async function pollSweep(id) {
  let status, body;
  try {
    ({ status, body } = await getJson(`/sweeps/${encodeURIComponent(id)}`));
  } catch (err) {
    if (id === sweepId) sweepStopped(`${err.message}; the sweep is no longer followed`);
    return;
  }
  if (id !== sweepId) return;
  if (status !== 200) return sweepStopped(`sweep ${id}: ${body.detail ?? refusalText(status)}`);
  $("#sweep-progress").max = Math.max(body.total, 1);
  $("#sweep-progress").value = body.done;
  sweepMessage(`${body.status}: ${body.done} of ${body.total} points`);
  sweepWarnings(body);
  sweepChart(body);
  sweepTable(body);
  markStale($("#sweep-results"), null, body.status === "running");
  if (body.status === "running") return setTimeout(() => pollSweep(id), 500);
  $("#sweep-cancel").hidden = true;
  $("#sweep-start").disabled = false;
  document.body.dataset.sweep = body.status;
}

const pointName = (point) => Object.entries(point).map(([k, v]) => `${k}=${v}`).join(", ");
const MFU_WARNING = /^predicted MFU (\d+(?:\.\d+)?)% /;

// The sweep's warnings, then each point's (named by its values), each text once; as `pplan sweep`
// prints them, the MFU warnings of several points are one line with the points and their MFUs.
function sweepWarnings(sweep) {
  const lines = [...(sweep.warnings ?? [])];
  const seen = new Set(lines);
  const mfu = new Map();  // the rest of an MFU warning -> its line, points and MFUs
  for (const r of sweep.results ?? []) {
    for (const w of r.warnings ?? []) {
      const match = MFU_WARNING.exec(w);
      if (match) {
        const rest = w.slice(match[0].length);
        if (!mfu.has(rest)) mfu.set(rest, { at: lines.push("") - 1, points: [], values: [] });
        mfu.get(rest).points.push(pointName(r.point));
        mfu.get(rest).values.push(Number(match[1]));
      } else if (!seen.has(w)) {
        seen.add(w);
        lines.push(`${pointName(r.point)}: ${w}`);
      }
    }
  }
  for (const [rest, { at, points, values }] of mfu) {
    const [low, high] = [Math.min(...values), Math.max(...values)];
    const span = low === high ? `${low.toFixed(1)}%` : `${low.toFixed(1)}-${high.toFixed(1)}%`;
    lines[at] = `${points.join("; ")}: predicted MFU ${span} ${rest}`;
  }
  const list = $("#sweep-warnings");
  list.replaceChildren(...lines.map((text) => Object.assign(document.createElement("li"), { textContent: text })));
  list.hidden = lines.length === 0;
}

// Every point in GPU order: its status (with the reason when it has no plan), tokens/s and, with
// a token budget, days to train and cost.
function sweepTable(sweep) {
  const results = [...(sweep.results ?? [])].sort((a, b) => (a.point?.num_gpus ?? 0) - (b.point?.num_gpus ?? 0));
  const budget = results.some((r) => r.plan?.time_to_train);
  const none = "–";
  const columns = [["num_gpus", "GPUs", (r) => fmt.int(r.point?.num_gpus ?? NaN)],
    ["status", "Status", (r) => (r.plan || !r.explanation ? r.status : `${r.status}: ${r.explanation}`)],
    ["tokens_per_s", "Tokens/s", (r) => (r.plan ? fmt.int(r.plan.tokens_per_s) : none)]];
  if (budget) {
    const ttt = (r, f) => r.plan?.time_to_train?.[f];
    columns.push(["days", "Days to train", (r) => (ttt(r, "days") != null ? ttt(r, "days").toFixed(1) : none)],
      ["cost_usd", "Cost", (r) => (ttt(r, "cost_usd") != null ? `$${fmt.int(ttt(r, "cost_usd"))}` : none)]);
  }
  const table = $("#sweep-table");
  table.tHead.replaceChildren(el("tr", {}, ...columns.map(([, head]) => el("th", {}, head))));
  table.tBodies[0].replaceChildren(...results.map((r) => el("tr", { class: r.plan ? "" : "no-plan" },
    ...columns.map(([field, , text]) => el("td", { "data-field": field }, text(r))))));
  table.hidden = !results.length;
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

// A followed sweep that cannot be followed any more: an error, and nothing left to cancel.
function sweepStopped(message) {
  sweepMessage(message, true);
  $("#sweep-cancel").hidden = true;
  $("#sweep-progress").hidden = true;
  $("#sweep-start").disabled = false;
  document.body.dataset.sweep = "error";
  sweepStale(null);
}

async function cancelSweep() {
  if (!sweepId) return;
  try {
    await getJson(`/sweeps/${encodeURIComponent(sweepId)}`, { method: "DELETE" });
  } catch (err) {
    sweepStopped(`${err.message}; the sweep could not be cancelled`);
  }
}
