// One link: its charts (history from InfluxDB, then live windows pushed from Kafka), its
// decisions marked on the time axis, its alerts; a time-range picker.
"use strict";

const LINK = document.body.dataset.link;
const RANGES = [["1m", 60], ["5m", 300], ["15m", 900], ["1h", 3600], ["6h", 21600], ["24h", 86400], ["7d", 604800]];
const state = { rangeS: 900, live: true, startNs: 0, endNs: 0, charts: [], plots: {}, data: {},
                decisions: [], alerts: [], pushedDecisions: [], pushedAlerts: [], dirty: false };

function rangePicker() {
  const select = el("select", { id: "range" },
    ...RANGES.map(([label, s]) => el("option", { value: s, ...(s === state.rangeS ? { selected: "" } : {}) }, `last ${label}`)),
    el("option", { value: "custom" }, "from … to …"));
  const from = el("input", { type: "datetime-local", id: "from", hidden: "" });
  const to = el("input", { type: "datetime-local", id: "to", hidden: "" });
  const apply = el("button", { id: "apply", hidden: "" }, "show");
  select.addEventListener("change", () => {
    const custom = select.value === "custom";
    for (const node of [from, to, apply]) node.hidden = !custom;
    if (!custom) { state.rangeS = Number(select.value); state.live = true; loadHistory(); }
  });
  apply.addEventListener("click", () => {
    const start = Date.parse(from.value), end = Date.parse(to.value);
    if (!(start < end)) { document.getElementById("status").textContent = "the range's start must be before its end"; return; }
    state.live = false; state.startNs = start * 1e6; state.endNs = end * 1e6; loadHistory();
  });
  return el("div", { class: "controls" }, "range", select, from, to, apply,
    el("span", { id: "status", class: "muted" }));
}

// Decisions and alerts as vertical lines on every chart.
function markers(u) {
  const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
  const line = (ms, colour, dash) => {
    const x = u.valToPos(ms, "x", true);
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
    ctx.save(); ctx.strokeStyle = colour; ctx.setLineDash(dash); ctx.lineWidth = 1.5;
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke(); ctx.restore();
  };
  for (const d of state.decisions) line(d.time, d.outcome === "applied" ? "#2e8b57" : "#b3261e", [4, 3]);
  for (const a of state.alerts) line(a.time, a.state === "raise" ? "#b3261e" : "#999", [1, 2]);
}

// Under the cursor: the decision or alert marked nearest to it (within 1% of the range).
function markerUnder(u) {
  const info = u.root.parentNode.querySelector(".marker");
  const at = u.cursor.left == null || u.cursor.left < 0 ? null : u.posToVal(u.cursor.left, "x");
  const [low, high] = xRange();
  const nearest = (marks) => {
    if (at == null) return null;
    const best = marks.reduce((b, m) => (b && Math.abs(b.time - at) <= Math.abs(m.time - at) ? b : m), null);
    return best && Math.abs(best.time - at) <= (high - low) / 100 ? best : null;
  };
  const decision = nearest(state.decisions);
  const alert = decision ? null : nearest(state.alerts);
  if (decision) info.textContent = `decision ${fmt.time(decision.time * 1e6)}: ${decision.outcome}, ${fmt.bytes(decision.buffer_bytes)} (${decision.phase}): ${decision.reason}`;
  else if (alert) info.textContent = `alert ${fmt.time(alert.time * 1e6)}: ${alert.state} ${alertText(alert)}`;
  else info.textContent = "";
}

function makeChart(chart) {
  const unit = display[chart.unit];
  const columns = Object.keys(chart.fields);
  const box = el("div", { class: "chart", id: `chart-${chart.key}` }, el("h3", {}, `${chart.title}${unit.label ? ` (${unit.label})` : ""}`));
  document.getElementById("charts").append(box);
  const opts = {
    width: 540, height: 180, ms: 1,
    // Every chart spans the range asked for, so that their time axes line up.
    scales: { x: { time: true, range: () => xRange() } },
    series: [{}, ...columns.map((c, i) => ({
      label: c, stroke: COLOURS[i % COLOURS.length], spanGaps: true,
      ...(chart.key === "buffer" ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}),
    }))],
    axes: [{}, { size: 60 }],
    hooks: { draw: [markers], setCursor: [markerUnder] },
  };
  state.plots[chart.key] = new uPlot(opts, state.data[chart.key], box);
  window.p4bs.plots[chart.key] = state.plots[chart.key];
  box.append(el("div", { class: "marker muted" }));
}

function xRange() {
  if (!state.live) return [state.startNs / 1e6, state.endNs / 1e6];
  const end = Date.now();
  return [end - state.rangeS * 1e3, end];
}

function setHistory(history) {
  for (const chart of state.charts) {
    const unit = display[chart.unit];
    const columns = history.charts[chart.key];
    state.data[chart.key] = [columns.time, ...Object.keys(chart.fields).map((c) => columns[c].map(unit.scale))];
  }
  // What was pushed and is not in InfluxDB yet (the sink writes it a little later) stays.
  const [low, high] = xRange();
  const merged = (stored, pushed) => {
    const seen = new Set(stored.map((m) => Math.floor(m.time)));
    return [...stored, ...pushed.filter((m) => !seen.has(Math.floor(m.time)) && m.time >= low && m.time <= high)];
  };
  state.decisions = merged(history.decisions, state.pushedDecisions);
  state.alerts = merged(history.alerts, state.pushedAlerts);
  redraw();
}

function redraw() {
  for (const chart of state.charts) {
    const data = state.data[chart.key];
    state.plots[chart.key].setData(data);
    // What the page shows, for its tests: the points each chart has.
    const points = data.slice(1).reduce((n, col) => n + col.filter((v) => v != null).length, 0);
    window.p4bs.points[chart.key] = points;
    window.p4bs.charts[chart.key] = data;
    document.getElementById(`chart-${chart.key}`).dataset.points = points;
  }
  state.dirty = false;
}

async function loadHistory() {
  const status = document.getElementById("status");
  const end = state.live ? Date.now() * 1e6 : state.endNs;
  const start = state.live ? end - state.rangeS * 1e9 : state.startNs;
  status.textContent = "loading…";
  try {
    setHistory(await getJSON(`/api/links/${encodeURIComponent(LINK)}/history?start_ns=${start}&end_ns=${end}`));
    status.textContent = state.live ? "live" : `${new Date(start / 1e6).toLocaleString()} – ${new Date(end / 1e6).toLocaleString()}`;
  } catch (error) {
    status.textContent = `history: ${error.message}`;
    status.className = "error";
  }
}

function appendPoint(key, timeMs, values) {
  const data = state.data[key];
  if (!data || !state.live) return;
  data[0].push(timeMs);
  values.forEach((v, i) => data[i + 1].push(v));
  // The range slides with the live end.
  const first = timeMs - state.rangeS * 1e3;
  while (data[0].length && data[0][0] < first) for (const col of data) col.shift();
  state.dirty = true;
}

function onWindow(w) {
  for (const chart of state.charts) {
    if (chart.key === "buffer") continue;
    const unit = display[chart.unit];
    appendPoint(chart.key, w.window_end_ns / 1e6, Object.values(chart.fields).map((f) => unit.scale(w[f])));
  }
  document.getElementById("now").textContent =
    `window ${fmt.time(w.window_end_ns)}: SRTT ${fmt.ms(w.srtt_ns)}, N ${w.long_flows}, loss ${fmt.pct(w.loss_rate_ewma)}, ` +
    `queueing delay ${fmt.ms(w.queue_delay_ewma_ns)}, utilisation ${fmt.pct(w.utilisation)}, f ${fmt.num(w.f)}`;
}

function decisionRow(d) {
  return el("tr", { "data-id": d.id },
    el("td", {}, fmt.time(d.ts_ns)), el("td", {}, d.policy), el("td", {}, d.phase),
    el("td", {}, fmt.bytes(d.buffer_bytes)), el("td", {}, d.trial ?? "–"),
    el("td", { class: `outcome-${d.outcome}` }, d.outcome), el("td", { class: "reason" }, d.reason));
}

function onDecision(d) {
  document.getElementById("decisions").prepend(decisionRow(d));
  // When its row was on the page, against when the optimizer made it: the tests' measure of
  // "live" (noted once the row is there, so that a decision noted is one an operator sees).
  window.p4bs.decisions.push({ id: d.id, ts_ns: d.ts_ns, received_ms: Date.now() });
  state.pushedDecisions.push({ ...d, time: d.ts_ns / 1e6 });
  state.decisions.push({ ...d, time: d.ts_ns / 1e6 });
  if (d.outcome === "applied" && d.queue === 0) appendPoint("buffer", d.ts_ns / 1e6, [display.bytes.scale(d.buffer_bytes)]);
  state.dirty = true;
}

function onAlert(a) {
  state.pushedAlerts.push({ ...a, time: a.ts_ns / 1e6 });
  state.alerts.push({ ...a, time: a.ts_ns / 1e6 });
  const list = document.getElementById("alerts");
  list.prepend(el("li", {}, `${fmt.time(a.ts_ns)} ${a.state}: ${alertText(a)}`));
  state.dirty = true;
}

function summary(link) {
  const r = link.row;
  return `${fmt.rate(r.capacity_bps)} · SLA ${r.sla} · buffer ${fmt.bytes(r.buffer_bytes)} (${fmt.ms(r.buffer_ns)}) · ` +
    `policy ${r.policy}${r.phase ? ` (${r.phase})` : ""} · d̂ ${fmt.ms(link.config.max_queue_delay_ns)}, p̂ ${fmt.pct(link.config.max_loss)}`;
}

async function main() {
  const link = await getJSON(`/api/links/${encodeURIComponent(LINK)}`);
  state.charts = link.charts;
  const searchLink = link.row.policy === "p4bs" ? el("a", { href: `/search/${encodeURIComponent(LINK)}` }, "its search") : "";
  document.getElementById("main").append(
    el("h1", {}, LINK), el("p", { id: "summary" }, summary(link), " ", searchLink),
    el("p", { id: "now", class: "muted" }, "no window yet"), rangePicker(),
    el("div", { class: "charts", id: "charts" }),
    el("h2", {}, "SLA alerts: open ones, then as they come"), el("ul", { class: "alerts", id: "alerts" },
      ...link.open_alerts.map((a) => el("li", {}, `${fmt.time(a.ts_ns)} raise: ${alertText(a)}`))),
    el("h2", {}, "Decisions"),
    el("table", {}, el("thead", {}, el("tr", {}, ...["time", "policy", "phase", "buffer", "trial", "outcome", "reason"].map((h) => el("th", {}, h)))),
      el("tbody", { id: "decisions" }, ...link.decisions.map(decisionRow))));
  showFeed(link.feed);
  for (const chart of state.charts) {
    state.data[chart.key] = [[], ...Object.keys(chart.fields).map(() => [])];
    makeChart(chart);
  }
  await loadHistory();
  const events = new EventSource(`/api/events?link=${encodeURIComponent(LINK)}`);
  const refresh = () => getJSON(`/api/links/${encodeURIComponent(LINK)}`).then(
    (l) => { document.getElementById("summary").firstChild.textContent = summary(l); }, () => {});
  const handlers = { link_metrics: onWindow, buffer_decisions: onDecision, sla_alerts: onAlert,
                     optimizer_state: refresh };
  for (const [kind, handle] of Object.entries(handlers)) {
    events.addEventListener(kind, (e) => { window.p4bs.events += 1; handle(JSON.parse(e.data)); });
  }
  // The browser reconnects by itself (the stream's retry); what came meanwhile is missed.
  events.onopen = () => { window.p4bs.streaming = true; };
  events.onerror = () => { window.p4bs.streaming = false; document.getElementById("now").textContent = "event stream lost: reconnecting…"; };
  // Charts redrawn at most twice a second, however fast windows come.
  setInterval(() => { if (state.dirty) redraw(); }, 500);
  // The feed's health line every 5 s; a refresh that fails is tried again by the next.
  setInterval(() => getJSON(`/api/links/${encodeURIComponent(LINK)}`).then((l) => showFeed(l.feed), () => {}), 5000);
}

main().catch((error) => document.getElementById("main").append(el("p", { class: "error" }, String(error))));
