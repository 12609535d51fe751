// A P4BS link's Bayesian search (P4BS Fig. 7, live): the observations, the GP's posterior
// mean with a band of two standard deviations, the Expected Improvement over the buffer
// range and the next trial; fitted again whenever the link's optimizer state changes.
"use strict";

const LINK = document.body.dataset.link;
let plot = null;

function describe(s) {
  const parts = [`phase ${s.phase}`];
  if (s.high_bytes > s.low_bytes) parts.push(`range ${fmt.bytes(s.low_bytes)} – ${fmt.bytes(s.high_bytes)}`);
  parts.push(`${s.observations.length} observations in the GP, ${s.bound_points.length} from the bound search`);
  if (s.max_ei != null) parts.push(`max EI ${fmt.num(s.max_ei)}`);
  if (s.measuring) parts.push(`measuring ${fmt.bytes(s.measuring.buffer_bytes)}${s.measuring.trial ? ` (trial ${s.measuring.trial})` : ""}`);
  if (s.suggestion_bytes != null) parts.push(`next trial (EI's maximum) ${fmt.bytes(s.suggestion_bytes)}`);
  if (s.incumbent) parts.push(`best ${fmt.bytes(s.incumbent.buffer_bytes)} (f ${fmt.num(s.incumbent.mean)})`);
  return parts.join(" · ");
}

// One x axis for curves and points: the grid and every observed buffer, kB.
function columns(s) {
  const xs = [...new Set([...s.grid, ...s.observations.map((o) => o.buffer_bytes), ...s.bound_points.map((o) => o.buffer_bytes)])].sort((a, b) => a - b);
  const at = (pairs) => { const m = new Map(pairs); return xs.map((x) => (m.has(x) ? m.get(x) : null)); };
  const grid = (values) => at(s.grid.map((x, i) => [x, values[i]]));
  return [
    xs.map((x) => x / 1e3),
    grid(s.mean),
    grid(s.mean.map((m, i) => m - 2 * s.std[i])),
    grid(s.mean.map((m, i) => m + 2 * s.std[i])),
    grid(s.ei),
    at(s.bound_points.map((o) => [o.buffer_bytes, o.mean])),
    at(s.observations.map((o) => [o.buffer_bytes, o.mean])),
  ];
}

function draw(s) {
  const data = columns(s);
  window.p4bs.search = { observations: s.observations.length, bound_points: s.bound_points.length,
                         grid: s.grid.length, suggestion_bytes: s.suggestion_bytes, phase: s.phase };
  document.getElementById("search-chart").dataset.points = s.grid.length;
  const next = (u) => {
    const marks = [[s.suggestion_bytes, "#8e44ad"], [s.measuring && s.measuring.buffer_bytes, "#d9730d"]];
    for (const [bytes, colour] of marks) {
      if (bytes == null) continue;
      const x = u.valToPos(bytes / 1e3, "x", true);
      u.ctx.save(); u.ctx.strokeStyle = colour; u.ctx.setLineDash([5, 4]);
      u.ctx.beginPath(); u.ctx.moveTo(x, u.bbox.top); u.ctx.lineTo(x, u.bbox.top + u.bbox.height); u.ctx.stroke(); u.ctx.restore();
    }
  };
  const points = (colour) => ({ stroke: colour, paths: () => null, points: { show: true, size: 9, stroke: colour, fill: colour } });
  const opts = {
    width: 900, height: 420,
    scales: { x: { time: false }, ei: { auto: true } },
    series: [
      { label: "buffer (kB)" },
      { label: "posterior mean of f", stroke: "#1a5fa8", spanGaps: true, points: { show: false } },
      { label: "mean − 2σ", stroke: "#9cc3e6", spanGaps: true, points: { show: false } },
      { label: "mean + 2σ", stroke: "#9cc3e6", spanGaps: true, points: { show: false } },
      { label: "EI", scale: "ei", stroke: "#2e8b57", spanGaps: true, points: { show: false } },
      { label: "bound search (f)", ...points("#777") },
      // Drawn last, over the bound search's points it may share (with warm_start).
      { label: "observations in the GP (f)", ...points("#d62728") },
    ],
    bands: [{ series: [3, 2], fill: "rgba(26,95,168,0.12)" }],
    axes: [{ label: "buffer (kB)" }, { label: "f", size: 60 }, { side: 1, scale: "ei", label: "EI", size: 60 }],
    hooks: { draw: [next] },
  };
  const box = document.getElementById("search-chart");
  if (plot) plot.destroy();
  plot = new uPlot(opts, data, box);
}

async function load() {
  const status = document.getElementById("status");
  try {
    const s = await getJSON(`/api/links/${encodeURIComponent(LINK)}/search`);
    status.textContent = describe(s);
    status.className = "";
    draw(s);
  } catch (error) {
    status.textContent = error.message;
    status.className = "error";
  }
}

document.getElementById("main").append(
  el("h1", {}, `Bayesian search · `, el("a", { href: `/link/${encodeURIComponent(LINK)}` }, LINK)),
  el("p", { id: "status" }, "fitting…"), el("div", { class: "chart", id: "search-chart" }),
  el("p", { class: "muted" }, "Blue: the GP's posterior mean of f with ±2σ; green: Expected Improvement (right axis); " +
     "red: the observations the GP is fitted to; grey: the bound search's; dashed purple: the next trial, orange: the buffer measured now."));
let pending = null;
load();
const events = new EventSource(`/api/events?link=${encodeURIComponent(LINK)}`);
// A new optimizer state may hold a new observation: fitted again, at most once a second.
events.addEventListener("optimizer_state", () => { if (!pending) pending = setTimeout(() => { pending = null; load(); }, 1000); });
