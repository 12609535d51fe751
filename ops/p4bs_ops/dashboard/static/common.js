// Shared by the pages: fetching JSON, units for display, the feed's health line, charts.
"use strict";

// What the pages show, for their tests (and a curious operator's console).
window.p4bs = { charts: {}, plots: {}, points: {}, decisions: [], events: 0 };

async function getJSON(url) {
  const reply = await fetch(url, { cache: "no-store" });
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || `${url}: HTTP ${reply.status}`);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  }
  return node;
}

// Inside, time is ns, sizes bytes, rates bit/s: converted here for display only.
const fmt = {
  ms: (ns) => (ns == null ? "–" : `${(ns / 1e6).toFixed(1)} ms`),
  bytes: (b) => (b == null ? "–" : b >= 1e6 ? `${(b / 1e6).toFixed(2)} MB` : `${(b / 1e3).toFixed(1)} kB`),
  pct: (x) => (x == null ? "–" : `${(100 * x).toFixed(2)} %`),
  num: (x, digits = 3) => (x == null ? "–" : Number(x).toPrecision(digits)),
  rate: (bps) => (bps == null ? "–" : `${(bps / 1e6).toFixed(0)} Mbit/s`),
  time: (ns) => (ns == null ? "–" : new Date(ns / 1e6).toLocaleTimeString()),
  ago: (ns, nowNs) => (ns == null ? "–" : `${((nowNs - ns) / 1e9).toFixed(1)} s ago`),
};

// A value in the system's unit -> the chart's display unit.
const display = {
  ns: { scale: (v) => (v == null ? null : v / 1e6), label: "ms" },
  bytes: { scale: (v) => (v == null ? null : v / 1e3), label: "kB" },
  ratio: { scale: (v) => (v == null ? null : 100 * v), label: "%" },
  count: { scale: (v) => v, label: "" },
};

// An SLA alert's value against its bound: queue_delay in ns, loss a fraction.
function alertText(a) {
  const value = a.kind === "queue_delay" ? fmt.ms : fmt.pct;
  return `${a.kind} ${value(a.value)} > ${value(a.bound)}`;
}

function showFeed(feed) {
  const parts = [];
  if (feed.kafka_error) parts.push(`Kafka: ${feed.kafka_error}`);
  if (!feed.caught_up) parts.push("reading Kafka…");
  parts.push(`malformed records: ${feed.malformed}`);
  const node = document.getElementById("feed");
  node.textContent = parts.join(" · ");
  node.title = feed.malformed_reasons.join("\n");
  node.className = feed.kafka_error || feed.malformed ? "error" : "";
  // Malformed records are never fatal: counted, and the newest reasons listed.
  let details = document.getElementById("malformed");
  if (feed.malformed && !details) {
    details = el("details", { id: "malformed", class: "error" }, el("summary"), el("ul"));
    document.getElementById("main").prepend(details);
  }
  if (details) {
    details.firstChild.textContent = `${feed.malformed} malformed records passed over (newest reasons)`;
    details.lastChild.replaceChildren(...feed.malformed_reasons.map((r) => el("li", {}, r)));
  }
}

const COLOURS = ["#1a5fa8", "#d9730d", "#2e8b57", "#8e44ad"];
