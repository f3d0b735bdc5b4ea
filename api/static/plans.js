// The /plan answer on the page: the ranked plans, each plan's detail and the two plan charts.
"use strict";

let lastPlans = [];

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
  return plan.frameworks ??
    Object.keys(plan.launch ?? {}).filter((k) => isLaunchText(plan.launch[k])).map((k) => LAUNCH_KINDS[k]?.[0] ?? k);
}

// What was planned, as the server resolved it (`planned`: preset and overrides applied): the model
// with its parameters, the GPUs, the precision and the framework. The job sent says whether the
// model is a preset, custom, or a preset with fields overridden.
function plannedLine(planned, job) {
  const model = job.model ?? {};
  const cluster = job.cluster ?? {};
  const p = planned ?? { model: model.preset ?? model.name ?? "unnamed model", gpu: cluster.gpu ?? cluster.preset ?? "GPU",
    num_gpus: cluster.num_gpus, precision: job.training?.precision ?? "bf16", framework: job.training?.framework };
  const overrides = model.preset ? modelOverrides(model) : [];
  let name = p.model;
  if (!model.preset) name += " (custom architecture)";
  else if (overrides.length) {
    const changed = overrides.map(([path, value]) => `${path} ${value}`).join(", ");
    name += ` with ${plural(overrides.length, "preset field")} overridden (${changed})`;
  }
  if (p.total_params != null) {
    const active = p.active_params != null && p.active_params !== p.total_params ? ` (${fmt.params(p.active_params)} active)` : "";
    name += `, ${fmt.params(p.total_params)} parameters${active},`;
  }
  const gpus = p.num_gpus != null ? `${fmt.int(p.num_gpus)} × ${p.gpu}` : `${p.gpu} (GPU count chosen on the topology)`;
  const where = cluster.preset ? ` (${cluster.preset})` : "";
  return `Planned: ${name} on ${gpus}${where}, ${p.precision}, framework: ${p.framework ?? "any"}`;
}

function render(response, job) {
  lastPlans = response.plans;
  $("#results").hidden = false;
  $("#planned").textContent = plannedLine(response.planned, job);
  const proved = response.plans.length && response.solver.proved_optimal === false ? ", not proved optimal" : "";
  const hasPlans = response.plans.length > 0;
  const lines = [`Status: ${response.status}${proved}; solver ${response.solver.wall_time_s.toFixed(2)} s.`];
  if (response.explanation && hasPlans) lines.push(response.explanation);
  $("#summary").textContent = lines.join(" ");
  noPlanPanel(response);
  const warnings = response.warnings ?? [];
  $("#warnings ul").replaceChildren(...warnings.map((w) => el("li", {}, w)));
  $("#warnings").hidden = !warnings.length;
  const suggestions = response.suggestions ?? [];
  $("#suggestions").replaceChildren(...suggestions.map((s) => el("li", { "data-num-gpus": s.num_gpus, "data-tokens-per-s": s.tokens_per_s },
    suggestionButton(s.num_gpus), `: ${fmt.int(s.tokens_per_s)} tokens/s (${fmt.int(s.tokens_per_s_per_gpu)} per GPU). ${s.reason}`)));
  $("#suggestions").hidden = !suggestions.length;
  $("#plans tbody").replaceChildren(...response.plans.flatMap(planRows));
  $("#plans").closest(".table-wrap").hidden = !hasPlans;
  $(".charts").hidden = !hasPlans;
  if (!hasPlans) return ["time-chart", "memory-chart"].forEach((id) => Plotly.purge(id));
  timeChart(response.plans);
  memoryChart(response.plans[0], 0);
}

// "Try 64 GPUs": puts the count in the GPUs box and plans the form's job at it
function suggestionButton(numGpus) {
  const button = el("button", { type: "button", title: `Plan this job at ${fmt.int(numGpus)} GPUs` }, `Try ${fmt.int(numGpus)} GPUs`);
  button.addEventListener("click", () => {
    form.elements.namedItem("cluster.num_gpus").value = String(numGpus);
    form.requestSubmit();
  });
  return button;
}

// An answer without a plan: the server's reason and how far the search got, instead of an empty
// table and empty charts.
function noPlanPanel(response) {
  const panel = $("#no-plan");
  panel.hidden = response.plans.length > 0;
  if (panel.hidden) return;
  const infeasible = response.status === "infeasible";
  const reason = response.explanation ||
    (infeasible ? "The server gave no reason." : "The search stopped before it found a plan: a longer search.time_limit_s may find one.");
  const s = response.solver ?? {};
  const counts = [[s.candidates_enumerated, "layouts enumerated"], [s.candidates_fitting_memory, "fit in memory"],
    [s.candidates_to_solver, "went to the solver"]].filter(([n]) => n != null).map(([n, what]) => `${fmt.int(n)} ${what}`);
  const smallest = response.smallest_fitting_gpus;
  panel.replaceChildren(el("h3", {}, infeasible ? "No plan fits" : `No plan found (status ${response.status})`),
    el("p", { "data-field": "explanation" }, reason),
    counts.length ? el("p", { "data-field": "candidates" }, `${counts.join(", ")}.`) : "",
    smallest != null ? el("p", { "data-field": "smallest_fitting_gpus" }, `The smallest layout that fits needs ${fmt.int(smallest)} GPUs.`) : "");
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
  const detail = el("tr", { class: "detail", id: `plan-detail-${i}`, hidden: "" }, el("td", { colspan: cells.length }, planDetail(plan)));
  // a button to the keyboard and to screen readers: Enter or Space opens it, and it says whether it is open
  Object.entries({ tabindex: 0, role: "button", "aria-expanded": false, "aria-controls": detail.id })
    .forEach(([name, value]) => row.setAttribute(name, value));
  row.addEventListener("click", () => {
    detail.hidden = !detail.hidden;
    row.setAttribute("aria-expanded", String(!detail.hidden));
    memoryChart(plan, i);
  });
  row.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    event.preventDefault();  // Space would scroll the page
    row.click();
  });
  return [row, detail];
}

function planDetail(plan) {
  const breakdown = el("table", { class: "breakdown" }, el("tr", {}, el("th", {}, "step time part"), el("th", {}, "s"), el("th", {}, "share")));
  for (const part of TIME_PARTS) {
    const s = plan.time_breakdown_s[part] ?? 0;
    breakdown.append(el("tr", {}, el("td", {}, part), el("td", {}, s.toFixed(4)), el("td", {}, fmt.pct(s / plan.step_time_s))));
  }
  const notes = el("ul", { class: "notes" }, ...plan.notes.map((n) => el("li", {}, n)));
  // each framework's text under its catalog name, after the environment variables its launch
  // sets (`<name>_env`) in a box of their own: each box has its own Copy
  const launches = Object.entries(plan.launch ?? {}).filter(([, text]) => isLaunchText(text));
  const launch = launches.flatMap(([key, text]) => {
    const [framework, kind] = LAUNCH_KINDS[key] ?? [key, "launch settings"];
    const env = Object.entries(plan.launch[`${key}_env`] ?? {}).map(([k, v]) => `export ${k}=${v}`);
    return [...(env.length ? [launchBlock(`${framework} environment`, env.join("\n"))] : []),
      launchBlock(`${framework} ${kind}`, text)];
  });
  return el("div", {}, bandLine(plan), capacityLine(plan), breakdown, notes, ...launch);
}

// the plan's 80% error band (from the validation residuals) on step time and tokens/s per GPU
function bandLine(plan) {
  const parts = [["step_time_s_range", ([lo, hi]) => `step time ${lo.toFixed(3)}–${hi.toFixed(3)} s`],
    ["tokens_per_s_per_gpu_range", ([lo, hi]) => `${fmt.int(lo)}–${fmt.int(hi)} tokens/s per GPU`]]
    .filter(([field]) => plan[field]?.length === 2);
  if (!parts.length) return "";
  const spans = parts.map(([field, text]) => el("span", { "data-field": field, "data-value": JSON.stringify(plan[field]) }, text(plan[field])));
  return el("p", { class: "band", "data-testid": "band" }, "80% band of the prediction: ",
    ...spans.flatMap((span, i) => (i ? [", ", span] : [span])));
}

// Goodput, and with a token budget the time to train with what it rests on: GPU-hours, the cost
// at the price per GPU-hour used, energy and the failures expected over the run.
function capacityLine(plan) {
  const ttt = plan.time_to_train ?? {};
  const parts = [["goodput_fraction", plan.goodput?.fraction, (x) => `goodput ${fmt.pct(x)}`],
    ["checkpoint_interval_steps", plan.goodput?.checkpoint_interval_steps, (x) => `checkpoint every ${fmt.int(x)} steps`],
    ["time_to_train_days", ttt.days, (x) => `${x.toFixed(1)} days to train`],
    ["gpu_hours", ttt.gpu_hours, (x) => `${fmt.int(x)} GPU-hours`],
    ["cost_usd", ttt.cost_usd, (x) => `$${fmt.int(x)}`],
    ["price_per_gpu_hour_usd", ttt.cost_usd != null ? ttt.price_per_gpu_hour_usd : null, (x) => `at ${fmt.usd(x)} per GPU-hour`],
    ["energy_mwh", ttt.energy_mwh, (x) => `${fmt.sig(x, 3)} MWh`],
    ["expected_failures", ttt.expected_failures, (x) => `${fmt.sig(x, 2)} expected failures`]].filter(([, value]) => value != null);
  const spans = parts.map(([field, value, text]) => el("span", { "data-field": field, "data-value": value }, text(value)));
  // "at $x per GPU-hour" follows the cost it priced; the rest are a list
  return el("p", { class: "capacity", "data-testid": "capacity" },
    ...spans.flatMap((span, i) => (i === 0 ? [span] : [span.dataset.field === "price_per_gpu_hour_usd" ? " " : ", ", span])));
}

// a launch field's framework (as the Frameworks column names it) and what its text is
const LAUNCH_KINDS = {
  megatron: ["megatron-lm", "arguments"], nemo: ["megatron-bridge", "recipe overrides"],
  torchtitan: ["torchtitan", "TOML config"], deepspeed: ["deepspeed", "config JSON"],
};

function launchBlock(heading, text) {
  const copy = el("button", { type: "button", class: "copy" }, "Copy");
  copy.addEventListener("click", (event) => {
    event.stopPropagation();
    copyText(text).then(() => {
      copy.textContent = "Copied";
      copy.removeAttribute("title");
    }, (err) => {
      copy.textContent = "Copy failed";
      copy.title = `the browser refused the clipboard: ${err?.message ?? err}; select the text and copy it by hand`;
    });
  });
  return el("div", { class: "launch" }, el("h4", {}, heading, " ", copy), el("pre", {}, text));
}

async function copyText(text) {
  if (navigator.clipboard) return navigator.clipboard.writeText(text);
  const area = el("textarea", {}, text);
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("copying is not allowed here");
}

// ---- charts ----------------------------------------------------------------------------------
function timeChart(plans) {
  const x = plans.map((_, i) => `plan ${i + 1}`);
  const traces = TIME_PARTS.filter((part) => plans.some((p) => p.time_breakdown_s[part] > 0))
    .map((part) => ({ type: "bar", name: part, x, y: plans.map((p) => p.time_breakdown_s[part] ?? 0), marker: { color: CATEGORY_COLOURS[part] } }));
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
  const traces = MEMORY_PARTS.map((part) => ({ type: "bar", name: part, x, y: stages.map((st) => st[part]), marker: { color: CATEGORY_COLOURS[part] } }));
  const usable = m.capacity - (m.headroom ?? 0);
  const narrow = $("#memory-chart").clientWidth < 520;  // the title on two lines
  Plotly.react("memory-chart", traces, {
    title: { text: `Memory per pipeline stage, plan #${index + 1}${narrow ? "<br>" : " "}(GiB per GPU)` }, barmode: "stack",
    yaxis: { title: { text: "GiB" }, range: [0, 1.08 * Math.max(m.capacity, ...stages.map((st) => st.total))] },
    shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: m.capacity, y1: m.capacity, line: { color: "#c00", dash: "dash" } },
      { type: "line", xref: "paper", x0: 0, x1: 1, y0: usable, y1: usable, line: { color: "#c80", dash: "dot" } }],
    annotations: [{ xref: "paper", x: 1, y: m.capacity, text: `capacity ${fmt.gib(m.capacity)}`, showarrow: false, yanchor: "bottom", xanchor: "right" }],
    margin: { t: narrow ? 60 : 40 },
  }, PLOT_CONFIG);
}
